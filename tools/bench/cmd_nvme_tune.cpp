// dsactor nvme-tune DIR: sweeps the [aio] settings (block size x queue depth x threads x
// single_submit x overlap_events) on one file and prints the best section to paste, as
// DeepSpeed's ds_nvme_tune does.
#include "tools/bench/bench_aio.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"

#include <fmt/format.h>

#include <vector>

namespace dsa::tools {
namespace {

struct tuned {
  aio::aio_config config;
  transfer_rates rates;
  // One [aio] section serves both directions: rank by the harmonic mean, so a setting that
  // is fast one way and slow the other does not win.
  double score() const { return 2 / (1 / rates.read_gbps + 1 / rates.write_gbps); }
};

} // namespace

int nvme_tune_command(int argc, char** argv) {
  po::options_description opts("dsactor nvme-tune DIR [--size MiB] [--quick]");
  opts.add_options()("help,h", "this help")(
      "dir", po::value<std::string>()->required(),
      "directory on the device to tune (a temporary file is written there)")(
      "size", po::value<std::size_t>()->default_value(128), "file size in MiB per setting")(
      "reps", po::value<int>()->default_value(1), "repetitions per setting (best counts)")(
      "quick", "a smoke sweep: 2 block sizes x 2 queue depths x overlap_events on an 8 MiB file");
  po::positional_options_description pos;
  pos.add("dir", 1);
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "nvme-tune", "", &pos))
    return *done;
  std::string dir = vm["dir"].as<std::string>();
  bool quick = vm.count("quick") > 0;
  std::size_t bytes = (quick && vm["size"].defaulted() ? 8 : vm["size"].as<std::size_t>()) << 20;
  int reps = std::max(1, vm["reps"].as<int>());
  std::vector<std::size_t> block_sizes{128 << 10, 256 << 10, 512 << 10, 1 << 20};
  std::vector<unsigned> depths{4, 8, 16, 32}, threads{1, 2};
  std::vector<bool> singles{false, true}, overlaps{false, true};
  if (quick) {
    block_sizes = {256 << 10, 1 << 20};
    depths = {4, 8};
    threads = {1};
    singles = {false};
  }
  std::size_t total =
      block_sizes.size() * depths.size() * threads.size() * singles.size() * overlaps.size();
  fmt::print("dsactor nvme-tune: {} settings, {} MiB file in {} ({})\n", total, bytes >> 20, dir,
             file_system_name(dir));
  fmt::print("  {:>10} {:>6} {:>8} {:>7} {:>8} {:>10} {:>10}\n", "block", "depth", "threads",
             "single", "overlap", "write GB/s", "read GB/s");
  std::vector<tuned> results;
  for (std::size_t block : block_sizes)
    for (unsigned depth : depths)
      for (unsigned t : threads)
        for (bool single : singles)
          for (bool overlap : overlaps) {
            aio::aio_config c;
            c.block_size = block;
            c.queue_depth = depth;
            c.intra_op_parallelism = t;
            c.single_submit = single;
            c.overlap_events = overlap;
            auto rates = measure_engine(dir, c, bytes, reps);
            if (!rates) {
              fmt::print(stderr, "dsactor nvme-tune: {}: {}\n", c.summary(),
                         rates.err().to_string());
              return 1;
            }
            results.push_back({c, *rates});
            fmt::print("  {:>9}K {:>6} {:>8} {:>7} {:>8} {:>10.3f} {:>10.3f}\n", block >> 10, depth,
                       t, single, overlap, rates->write_gbps, rates->read_gbps);
            std::fflush(stdout);
          }
  auto by = [&](auto key) {
    return *std::max_element(results.begin(), results.end(),
                             [&](const tuned& a, const tuned& b) { return key(a) < key(b); });
  };
  tuned best_read = by([](const tuned& r) { return r.rates.read_gbps; });
  tuned best_write = by([](const tuned& r) { return r.rates.write_gbps; });
  tuned best = by([](const tuned& r) { return r.score(); });
  fmt::print("best read : {:.3f} GB/s with {}\n", best_read.rates.read_gbps,
             best_read.config.summary());
  fmt::print("best write: {:.3f} GB/s with {}\n", best_write.rates.write_gbps,
             best_write.config.summary());
  fmt::print("best both : {:.3f} GB/s read, {:.3f} GB/s write; paste into the config:\n\n{}\n",
             best.rates.read_gbps, best.rates.write_gbps, best.config.to_toml());
  if (!best.rates.direct)
    fmt::print("note: {} does not support O_DIRECT here; these figures include the page cache\n",
               dir);
  return 0;
}

} // namespace dsa::tools
