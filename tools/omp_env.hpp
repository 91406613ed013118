// OpenMP environment of the dsactor process, fixed before libgomp reads it.
#pragma once

namespace dsa::tools {

// Makes idle OpenMP threads sleep instead of spin: when OMP_WAIT_POLICY is unset, sets it to
// "passive" and re-executes this program (/proc/self/exe, same argv), so the new image's
// libgomp reads it at load. Returns when the variable was already set (by the user, or by
// the re-exec itself, which is what stops a loop) or when the re-exec failed (a warning
// on stderr, then the run goes on with libgomp's default). Call first in main: nothing done
// before it survives the exec (threads that libraries started at load are ended by it).
void ensure_passive_omp_wait(char** argv);

} // namespace dsa::tools
