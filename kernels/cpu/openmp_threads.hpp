// The OpenMP threads a calling thread owns.
//
// libgomp gives every thread that starts a parallel region its own pool of team threads,
// kept until that thread exits. While the pools' threads outnumber the cores, libgomp
// throttles how long every idle team thread spins before it sleeps (to nothing under
// OMP_WAIT_POLICY=passive), so each region then pays a sleep and a wake-up. A thread that
// starts regions only now and then (the main thread's set-up, an optimizer's update) should
// end its pool when it goes idle, leaving the stage's compute thread the only pool.
#pragma once

namespace dsa::cpu {

// Ends the calling thread's OpenMP thread pool (libgomp's omp_pause_resource_all with
// omp_pause_hard, which acts on the calling thread's pool only and joins its threads); the
// thread's next parallel region starts a new one. Inside a parallel region, or when the
// process's OpenMP runtime is not libgomp (another's pause may end the whole runtime under
// other threads' regions), it does nothing and returns false. Other threads' pools and
// regions are untouched (tested while another thread is inside a region).
bool release_openmp_threads();

} // namespace dsa::cpu
