// NCCL loaded at run time; see nccl.hpp.
#include "io/net/nccl.hpp"

#include <fmt/format.h>

#include <optional>

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>

namespace dsa::net::nccl {
namespace {

// Without a path or DSA_NCCL_LIBRARY: the loader's path, then where CUDA toolkits and
// Debian's package put it.
constexpr const char* default_libraries[] = {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2",
                                             "/usr/lib/x86_64-linux-gnu/libnccl.so.2"};

template <class F> bool resolve(void* handle, const char* name, F& out, std::string& missing) {
  dlerror();
  void* f = dlsym(handle, name);
  if (!f) {
    if (missing.empty()) missing = name;
    return false;
  }
  out = reinterpret_cast<F>(f);
  return true;
}

std::vector<std::byte> as_bytes(const std::string& s) {
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

} // namespace

library::~library() {
  if (handle) dlclose(handle);
}

std::string library::describe(result_t r) const {
  const char* text = get_error_string ? get_error_string(r) : nullptr;
  return fmt::format("NCCL result {} ({})", r, text ? text : "no message");
}

expected<std::shared_ptr<const library>> load_library(const std::string& path) {
  std::vector<std::string> candidates;
  std::string from = "the path given";
  if (!path.empty()) {
    candidates.push_back(path);
  } else if (const char* env = std::getenv("DSA_NCCL_LIBRARY"); env && *env) {
    candidates.push_back(env);
    from = "DSA_NCCL_LIBRARY";
  } else {
    candidates.assign(std::begin(default_libraries), std::end(default_libraries));
    from = "the default places (set DSA_NCCL_LIBRARY to choose another)";
  }
  void* handle = nullptr;
  std::string chosen, tried;
  for (const std::string& c : candidates) {
    dlerror();
    if ((handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL))) {
      chosen = c;
      break;
    }
    const char* why = dlerror();
    tried += fmt::format("{}'{}': {}", tried.empty() ? "" : "; ", c, why ? why : "dlopen failed");
  }
  if (!handle) return make_error(errc::unsupported, "NCCL: cannot load {} ({})", tried, from);
  auto lib = std::make_shared<library>();
  lib->handle = handle;
  lib->path = chosen;
  std::string missing;
  resolve(handle, "ncclGetVersion", lib->get_version, missing);
  resolve(handle, "ncclGetUniqueId", lib->get_unique_id, missing);
  resolve(handle, "ncclCommInitRank", lib->comm_init_rank, missing);
  resolve(handle, "ncclAllReduce", lib->all_reduce, missing);
  resolve(handle, "ncclAllGather", lib->all_gather, missing);
  resolve(handle, "ncclCommGetAsyncError", lib->comm_get_async_error, missing);
  resolve(handle, "ncclCommAbort", lib->comm_abort, missing);
  resolve(handle, "ncclCommDestroy", lib->comm_destroy, missing);
  resolve(handle, "ncclGetErrorString", lib->get_error_string, missing);
  if (!missing.empty())
    return make_error(errc::unsupported, "NCCL: '{}' ({}) has no symbol {}: not an NCCL library, or too old", chosen,
                      from, missing);
  if (const result_t r = lib->get_version(&lib->version); r != success)
    return make_error(errc::unsupported, "NCCL: '{}': ncclGetVersion failed: {}", chosen, lib->describe(r));
  if (lib->version < 20900)
    return make_error(errc::unsupported, "NCCL: '{}' is version {}; dsactor needs 2.9 or newer", chosen, lib->version);
  return std::shared_ptr<const library>(std::move(lib));
}

expected<std::unique_ptr<communicator>> communicator::join(std::shared_ptr<const library> lib,
                                                           const id_exchange& exchange, const std::string& name,
                                                           int rank, int ranks, std::chrono::milliseconds init_deadline) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    return make_error(errc::invalid_argument, "NCCL group \"{}\": rank {} of {}", name, rank, ranks);
  // Rank 0's blob: 'I' and the id, or 'E' and why it has none.
  std::vector<std::byte> blob;
  if (rank == 0) {
    unique_id id{};
    if (const result_t r = lib->get_unique_id(&id); r == success) {
      blob = as_bytes(std::string("I") + std::string(id.internal, unique_id_bytes));
    } else {
      blob = as_bytes("E" + lib->describe(r));
    }
  }
  auto all = exchange("nccl-id:" + name, std::move(blob));
  if (!all)
    return make_error(all.err().code, "NCCL group \"{}\", rank {}: exchanging the unique id: {}", name, rank,
                      all.err().message);
  const std::vector<std::byte>& from0 = all->empty() ? std::vector<std::byte>{} : all->front();
  const auto text = [&](std::size_t at) {
    return std::string(reinterpret_cast<const char*>(from0.data()) + at, from0.size() - at);
  };
  if (!from0.empty() && from0[0] == std::byte{'E'})
    return make_error(errc::runtime, "NCCL group \"{}\", rank {}: rank 0 could not make the unique id: {}", name, rank,
                      text(1));
  if (from0.size() != 1 + unique_id_bytes || from0[0] != std::byte{'I'})
    return make_error(errc::protocol, "NCCL group \"{}\", rank {}: rank 0's unique id came as {} bytes, expected {}",
                      name, rank, from0.size(), 1 + unique_id_bytes);
  unique_id id{};
  std::memcpy(id.internal, from0.data() + 1, unique_id_bytes);
  // ncclCommInitRank returns once every rank of the group called it: on a thread of its own,
  // so a rank that never comes fails the join at the deadline instead of hanging it.
  auto inited = std::make_shared<std::promise<std::pair<result_t, comm_t>>>();
  std::future<std::pair<result_t, comm_t>> answer = inited->get_future();
  std::thread([lib, inited, ranks, id, rank] {
    comm_t comm = nullptr;
    const result_t r = lib->comm_init_rank(&comm, ranks, id, rank);
    inited->set_value({r, comm});
  }).detach();
  if (answer.wait_for(init_deadline) != std::future_status::ready)
    return make_error(errc::runtime,
                      "NCCL group \"{}\", rank {} of {}: ncclCommInitRank did not return within {} ms: a rank of the "
                      "group did not join (it failed or ended after the id exchange); NCCL's call cannot be "
                      "cancelled, so this process should end",
                      name, rank, ranks, init_deadline.count());
  const auto [r, comm] = answer.get();
  if (r != success)
    return make_error(errc::runtime, "NCCL group \"{}\", rank {} of {}: ncclCommInitRank failed: {}", name, rank,
                      ranks, lib->describe(r));
  return std::unique_ptr<communicator>(new communicator(std::move(lib), comm, name, rank, ranks));
}

communicator::~communicator() {
  if (pending_) abort(); // destroy would wait for the group's work, which may never end
  if (comm_ && !aborted_) lib_->comm_destroy(comm_);
}

std::string communicator::where() const {
  return fmt::format("rank {} of NCCL group \"{}\" ({} ranks)", rank_, name_, ranks_);
}

void communicator::abort() {
  if (aborted_ || !comm_) return;
  aborted_ = true;
  pending_ = false;
  lib_->comm_abort(comm_); // frees the communicator too: nothing is left to destroy
  comm_ = nullptr;
}

status communicator::all_reduce_sum(void* data, std::size_t count, element type, stream_t stream) {
  if (aborted_) return make_error(errc::runtime, "{}: an allreduce after the communicator was aborted", where());
  const result_t r = lib_->all_reduce(data, data, count, static_cast<int>(type), op_sum, comm_, stream);
  if (r != success && r != in_progress)
    return make_error(errc::runtime, "{}: ncclAllReduce of {} elements failed: {}", where(), count, lib_->describe(r));
  pending_ = true;
  return {};
}

status communicator::all_gather(void* out, const void* in, std::size_t count, element type, stream_t stream) {
  if (aborted_) return make_error(errc::runtime, "{}: an allgather after the communicator was aborted", where());
  const result_t r = lib_->all_gather(in, out, count, static_cast<int>(type), comm_, stream);
  if (r != success && r != in_progress)
    return make_error(errc::runtime, "{}: ncclAllGather of {} elements failed: {}", where(), count, lib_->describe(r));
  pending_ = true;
  return {};
}

status communicator::wait(const std::function<bool()>& done, const std::string& what,
                          std::chrono::milliseconds deadline, std::chrono::microseconds poll, const clock_fn& clock) {
  if (aborted_) return make_error(errc::runtime, "{}: waiting for {} after the communicator was aborted", where(), what);
  const clock_fn now = clock ? clock : [] { return std::chrono::steady_clock::now(); };
  const auto until = now() + deadline;
  // NCCL's asynchronous error, read after done() too: an error that came as the work ended
  // (kernels stopped by it can let the stream finish) is still one.
  auto failed = [&]() -> std::optional<std::string> {
    result_t async = success;
    const result_t r = lib_->comm_get_async_error(comm_, &async);
    if (r != success || (async != success && async != in_progress)) return lib_->describe(r != success ? r : async);
    return std::nullopt;
  };
  for (;;) {
    std::optional<std::string> why = failed();
    const bool finished = !why && done();
    if (finished) why = failed();
    if (why) {
      abort();
      return make_error(errc::runtime, "{}: {} failed: {}; the communicator was aborted", where(), what, *why);
    }
    if (finished) {
      pending_ = false;
      return {};
    }
    if (now() >= until) {
      abort();
      return make_error(errc::runtime, "{}: {} did not finish within {} ms; the communicator was aborted (a peer "
                                       "stopped, or its collectives came in another order)",
                        where(), what, deadline.count());
    }
    if (poll.count() > 0) std::this_thread::sleep_for(poll);
  }
}

} // namespace dsa::net::nccl
