// dsactor-mpi-allreduce: OpenMPI's peer measurement for `dsactor bench allreduce`, run
// by mpirun. Usage: dsactor-mpi-allreduce WARMUP ITERATIONS BYTES...
// For each size: fill (rank r: element i is (i % 13) + r), one MPI_Allreduce checked
// element by element against the exact sum, then WARMUP + ITERATIONS timed calls, each
// after MPI_Barrier. Rank 0 prints "result BYTES MEDIAN_SECONDS" per size.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc < 4) {
    if (rank == 0)
      std::fprintf(stderr, "usage: dsactor-mpi-allreduce WARMUP ITERATIONS BYTES...\n");
    MPI_Finalize();
    return 2;
  }
  const int warmup = std::atoi(argv[1]), iterations = std::atoi(argv[2]);
  int status = 0;
  for (int a = 3; a < argc && status == 0; ++a) {
    const long long bytes = std::atoll(argv[a]);
    const long long count = bytes / 4;
    std::vector<float> data(static_cast<std::size_t>(count));
    for (long long i = 0; i < count; ++i)
      data[static_cast<std::size_t>(i)] = static_cast<float>(i % 13 + rank);
    MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    for (long long i = 0; i < count; ++i)
      if (data[static_cast<std::size_t>(i)] != static_cast<float>(n * (i % 13) + n * (n - 1) / 2)) {
        std::fprintf(stderr, "rank %d: MPI_Allreduce of %lld floats: element %lld is wrong\n",
                     rank, count, i);
        status = 1;
        break;
      }
    std::vector<double> times;
    for (int it = 0; it < warmup + iterations && status == 0; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      if (it >= warmup)
        times.push_back(MPI_Wtime() - t0);
    }
    if (rank == 0 && status == 0) {
      std::sort(times.begin(), times.end());
      std::printf("result %lld %.9f\n", bytes, times[times.size() / 2]);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return status;
}
