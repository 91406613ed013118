// Gloo's peer measurement for `dsactor bench allreduce`: two forked processes meet
// through a FileStore in a fresh temporary directory and connect Gloo's TCP device on
// 127.0.0.1, then time gloo::AllreduceRing and gloo::AllreduceHalvingDoubling (fp32).
// Built only when Meson finds libgloo.
#include "tools/bench/bench_allreduce.hpp"

#include "io/net/fork_ranks.hpp"

#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>

namespace dsa::tools {
namespace {

enum class gloo_algorithm { ring, halving_doubling };

net::bytes pack(const std::vector<double>& v) {
  net::bytes b(v.size() * sizeof(double));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

expected<std::vector<double>> run(int ranks, const allreduce_plan& plan, gloo_algorithm algorithm) {
  char dir_template[] = "/tmp/dsactor-gloo-XXXXXX";
  if (!::mkdtemp(dir_template))
    return make_error(errc::io, "Gloo: cannot create a temporary directory under /tmp");
  const std::string dir = dir_template;
  const char* name = algorithm == gloo_algorithm::ring ? "Gloo ring" : "Gloo halving-doubling";
  auto results = net::run_forked_ranks(
      ranks, [&](int rank, const net::exchange_fn&) -> expected<net::bytes> {
        try {
          gloo::transport::tcp::attr attr("127.0.0.1");
          auto device = gloo::transport::tcp::CreateDevice(attr);
          gloo::rendezvous::FileStore store(dir);
          auto context = std::make_shared<gloo::rendezvous::Context>(rank, ranks);
          context->connectFullMesh(store, device);
          auto times = time_allreduce(
              rank, ranks, plan,
              [&](float* data, std::int64_t count) -> status {
                // Gloo's algorithms bind their buffer at construction; building one
                // per call is what a caller with changing buffers pays too.
                if (algorithm == gloo_algorithm::ring)
                  gloo::AllreduceRing<float>(context, {data}, static_cast<int>(count)).run();
                else
                  gloo::AllreduceHalvingDoubling<float>(context, {data}, static_cast<int>(count)).run();
                return {};
              },
              [&]() -> status {
                gloo::BarrierAllToAll(context).run();
                return {};
              },
              [&](std::int64_t bytes, double s) {
                std::printf("  ... %-24s %5lld MiB  %8.2f ms  busbw %6.2f GB/s\n", name,
                            static_cast<long long>(bytes >> 20), s * 1e3,
                            static_cast<double>(bytes) / s * 2.0 * (ranks - 1) / ranks / 1e9);
                std::fflush(stdout);
              });
          DSA_TRY(times);
          return pack(*times);
        } catch (const std::exception& e) {
          return make_error(errc::runtime, "{} rank {}: {}", name, rank, e.what());
        }
      });
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!results[0].finished || !results[0].ok)
    return make_error(errc::runtime, "{}: rank 0: {}", name, results[0].error);
  std::vector<double> v(results[0].output.size() / sizeof(double));
  std::memcpy(v.data(), results[0].output.data(), v.size() * sizeof(double));
  return v;
}

} // namespace

gloo_result bench_gloo(int ranks, const allreduce_plan& plan) {
  gloo_result r;
  r.ring = run(ranks, plan, gloo_algorithm::ring);
  r.halving_doubling = run(ranks, plan, gloo_algorithm::halving_doubling);
  return r;
}

} // namespace dsa::tools
