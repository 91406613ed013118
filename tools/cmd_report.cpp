// dsactor report: what this machine supports — CPU features, BLAS, CUDA/NCCL
// (found at run time, so a CPU-only build reports them too), UCX, libaio, and
// whether a directory supports O_DIRECT.
#include "kernels/cpu/gemm_bf16.hpp"
#include "kernels/cpu/isa.hpp"
#include "io/net/nccl.hpp"
#include "tools/command.hpp"
#include "tools/malloc_tuning.hpp"
#include "tools/omp_env.hpp"

#include "tools/bench/bench_util.hpp"
#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <cblas.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <libaio.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace dsa::tools {
namespace {

std::string cpu_features() {
  std::string out;
  __builtin_cpu_init();
  for (const char* f : {"sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_bf16"}) {
    bool has = false;
    if (!std::strcmp(f, "sse4.2")) has = __builtin_cpu_supports("sse4.2");
    else if (!std::strcmp(f, "avx")) has = __builtin_cpu_supports("avx");
    else if (!std::strcmp(f, "avx2")) has = __builtin_cpu_supports("avx2");
    else if (!std::strcmp(f, "fma")) has = __builtin_cpu_supports("fma");
    else if (!std::strcmp(f, "avx512f")) has = __builtin_cpu_supports("avx512f");
    else {
      std::ifstream in("/proc/cpuinfo");
      std::string line;
      while (std::getline(in, line))
        if (line.rfind("flags", 0) == 0) {
          has = line.find(std::string(" ") + f) != std::string::npos;
          break;
        }
    }
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", f, has ? "yes" : "no");
  }
  return out;
}

// CUDA driver and runtime, looked up at run time so the report works on any build.
void report_cuda() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!driver) {
    fmt::print("cuda driver   : not found (no GPU usable: {})\n", dlerror());
  } else {
    using init_fn = int (*)(unsigned);
    using count_fn = int (*)(int*);
    using version_fn = int (*)(int*);
    auto init = reinterpret_cast<init_fn>(dlsym(driver, "cuInit"));
    auto count = reinterpret_cast<count_fn>(dlsym(driver, "cuDeviceGetCount"));
    auto version = reinterpret_cast<version_fn>(dlsym(driver, "cuDriverGetVersion"));
    int v = 0, n = 0;
    int rc = init ? init(0) : -1;
    if (version) version(&v);
    if (rc == 0 && count) count(&n);
    fmt::print("cuda driver   : {}.{}; cuInit {}; {} device(s); GPU usable: {}\n", v / 1000, (v % 1000) / 10,
               rc == 0 ? "ok" : fmt::format("failed ({})", rc), n, rc == 0 && n > 0 ? "yes" : "no");
  }
  const char* runtimes[] = {"libcudart.so.13", "/usr/local/cuda/lib64/libcudart.so.13", "libcudart.so"};
  void* rt = nullptr;
  for (const char* name : runtimes)
    if ((rt = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
  if (!rt) {
    fmt::print("cuda runtime  : not found\n");
  } else {
    using fn = int (*)(int*);
    int v = 0;
    if (auto f = reinterpret_cast<fn>(dlsym(rt, "cudaRuntimeGetVersion"))) f(&v);
    fmt::print("cuda runtime  : {}.{}\n", v / 1000, (v % 1000) / 10);
  }
  // The loader dsactor's NCCL communicators use (io/net/nccl.hpp).
  if (auto nccl = net::nccl::load_library()) {
    const int v = (*nccl)->version;
    fmt::print("nccl          : {}.{}.{} ({})\n", v / 10000, (v % 10000) / 100, v % 100, (*nccl)->path);
  } else {
    fmt::print("nccl          : not found ({})\n", nccl.err().message);
  }
#if DSA_HAVE_CUDA
  fmt::print("cuda kernels  : compiled in (sm_90); dsactor bench gpu-kernels and gpu-train run them. "
             "dsactor run trains on CPU ranks\n");
#else
  fmt::print("cuda kernels  : not compiled in this build (no nvcc, -Dcuda=disabled, or ./ds run on a machine "
             "with no visible GPU; ./ds build compiles them when nvcc is found). dsactor run trains on CPU ranks\n");
#endif
}

void report_aio() {
  io_context_t ctx{};
  int rc = io_setup(8, &ctx);
  if (rc == 0) {
    io_destroy(ctx);
    fmt::print("libaio        : io_setup ok\n");
  } else {
    fmt::print("libaio        : io_setup failed: {}\n", std::strerror(-rc));
  }
}

// Writes and reads back one 4 KiB block with O_DIRECT in `dir`.
void report_odirect(const std::string& dir) {
  std::string path = dir + "/.dsactor-odirect-probe." + std::to_string(getpid());
  int fd = open(path.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_TRUNC, 0600);
  if (fd < 0) {
    fmt::print("O_DIRECT      : {}: not supported ({})\n", dir, std::strerror(errno));
    return;
  }
  void* buf = nullptr;
  bool ok = posix_memalign(&buf, 4096, 4096) == 0;
  if (ok) {
    std::memset(buf, 0x5a, 4096);
    ok = pwrite(fd, buf, 4096, 0) == 4096;
    std::memset(buf, 0, 4096);
    ok = ok && pread(fd, buf, 4096, 0) == 4096 && static_cast<unsigned char*>(buf)[4095] == 0x5a;
  }
  int err = errno;
  std::free(buf);
  close(fd);
  unlink(path.c_str());
  fmt::print("O_DIRECT      : {}: {}\n", dir, ok ? "supported" : fmt::format("open ok, I/O failed ({})", std::strerror(err)));
}

} // namespace

int cmd_report(int argc, char** argv) {
  namespace po = boost::program_options;
  po::options_description opts("dsactor report [--dir PATH]");
  opts.add_options()("help,h", "this help")(
      "dir", po::value<std::string>()->default_value("."), "directory to probe for O_DIRECT (the NVMe path)");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "report")) return *done;
  fmt::print("cpu           : {} ({} hardware threads)\n", cpu_model(), std::thread::hardware_concurrency());
  fmt::print("cpu features  : {}\n", cpu_features());
  fmt::print("blas          : {} (core {}, {} threads)\n", openblas_get_config(), openblas_get_corename(),
             openblas_get_num_threads());
  fmt::print("malloc        : {}\n", malloc_tuning_report());
  fmt::print("openmp        : {}\n", omp_env_report());
  fmt::print("kernels       : {}\n", cpu::isa_report());
  std::string why;
  if (cpu::bf16_gemm_supported(&why))
    fmt::print("bf16 gemm     : oneDNN {} (bf16.cpu_gemm can be turned on)\n", cpu::bf16_gemm_implementation());
  else
    fmt::print("bf16 gemm     : not available ({})\n", why);
  report_cuda();
  fmt::print("ucx           : {}\n", ucp_get_version_string());
  report_aio();
  report_odirect(vm["dir"].as<std::string>());
  return 0;
}

} // namespace dsa::tools
