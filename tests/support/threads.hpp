// The process's threads as /proc lists them, for tests of who owns which threads.
#pragma once

#include <sys/types.h>

namespace dsa::test {

// The calling thread's id (gettid).
pid_t thread_id();

// Whether thread `tid` of this process is still listed in /proc/self/task.
bool thread_listed(pid_t tid);

// Runs a parallel region of two threads on the calling thread and returns the id of its
// second thread (0 when the runtime gave fewer threads: OMP_THREAD_LIMIT, OMP_DYNAMIC).
pid_t openmp_team_thread();

// Waits until thread `tid` is no longer listed, or 10 s have passed (a joined thread is
// removed from the list a moment after its join returns); false on the deadline.
bool thread_gone(pid_t tid);

} // namespace dsa::test
