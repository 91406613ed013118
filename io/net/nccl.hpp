// NCCL for GPU ranks, loaded at run time (dlopen): the library is too large to carry in a
// bundle, so dsactor uses the machine's own (DSA_NCCL_LIBRARY, else libnccl.so.2 from the
// loader's path) and builds without it. The part of NCCL's C ABI dsactor calls is declared
// here with nccl.h's values, so this file builds and is tested on every machine: against a
// fake NCCL library loaded the same way (tests/net/fake_nccl.cpp), and against the real one
// where it is installed (its version only: a communicator needs a GPU). dsactor report
// names the library it loads.
//
// A group's communicator: rank 0 makes the unique id, every rank gets it through an id
// exchange (the job's rendezvous allgather in a run; any function of that shape in tests)
// and calls ncclCommInitRank. Collectives are enqueued on a stream the caller owns (CUDA
// builds: a cudaStream_t; NCCL orders them on it), then `wait` polls two things until the
// stream's work is done: NCCL's asynchronous error, and a deadline. Either one aborts the
// communicator (ncclCommAbort: NCCL's kernels stop, so nothing hangs) and returns an error
// naming the rank, the group, the collective and NCCL's own message; an aborted communicator
// refuses what follows.
#pragma once

#include "core/error.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dsa::net::nccl {

// nccl.h's ABI, the subset used.
inline constexpr std::size_t unique_id_bytes = 128;
struct unique_id {
  char internal[unique_id_bytes];
};
using result_t = int; // ncclResult_t
inline constexpr result_t success = 0, in_progress = 7;
enum class element : int { u8 = 1, i64 = 4, f16 = 6, f32 = 7, bf16 = 9 }; // ncclDataType_t
inline constexpr int op_sum = 0;                          // ncclRedOp_t
using comm_t = void*;                                     // ncclComm_t
using stream_t = void*;                                   // cudaStream_t

// The loaded library: its functions, its path and version (major * 10000 + minor * 100 +
// patch, as ncclGetVersion gives it since 2.9).
struct library {
  void* handle = nullptr;
  std::string path;
  int version = 0;
  result_t (*get_version)(int*) = nullptr;
  result_t (*get_unique_id)(unique_id*) = nullptr;
  result_t (*comm_init_rank)(comm_t*, int, unique_id, int) = nullptr;
  result_t (*all_reduce)(const void*, void*, std::size_t, int, int, comm_t, stream_t) = nullptr;
  result_t (*all_gather)(const void*, void*, std::size_t, int, comm_t, stream_t) = nullptr;
  result_t (*comm_get_async_error)(comm_t, result_t*) = nullptr;
  result_t (*comm_abort)(comm_t) = nullptr;
  result_t (*comm_destroy)(comm_t) = nullptr;
  const char* (*get_error_string)(result_t) = nullptr;
  ~library();
  // "ncclSystemError (unhandled system error ...)": NCCL's string for `r`, with its number.
  std::string describe(result_t r) const;
};

// Loads `path`, or DSA_NCCL_LIBRARY, or the first of libnccl.so.2 (the loader's path),
// /usr/local/cuda/lib64/ and /usr/lib/x86_64-linux-gnu/ that loads; an errc::unsupported
// error naming each place tried with dlopen's message, or the missing symbol.
expected<std::shared_ptr<const library>> load_library(const std::string& path = "");

// Every rank's blob for `key` once every rank of the group gave its own (index = rank): the
// rendezvous client's allgather, or a test's.
using id_exchange =
    std::function<expected<std::vector<std::vector<std::byte>>>(const std::string& key, std::vector<std::byte> blob)>;

// A clock for the waits (tests step a fake one).
using clock_fn = std::function<std::chrono::steady_clock::time_point()>;

// One thread uses a communicator (a rank's reducer); abort() included.
class communicator {
public:
  // Joins the group `name` as `rank` of `ranks`: rank 0 makes the id (or, failing, sends
  // its error instead, so no rank waits for an id that will not come), the exchange hands it
  // to every rank under the key "nccl-id:<name>", and each calls ncclCommInitRank, which
  // waits for the whole group: past `init_deadline` (a rank that failed or died after the
  // exchange) the join fails; NCCL's call cannot be cancelled, so it is left blocked on a
  // thread of its own and the process is expected to end.
  static expected<std::unique_ptr<communicator>> join(std::shared_ptr<const library> lib, const id_exchange& exchange,
                                                      const std::string& name, int rank, int ranks,
                                                      std::chrono::milliseconds init_deadline = std::chrono::minutes(5));
  // ncclCommDestroy, which finishes the group's work; with a collective enqueued and never
  // waited for (an error path), ncclCommAbort instead, which cannot hang on a lost peer;
  // nothing after an abort.
  ~communicator();
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return ranks_; }
  bool aborted() const { return aborted_; }
  // NCCL's communicator (a fake's completion query in tests); null after an abort.
  comm_t handle() const { return comm_; }

  // Enqueues the sum over the group of `count` elements in place, on `stream`.
  status all_reduce_sum(void* data, std::size_t count, element type, stream_t stream);
  // Enqueues the gather of every rank's `count` elements at `in` into `out` (ranks x count,
  // rank r's at r x count), on `stream`.
  status all_gather(void* out, const void* in, std::size_t count, element type, stream_t stream);
  // Until `done()` (the stream's work finished; CUDA builds pass cudaStreamQuery's answer),
  // every `poll`: NCCL's asynchronous error first (an error is one even when the stream's
  // work ended), then done(), then `deadline` on `clock`. An error or the deadline aborts the
  // communicator and returns an error naming `what`.
  status wait(const std::function<bool()>& done, const std::string& what, std::chrono::milliseconds deadline,
              std::chrono::microseconds poll = std::chrono::microseconds(200), const clock_fn& clock = {});
  // ncclCommAbort, once.
  void abort();

private:
  communicator(std::shared_ptr<const library> lib, comm_t comm, std::string name, int rank, int ranks)
      : lib_(std::move(lib)), comm_(comm), name_(std::move(name)), rank_(rank), ranks_(ranks) {}
  std::string where() const; // "rank 1 of NCCL group \"dp\" (4 ranks)"
  std::shared_ptr<const library> lib_;
  comm_t comm_ = nullptr;
  std::string name_;
  int rank_ = 0, ranks_ = 1;
  bool aborted_ = false;
  bool pending_ = false; // a collective enqueued and not yet waited for
};

} // namespace dsa::net::nccl
