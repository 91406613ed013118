// dsactor bench aio DIR: sequential write then read of one file with the NVMe engine against
// pwrite/pread with O_DIRECT and buffered, in the same run.
#include "tools/bench/bench_aio.hpp"

#include "io/aio/aio_engine.hpp"
#include "io/aio/aligned_buffer_pool.hpp"
#include "io/ckpt/posix_file.hpp"
#include "tools/bench/bench_aio_actor.hpp"
#include "tools/bench/bench_fio.hpp"
#include "tools/options.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace dsa::tools {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Incompressible bytes (a 64-bit mix of the offset): a disk or a virtual disk's backing
// store that compresses or deduplicates would move a repeating pattern faster than the
// data a run writes, and faster than fio's random buffers.
unsigned char pattern(std::size_t i) {
  std::uint64_t x = static_cast<std::uint64_t>(i >> 3) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<unsigned char>(x >> (8 * (i & 7)));
}

// Two pool buffers: the source filled with the pattern, the destination for read-backs.
struct buffer_pair {
  std::unique_ptr<aio::aligned_buffer_pool> pool;
  aio::pool_buffer src, dst;
};

expected<buffer_pair> make_buffers(std::size_t bytes, std::size_t alignment) {
  aio::pool_options o;
  o.buffer_count = 2;
  o.buffer_bytes = aio::round_up(std::max<std::size_t>(bytes, 1), alignment);
  o.alignment = alignment;
  buffer_pair b;
  DSA_ASSIGN_OR_RETURN(b.pool, aio::aligned_buffer_pool::create(o));
  b.src = std::move(*b.pool->try_acquire());
  b.dst = std::move(*b.pool->try_acquire());
  auto* p = static_cast<unsigned char*>(b.src.data());
  for (std::size_t i = 0; i < bytes; ++i)
    p[i] = pattern(i);
  return b;
}

status validate(const buffer_pair& b, std::size_t bytes, const std::string& path, const char* who) {
  if (std::memcmp(b.src.data(), b.dst.data(), bytes) == 0)
    return {};
  const auto* s = static_cast<const unsigned char*>(b.src.data());
  const auto* d = static_cast<const unsigned char*>(b.dst.data());
  std::size_t i = 0;
  while (s[i] == d[i])
    ++i;
  return make_error(errc::runtime, "{}: '{}' read back differs at byte {} of {}", who, path, i,
                    bytes);
}

double gbps(std::size_t bytes, double s) {
  return static_cast<double>(bytes) / s / 1e9;
}

status posix_write(const std::string& path, posix_mode mode, const char* src, std::size_t bytes,
                   std::size_t block, std::size_t padded) {
  int flags =
      O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (mode == posix_mode::direct ? O_DIRECT : 0);
  ckpt::unique_fd fd(::open(path.c_str(), flags, 0600));
  if (!fd.valid())
    return ckpt::sys_error("cannot open", path, errno);
  std::size_t total = mode == posix_mode::direct ? padded : bytes;
  for (std::size_t off = 0; off < total; off += block) {
    std::size_t n = std::min(block, total - off);
    ssize_t w = ckpt::retry_eintr(
        [&] { return ::pwrite(fd.get(), src + off, n, static_cast<off_t>(off)); });
    if (w != static_cast<ssize_t>(n))
      return w < 0 ? ckpt::sys_error("cannot pwrite", path, errno)
                   : make_error(errc::io, "short pwrite to '{}' at {}", path, off);
  }
  if (mode == posix_mode::direct && ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    return ckpt::sys_error("cannot ftruncate", path, errno);
  if (mode == posix_mode::buffered) {
    DSA_TRY(ckpt::fsync_fd(fd, path));
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED); // the read must come from the device
  }
  return fd.close(path);
}

status posix_read(const std::string& path, posix_mode mode, char* dst, std::size_t bytes,
                  std::size_t block, std::size_t align) {
  int flags = O_RDONLY | O_CLOEXEC | (mode == posix_mode::direct ? O_DIRECT : 0);
  ckpt::unique_fd fd(::open(path.c_str(), flags));
  if (!fd.valid())
    return ckpt::sys_error("cannot open", path, errno);
  for (std::size_t off = 0; off < bytes; off += block) {
    std::size_t n = std::min(block, bytes - off);
    if (mode == posix_mode::direct)
      n = std::min(block, aio::round_up(bytes, align) - off); // whole blocks; EOF cuts the last
    ssize_t r =
        ckpt::retry_eintr([&] { return ::pread(fd.get(), dst + off, n, static_cast<off_t>(off)); });
    if (r < 0)
      return ckpt::sys_error("cannot pread", path, errno);
    if (static_cast<std::size_t>(r) < std::min(n, bytes - off))
      return make_error(errc::io, "short pread from '{}' at {}", path, off);
  }
  return {};
}

} // namespace

expected<transfer_rates> measure_engine(const std::string& dir, const aio::aio_config& config,
                                        std::size_t bytes, int reps) {
  DSA_ASSIGN_OR_RETURN(std::size_t align, aio::direct_io_alignment(dir));
  aio::engine_options o;
  o.config = config;
  o.alignment = align;
  DSA_ASSIGN_OR_RETURN(auto engine, aio::aio_engine::create(o));
  DSA_ASSIGN_OR_RETURN(buffer_pair b, make_buffers(bytes, align));
  std::string path = dir + "/dsactor_bench_aio.tmp";
  transfer_rates rates;
  double best_write = 1e30, best_read = 1e30;
  status outcome;
  for (int rep = 0; rep < reps && outcome; ++rep) {
    aio::aio_request req{aio::aio_op::write, path, b.src.data(), b.src.size(), bytes, 0, {}, {}};
    auto t0 = clock_type::now();
    auto w = engine->submit(req).get();
    best_write = std::min(best_write, seconds_since(t0));
    if (!w.result) {
      outcome = w.result;
      break;
    }
    rates.direct = w.direct;
    std::memset(b.dst.data(), 0, bytes);
    req = {aio::aio_op::read, path, b.dst.data(), b.dst.size(), bytes, 0, {}, {}};
    t0 = clock_type::now();
    auto r = engine->submit(req).get();
    best_read = std::min(best_read, seconds_since(t0));
    outcome = r.result ? validate(b, bytes, path, "aio engine") : r.result;
  }
  ::unlink(path.c_str());
  if (!outcome)
    return outcome.err();
  rates.write_gbps = gbps(bytes, best_write);
  rates.read_gbps = gbps(bytes, best_read);
  return rates;
}

expected<transfer_rates> measure_posix(const std::string& dir, posix_mode mode,
                                       std::size_t block_size, std::size_t bytes, int reps) {
  DSA_ASSIGN_OR_RETURN(std::size_t align, aio::direct_io_alignment(dir));
  DSA_ASSIGN_OR_RETURN(buffer_pair b, make_buffers(bytes, align));
  std::string path = dir + "/dsactor_bench_posix.tmp";
  double best_write = 1e30, best_read = 1e30;
  status outcome;
  for (int rep = 0; rep < reps && outcome; ++rep) {
    auto t0 = clock_type::now();
    outcome = posix_write(path, mode, static_cast<const char*>(b.src.data()), bytes, block_size,
                          b.src.size());
    best_write = std::min(best_write, seconds_since(t0));
    if (!outcome)
      break;
    std::memset(b.dst.data(), 0, bytes);
    t0 = clock_type::now();
    outcome = posix_read(path, mode, static_cast<char*>(b.dst.data()), bytes, block_size, align);
    best_read = std::min(best_read, seconds_since(t0));
    if (outcome)
      outcome = validate(b, bytes, path, mode == posix_mode::direct ? "pread O_DIRECT" : "pread");
  }
  ::unlink(path.c_str());
  if (!outcome)
    return outcome.err();
  transfer_rates rates{gbps(bytes, best_write), gbps(bytes, best_read), mode == posix_mode::direct};
  return rates;
}

std::string file_system_name(const std::string& dir) {
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0)
    return "unknown";
  switch (static_cast<unsigned long>(st.f_type)) {
  case 0xEF53:
    return "ext4";
  case 0x58465342:
    return "xfs";
  case 0x01021994:
    return "tmpfs";
  case 0x9123683E:
    return "btrfs";
  case 0x794C7630:
    return "overlayfs";
  case 0x6969:
    return "nfs";
  case 0x65735546:
    return "fuse";
  default:
    return fmt::format("0x{:x}", static_cast<unsigned long>(st.f_type));
  }
}

int bench_aio_main(int argc, char** argv) {
  po::options_description opts("dsactor bench aio DIR [--size MiB]");
  opts.add_options()("help,h", "this help")(
      "dir", po::value<std::string>()->required(),
      "directory on the device to measure (a temporary file is written there)")(
      "size", po::value<std::size_t>()->default_value(512), "file size in MiB")(
      "reps", po::value<int>()->default_value(2), "repetitions; the best of each direction counts");
  po::positional_options_description pos;
  pos.add("dir", 1);
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "bench aio", "", &pos))
    return *done;
  std::string dir = vm["dir"].as<std::string>();
  std::size_t bytes = vm["size"].as<std::size_t>() << 20;
  int reps = std::max(1, vm["reps"].as<int>());
  aio::aio_config config; // DeepSpeed's ZeRO [aio] defaults
  fmt::print("dsactor bench aio: {} MiB in {} ({}), {} rep(s), best of each\n", bytes >> 20, dir,
             file_system_name(dir), reps);
  fmt::print("  engine settings: {}\n", config.summary());
  auto engine = measure_engine(dir, config, bytes, reps);
  if (!engine) {
    fmt::print(stderr, "dsactor bench aio: {}\n", engine.err().to_string());
    return 1;
  }
  auto direct = measure_posix(dir, posix_mode::direct, config.block_size, bytes, reps);
  auto buffered = measure_posix(dir, posix_mode::buffered, config.block_size, bytes, reps);
  for (auto* m : {&direct, &buffered})
    if (!*m) {
      fmt::print(stderr, "dsactor bench aio: {}\n", m->err().to_string());
      return 1;
    }
  // fio, the reference: libaio, O_DIRECT, 1 MiB blocks, queue depth 32.
  auto fio = measure_fio(dir, bytes, reps);
  if (!fio && fio.err().code != errc::not_found) {
    fmt::print(stderr, "dsactor bench aio: {}\n", fio.err().to_string());
    return 1;
  }
  // The swap's pattern, on the engine and through the NVMe engine actor a run uses.
  auto swap = measure_swap_pattern(dir, config, bytes, reps);
  if (!swap) {
    fmt::print(stderr, "dsactor bench aio: {}\n", swap.err().to_string());
    return 1;
  }
  fmt::print("  {:<48} {:>10} {:>10}\n", "method", "write GB/s", "read GB/s");
  fmt::print("  {:<48} {:>10.3f} {:>10.3f}\n",
             engine->direct ? "dsactor aio engine (libaio, O_DIRECT)"
                            : "dsactor aio engine (buffered fallback)",
             engine->write_gbps, engine->read_gbps);
  fmt::print("  {:<48} {:>10.3f} {:>10.3f}\n", "pwrite/pread O_DIRECT, 1 MiB blocks",
             direct->write_gbps, direct->read_gbps);
  fmt::print("  {:<48} {:>10.3f} {:>10.3f}\n", "pwrite+fdatasync/pread buffered, cache dropped",
             buffered->write_gbps, buffered->read_gbps);
  if (fio)
    fmt::print("  {:<48} {:>10.3f} {:>10.3f}\n", "fio libaio O_DIRECT, 1 MiB, depth 32", fio->write_gbps,
               fio->read_gbps);
  else
    fmt::print("  {:<48} {}\n", "fio", fio.err().message);
  fmt::print("  {:<48} {:>10.2f} {:>10.2f}\n", "ratio engine / pwrite,pread O_DIRECT",
             engine->write_gbps / direct->write_gbps, engine->read_gbps / direct->read_gbps);
  if (fio)
    fmt::print("  {:<48} {:>10.2f} {:>10.2f}   (goal >= 0.90: {})\n", "ratio engine / fio",
               engine->write_gbps / fio->write_gbps, engine->read_gbps / fio->read_gbps,
               engine->write_gbps >= 0.9 * fio->write_gbps && engine->read_gbps >= 0.9 * fio->read_gbps ? "met"
                                                                                                      : "not met");
  const std::string pattern = fmt::format("{} MiB chunks, {} in flight", swap->chunk_bytes >> 20, swap->in_flight);
  fmt::print("  {:<48} {:>10.3f} {:>10.3f}\n", "swap pattern on the engine (" + pattern + ")",
             swap->engine_write_gbps, swap->engine_read_gbps);
  fmt::print("  {:<48} {:>10.3f} {:>10.3f}\n", "swap pattern through the NVMe engine actor",
             swap->actor_write_gbps, swap->actor_read_gbps);
  fmt::print("  {:<48} {:>10.2f} {:>10.2f}\n", "ratio actor / engine (the messages' cost)",
             swap->actor_write_gbps / swap->engine_write_gbps, swap->actor_read_gbps / swap->engine_read_gbps);
  auto or_null = [&](double v) { return fio ? fmt::format("{:.4g}", v) : std::string("null"); };
  fmt::print(
      "{{\"bench\":\"aio\",\"dir\":{},\"fs\":\"{}\",\"bytes\":{},\"direct\":{},\"read_GBps\":{:.4g}"
      ","
      "\"write_GBps\":{:.4g},\"posix_direct_read_GBps\":{:.4g},\"posix_direct_write_GBps\":{:.4g},"
      "\"posix_buffered_read_GBps\":{:.4g},\"posix_buffered_write_GBps\":{:.4g},"
      "\"read_ratio_to_posix_direct\":{:.4f},\"write_ratio_to_posix_direct\":{:.4f},\"fio_read_GBps\":{},"
      "\"fio_write_GBps\":{},\"read_ratio_to_fio\":{},\"write_ratio_to_fio\":{},"
      "\"swap_engine_read_GBps\":{:.4g},\"swap_engine_write_GBps\":{:.4g},\"swap_actor_read_GBps\":{:.4g},"
      "\"swap_actor_write_GBps\":{:.4g},\"swap_actor_read_ratio\":{:.4f},\"swap_actor_write_ratio\":{:.4f}}}\n",
      nlohmann::json(dir).dump(), file_system_name(dir), bytes, engine->direct, engine->read_gbps,
      engine->write_gbps, direct->read_gbps, direct->write_gbps, buffered->read_gbps,
      buffered->write_gbps, engine->read_gbps / direct->read_gbps,
      engine->write_gbps / direct->write_gbps, or_null(fio ? fio->read_gbps : 0),
      or_null(fio ? fio->write_gbps : 0), or_null(fio ? engine->read_gbps / fio->read_gbps : 0),
      or_null(fio ? engine->write_gbps / fio->write_gbps : 0), swap->engine_read_gbps,
      swap->engine_write_gbps, swap->actor_read_gbps, swap->actor_write_gbps,
      swap->actor_read_gbps / swap->engine_read_gbps, swap->actor_write_gbps / swap->engine_write_gbps);
  return 0;
}

} // namespace dsa::tools
