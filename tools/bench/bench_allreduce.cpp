// dsactor bench allreduce: the command, the memcpy bound, dsactor's allreduce over UCX
// and OpenMPI (through mpirun and tools/bench/mpi_allreduce_bench.cpp); Gloo lives in
// bench_allreduce_gloo.cpp.
#include "tools/bench/bench_allreduce.hpp"
#include "tools/bench/bench_util.hpp"

#include "io/net/communicator.hpp"
#include "io/net/fork_ranks.hpp"
#include "io/net/ucx_transport.hpp"
#include "tools/bench/bench_scaling.hpp"
#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>
#include <unistd.h>

namespace dsa::tools {
namespace {

constexpr int ranks = 2;
constexpr std::int64_t mib = 1 << 20;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// busbw as nccl-tests defines it for allreduce: algbw * 2 (n-1) / n, in GB/s.
double busbw_gbps(std::int64_t bytes, double seconds) {
  return static_cast<double>(bytes) / seconds * 2.0 * (ranks - 1) / ranks / 1e9;
}

std::string size_name(std::int64_t bytes) {
  return bytes % mib == 0 ? fmt::format("{} MiB", bytes / mib) : fmt::format("{} B", bytes);
}

void progress_line(const std::string& who, std::int64_t bytes, double seconds) {
  fmt::print("  ... {:<24} {:>8}  {:8.2f} ms  busbw {:6.2f} GB/s\n", who, size_name(bytes),
             seconds * 1e3, busbw_gbps(bytes, seconds));
  std::fflush(stdout);
}

net::bytes pack(const std::vector<double>& v) {
  net::bytes b(v.size() * sizeof(double));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<double> unpack(const net::bytes& b) {
  std::vector<double> v(b.size() / sizeof(double));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(double));
  return v;
}

// memcpy of each size between two buffers touched beforehand: the bound.
std::vector<double> bench_copy(const allreduce_plan& plan) {
  const std::int64_t largest = *std::max_element(plan.sizes_bytes.begin(), plan.sizes_bytes.end());
  std::vector<char> src(static_cast<std::size_t>(largest), 1), dst(static_cast<std::size_t>(largest), 2);
  std::vector<double> out;
  for (std::int64_t bytes : plan.sizes_bytes) {
    std::vector<double> times;
    for (int i = 0; i < plan.warmup + plan.iterations; ++i) {
      const double t0 = now_s();
      std::memcpy(dst.data(), src.data(), static_cast<std::size_t>(bytes));
      const double t = now_s() - t0;
      if (i >= plan.warmup)
        times.push_back(t);
    }
    out.push_back(median(times));
    fmt::print("  ... {:<24} {:>8}  {:8.2f} ms  {:6.2f} GB/s\n", "memcpy", size_name(bytes),
               out.back() * 1e3, static_cast<double>(bytes) / out.back() / 1e9);
    std::fflush(stdout);
  }
  return out;
}

expected<std::vector<double>> bench_dsactor(const allreduce_plan& plan) {
  std::uint64_t token = std::random_device{}();
  token = token << 32 | static_cast<std::uint64_t>(::getpid());
  auto results = net::run_forked_ranks(
      ranks, [&](int rank, const net::exchange_fn& exchange) -> expected<net::bytes> {
        DSA_ASSIGN_OR_RETURN(auto t, net::ucx_transport::create(rank, ranks, token));
        DSA_ASSIGN_OR_RETURN(auto addresses, exchange(t->local_address()));
        DSA_TRY(t->connect(addresses));
        net::collective_options options;
        options.shared_memory = plan.shared_memory;
        net::communicator comm(*t, options);
        auto times = time_allreduce(
            rank, ranks, plan,
            [&](float* data, std::int64_t count) { return comm.allreduce_sum(data, dtype::f32, count); },
            [&] { return comm.barrier(); },
            [&](std::int64_t bytes, double s) { progress_line("dsactor (UCX)", bytes, s); });
        (void)exchange(net::bytes{}); // both ranks are done before either closes
        DSA_TRY(times);
        return pack(*times);
      });
  if (!results[0].finished || !results[0].ok)
    return make_error(errc::runtime, "dsactor allreduce: rank 0: {}", results[0].error);
  return unpack(results[0].output);
}

// Where the MPI helper would be: next to this executable.
std::filesystem::path mpi_helper_path() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return self.parent_path() / "dsactor-mpi-allreduce";
}

expected<std::vector<double>> bench_mpi(const allreduce_plan& plan, const std::string& mpirun) {
  const auto helper = mpi_helper_path();
  if (!std::filesystem::exists(helper))
    return make_error(errc::unsupported,
                      "{} is missing: Meson found no MPI (install libopenmpi-dev and openmpi-bin, "
                      "then reconfigure)", helper.string());
  std::string cmd = fmt::format("{} -np {} --oversubscribe --allow-run-as-root {} {} {}", mpirun,
                                ranks, helper.string(), plan.warmup, plan.iterations);
  for (auto s : plan.sizes_bytes)
    cmd += fmt::format(" {}", s);
  cmd += " 2>&1";
  std::fflush(stdout);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe)
    return make_error(errc::io, "cannot run '{}'", cmd);
  std::vector<double> out;
  std::string rest;
  char line[4096];
  while (std::fgets(line, sizeof line, pipe)) {
    long long bytes = 0;
    double seconds = 0;
    if (std::sscanf(line, "result %lld %lf", &bytes, &seconds) == 2) {
      out.push_back(seconds);
      progress_line("OpenMPI MPI_Allreduce", bytes, seconds);
    } else {
      rest += line;
    }
  }
  const int rc = ::pclose(pipe);
  if (rc != 0 || out.size() != plan.sizes_bytes.size())
    return make_error(errc::runtime, "'{}' failed (status {}): {}", cmd, rc, rest);
  return out;
}

std::string ratio_text(double a, double b) {
  return fmt::format("{:.2f}x", a / b);
}

} // namespace

expected<std::vector<double>> time_allreduce(int rank, int n, const allreduce_plan& plan,
                                             const allreduce_call& allreduce,
                                             const barrier_call& barrier,
                                             const std::function<void(std::int64_t, double)>& progress) {
  std::vector<double> medians;
  for (std::int64_t bytes : plan.sizes_bytes) {
    const std::int64_t count = bytes / 4;
    std::vector<float> data(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i)
      data[static_cast<std::size_t>(i)] = static_cast<float>(i % 13 + rank);
    DSA_TRY(allreduce(data.data(), count));
    for (std::int64_t i = 0; i < count; ++i) {
      const float want = static_cast<float>(n * (i % 13) + n * (n - 1) / 2);
      if (data[static_cast<std::size_t>(i)] != want)
        return make_error(errc::runtime, "rank {}: allreduce of {} floats: element {} is {}, not {}",
                          rank, count, i, data[static_cast<std::size_t>(i)], want);
    }
    std::vector<double> times;
    for (int it = 0; it < plan.warmup + plan.iterations; ++it) {
      DSA_TRY(barrier());
      const double t0 = now_s();
      DSA_TRY(allreduce(data.data(), count));
      const double t = now_s() - t0;
      if (it >= plan.warmup)
        times.push_back(t);
    }
    medians.push_back(median(times));
    if (rank == 0 && progress)
      progress(bytes, medians.back());
  }
  return medians;
}

int bench_allreduce_main(int argc, char** argv) {
  namespace po = boost::program_options;
  po::options_description opts("dsactor bench allreduce [options]");
  std::vector<int> sizes_mib;
  allreduce_plan plan;
  std::string mpirun;
  bool weak = true;
  opts.add_options()("help,h", "this help")(
      "sizes-mib", po::value<std::vector<int>>(&sizes_mib)->multitoken(),
      "buffer sizes in MiB (default 1 4 16 64 256)")(
      "iterations", po::value<int>(&plan.iterations)->default_value(7), "timed iterations per size (median)")(
      "warmup", po::value<int>(&plan.warmup)->default_value(2), "untimed iterations per size first")(
      "mpirun", po::value<std::string>(&mpirun)->default_value("mpirun"), "OpenMPI's launcher")(
      "shared-memory", po::value<bool>(&plan.shared_memory)->default_value(true),
      "dsactor's allreduce through shared memory between the processes (false: its ring "
      "over UCX, as before)")(
      "quick", "1 and 4 MiB, 3 iterations, no weak-scaling runs (a smoke run)")(
      "weak-scaling", po::value<bool>(&weak)->default_value(true, "true (false with --quick)"),
      "also time BERT-mini's step with 1 and 2 processes at the same per-rank batch");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "bench allreduce")) return *done;
  if (vm.count("quick")) {
    if (vm["weak-scaling"].defaulted()) weak = false;
    sizes_mib = {1, 4};
    plan.iterations = 3;
    plan.warmup = 1;
  }
  if (sizes_mib.empty())
    sizes_mib = {1, 4, 16, 64, 256};
  if (plan.iterations < 1 || plan.warmup < 0) {
    fmt::print(stderr, "dsactor bench allreduce: --iterations must be >= 1 and --warmup >= 0\n");
    return 2;
  }
  for (int m : sizes_mib) {
    if (m < 1) {
      fmt::print(stderr, "dsactor bench allreduce: --sizes-mib {} is not a positive size\n", m);
      return 2;
    }
    plan.sizes_bytes.push_back(static_cast<std::int64_t>(m) * mib);
  }
  fmt::print("allreduce, fp32, {} processes on this machine, sizes {} MiB; median of {} after {} "
             "warm-up\n", ranks, fmt::join(sizes_mib, " "), plan.iterations, plan.warmup);
  // The forks come first: this process has not touched UCX or started threads yet.
  fmt::print("dsactor: communicator over ucx_transport, {}\n",
             plan.shared_memory ? "shared-memory allreduce" : "ring over UCX");
  auto ours = bench_dsactor(plan);
  if (!ours) {
    fmt::print(stderr, "dsactor bench allreduce: {}\n", ours.err().to_string());
    return 1;
  }
  fmt::print("Gloo: ring and halving-doubling allreduce, TCP device on 127.0.0.1\n");
  gloo_result gloo = bench_gloo(ranks, plan);
  fmt::print("OpenMPI: MPI_Allreduce through {}\n", mpirun);
  auto mpi = bench_mpi(plan, mpirun);
  fmt::print("memcpy (the bound)\n");
  std::vector<double> copy = bench_copy(plan);
  for (const auto* peer : {&gloo.ring, &gloo.halving_doubling, &mpi})
    if (!*peer)
      fmt::print("  peer missing: {}\n", peer->err().message);

  auto cell = [](const expected<std::vector<double>>& r, std::size_t i, std::int64_t bytes) {
    return r ? fmt::format("{:9.2f}", busbw_gbps(bytes, (*r)[i])) : fmt::format("{:>9}", "-");
  };
  fmt::print("\nbusbw per peer, GB/s (algbw x 2(n-1)/n, n = {}); memcpy GB/s\n", ranks);
  fmt::print("{:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10}\n", "size", "dsactor",
             "gloo-ring", "gloo-hd", "mpi", "memcpy", "vs gloo", "vs mpi", "vs copy");
  std::optional<std::size_t> at64;
  for (std::size_t i = 0; i < plan.sizes_bytes.size(); ++i) {
    const std::int64_t b = plan.sizes_bytes[i];
    if (b == 64 * mib)
      at64 = i;
    const double ours_bw = busbw_gbps(b, (*ours)[i]);
    const double copy_bw = static_cast<double>(b) / copy[i] / 1e9;
    double gloo_best = 0;
    for (const auto* g : {&gloo.ring, &gloo.halving_doubling})
      if (*g)
        gloo_best = std::max(gloo_best, busbw_gbps(b, (**g)[i]));
    fmt::print("{:>8} {:>9.2f} {} {} {} {:9.2f} {:>10} {:>10} {:>10}\n", size_name(b), ours_bw,
               cell(gloo.ring, i, b), cell(gloo.halving_doubling, i, b), cell(mpi, i, b), copy_bw,
               gloo_best > 0 ? ratio_text(ours_bw, gloo_best) : "-",
               mpi ? ratio_text(ours_bw, busbw_gbps(b, (*mpi)[i])) : "-",
               fmt::format("{:.0f}%", 100 * ours_bw / copy_bw));
  }
  // Weak scaling: what the collectives buy a real training step.
  std::optional<scaling_result> scaling;
  if (weak) {
    char pattern[] = "/tmp/dsactor_bench_scaling.XXXXXX";
    if (::mkdtemp(pattern) == nullptr) {
      fmt::print(stderr, "dsactor bench allreduce: cannot make a scratch folder: {}\n", std::strerror(errno));
      return 1;
    }
    scaling_plan sp;
    sp.work_dir = pattern;
    fmt::print("\nweak scaling: BERT-mini, {} sequences of {} tokens per rank and step, {} steps ({} untimed), "
               "1 process then 2 (dsactor launch); logs in {}\n",
               sp.micro_batch * sp.accumulation, sp.seq, sp.steps, sp.warmup, sp.work_dir);
    auto w = bench_weak_scaling(sp);
    if (!w) {
      fmt::print(stderr, "dsactor bench allreduce: weak scaling: {}\n", w.err().message);
      return 1;
    }
    scaling = *w;
    std::error_code ec;
    std::filesystem::remove_all(sp.work_dir, ec);
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    fmt::print("  step with 1 process {:.3f} s, with 2 processes {:.3f} s (twice the samples): weak-scaling "
               "efficiency {:.2f} (1 = perfect; on {} core(s) the two ranks share what the single process used "
               "alone, so compute alone bounds it at about {:.2f})\n",
               scaling->dp1_step_s, scaling->dp2_step_s, scaling->efficiency(), cores, cores >= 4 ? 1.0 : 0.5);
  }
  // The JSON line: figures at 64 MiB (null where not measured).
  auto json_num = [](std::optional<double> v) {
    return v ? fmt::format("{:.4g}", *v) : std::string("null");
  };
  auto at = [&](const expected<std::vector<double>>& r) -> std::optional<double> {
    if (!at64 || !r)
      return std::nullopt;
    return busbw_gbps(64 * mib, (*r)[*at64]);
  };
  const auto ours64 = at(ours), ring64 = at(gloo.ring), hd64 = at(gloo.halving_doubling),
             mpi64 = at(mpi);
  std::optional<double> gloo64 = ring64;
  if (hd64 && (!gloo64 || *hd64 > *gloo64))
    gloo64 = hd64;
  std::optional<double> copy64;
  if (at64)
    copy64 = static_cast<double>(64 * mib) / copy[*at64] / 1e9;
  auto ratio = [](std::optional<double> a, std::optional<double> b) -> std::optional<double> {
    if (!a || !b)
      return std::nullopt;
    return *a / *b;
  };
  fmt::print("{{\"bench\":\"allreduce\",\"ranks\":{},\"dtype\":\"f32\",\"busbw_64MiB_GBps\":{},"
             "\"gloo_busbw_64MiB_GBps\":{},\"gloo_ring_busbw_64MiB_GBps\":{},"
             "\"gloo_hd_busbw_64MiB_GBps\":{},\"mpi_busbw_64MiB_GBps\":{},\"copy_GBps\":{},"
             "\"ratio_to_gloo\":{},\"ratio_to_mpi\":{},\"ratio_to_copy\":{},\"dp1_step_s\":{},"
             "\"dp2_step_s\":{},\"weak_scaling_efficiency\":{}}}\n",
             ranks, json_num(ours64), json_num(gloo64), json_num(ring64), json_num(hd64),
             json_num(mpi64), json_num(copy64), json_num(ratio(ours64, gloo64)),
             json_num(ratio(ours64, mpi64)), json_num(ratio(ours64, copy64)),
             json_num(scaling ? std::optional<double>(scaling->dp1_step_s) : std::nullopt),
             json_num(scaling ? std::optional<double>(scaling->dp2_step_s) : std::nullopt),
             json_num(scaling ? std::optional<double>(scaling->efficiency()) : std::nullopt));
  return 0;
}

#if !DSA_HAVE_GLOO
gloo_result bench_gloo(int, const allreduce_plan&) {
  const error missing = make_error(errc::unsupported, "Gloo: not built with Gloo (install "
                                                      "libgloo-dev, then reconfigure)");
  return gloo_result{missing, missing};
}
#endif

} // namespace dsa::tools
