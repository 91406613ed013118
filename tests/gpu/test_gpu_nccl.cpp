// NCCL on the GPU, a group of one rank (the most a one-GPU machine allows): the machine's own
// library loaded at run time (io/net/nccl.hpp), a communicator joined, and the asynchronous
// collectives over it (io/net/nccl_collectives.hpp) on a CUDA stream with device buffers: an
// allreduce and an allgather enqueued together, one wait on cudaStreamQuery, the results
// read back. Without NCCL on the machine the case says so and checks nothing more.
#include "gpu_test_util.hpp"

#include "io/net/nccl.hpp"
#include "io/net/nccl_collectives.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

namespace dsa::test {

TEST_CASE("nccl on the GPU: a group of one rank, an allreduce and an allgather through the collectives") {
  auto lib = net::nccl::load_library();
  if (!lib) {
    MESSAGE("no NCCL on this machine: " << lib.err().message);
    return;
  }
  MESSAGE("NCCL " << (*lib)->version << " from " << (*lib)->path);
  // The id exchange of a group of one: its own blob back.
  net::nccl::id_exchange alone = [](const std::string&, std::vector<std::byte> blob)
      -> expected<std::vector<std::vector<std::byte>>> { return std::vector<std::vector<std::byte>>{std::move(blob)}; };
  auto comm = net::nccl::communicator::join(*lib, alone, "gpu-test", 0, 1);
  REQUIRE_MESSAGE(comm.has_value(), (comm ? "" : comm.err().to_string()));
  test_stream stream;
  cudaStream_t s = stream.get();
  net::nccl_collectives group(std::move(*comm), s, [s] { return cudaStreamQuery(s) == cudaSuccess; });
  const std::vector<float> values{1.5f, -2.0f, 3.25f};
  const std::vector<std::int64_t> ids{7, 11};
  void* reduce = nullptr;
  void* gather_in = nullptr;
  void* gather_out = nullptr;
  REQUIRE(cudaMalloc(&reduce, values.size() * 4) == cudaSuccess);
  REQUIRE(cudaMalloc(&gather_in, ids.size() * 8) == cudaSuccess);
  REQUIRE(cudaMalloc(&gather_out, ids.size() * 8) == cudaSuccess);
  REQUIRE(cudaMemcpy(reduce, values.data(), values.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(gather_in, ids.data(), ids.size() * 8, cudaMemcpyHostToDevice) == cudaSuccess);
  auto t1 = group.all_reduce_sum(reduce, dtype::f32, static_cast<std::int64_t>(values.size()));
  auto t2 = group.all_gather(gather_out, gather_in, dtype::i64, static_cast<std::int64_t>(ids.size()));
  REQUIRE_MESSAGE(t1.has_value(), (t1 ? "" : t1.err().to_string()));
  REQUIRE_MESSAGE(t2.has_value(), (t2 ? "" : t2.err().to_string()));
  const status waited = group.wait(*t2);
  REQUIRE_MESSAGE(waited.has_value(), (waited ? "" : waited.err().to_string()));
  std::vector<float> reduced(values.size());
  std::vector<std::int64_t> gathered(ids.size());
  REQUIRE(cudaMemcpy(reduced.data(), reduce, reduced.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(gathered.data(), gather_out, gathered.size() * 8, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(reduced == values); // one rank: its own sum
  CHECK(gathered == ids);
  cudaFree(reduce);
  cudaFree(gather_in);
  cudaFree(gather_out);
}

} // namespace dsa::test
