// A fake NCCL for the tests of io/net/nccl.hpp, built as a shared library and loaded at run
// time as the real one is: the C symbols dsactor resolves, over host memory, with ranks as
// threads of one process. ncclCommInitRank waits for the group's ranks as NCCL does; an
// allreduce returns at once and completes when the group's last rank has enqueued its own
// (fake_nccl_done stands in for cudaStreamQuery), so a rank that never comes leaves the
// others waiting, as on a GPU. fake_nccl_set makes rank 0 fail to make an id, one rank
// report an asynchronous error once its first allreduce completed, or one rank's
// ncclCommInitRank fail before it joins the group; counters tell aborts and
// destroys apart. An abort breaks the group: nothing of it completes after. f32 sums only.
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct group {
  int ranks = 0, joined = 0;
  std::vector<const float*> send;
  std::vector<float*> recv;
  std::vector<bool> arrived;
  std::size_t count = 0;
  int arrivals = 0;
  std::uint64_t round = 0; // completed allreduces
  bool broken = false;      // a rank aborted: nothing completes any more (no writes to its buffers)
};

struct comm {
  std::shared_ptr<group> g;
  int rank = 0;
  std::uint64_t waiting_for = 0; // the round its last allreduce completes
  bool reduced = false;          // it has enqueued an allreduce
};

// Never destroyed: a test may leave a rank blocked in ncclCommInitRank (a group that never
// fills) until the process exits.
std::mutex& mu = *new std::mutex;
std::condition_variable& cv = *new std::condition_variable;
std::map<std::string, std::shared_ptr<group>>& groups = *new std::map<std::string, std::shared_ptr<group>>;
int fail_unique_id = 0, error_rank = -1, error_code = 0, fail_init_rank = -1, aborts = 0, destroys = 0, ids = 0;

} // namespace

extern "C" {

struct fake_id {
  char internal[128];
};

int ncclGetVersion(int* version) {
  *version = 22800;
  return 0;
}

int ncclGetUniqueId(fake_id* id) {
  std::lock_guard<std::mutex> lock(mu);
  if (fail_unique_id) return 2; // ncclSystemError
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "fake-nccl-id-%d", ++ids);
  return 0;
}

int ncclCommInitRank(void** out, int nranks, fake_id id, int rank) {
  std::unique_lock<std::mutex> lock(mu);
  if (rank < 0 || rank >= nranks) return 4; // ncclInvalidArgument
  if (rank == fail_init_rank) return 2;     // ncclSystemError, before it joins: the others wait
  auto& g = groups[std::string(id.internal, strnlen(id.internal, sizeof id.internal))];
  if (!g) {
    g = std::make_shared<group>();
    g->ranks = nranks;
    g->send.resize(static_cast<std::size_t>(nranks));
    g->recv.resize(static_cast<std::size_t>(nranks));
    g->arrived.assign(static_cast<std::size_t>(nranks), false);
  }
  if (g->ranks != nranks) return 5; // ncclInvalidUsage
  ++g->joined;
  cv.notify_all();
  const std::shared_ptr<group> mine = g;
  cv.wait(lock, [&] { return mine->joined >= mine->ranks; });
  *out = new comm{mine, rank};
  return 0;
}

int ncclAllReduce(const void* send, void* recv, std::size_t count, int type, int op, void* c, void* /*stream*/) {
  if (type != 7 || op != 0) return 4; // f32 sums only
  std::lock_guard<std::mutex> lock(mu);
  comm& me = *static_cast<comm*>(c);
  group& g = *me.g;
  const auto r = static_cast<std::size_t>(me.rank);
  if (g.arrived[r]) return 5; // a second allreduce before the group finished the first
  g.arrived[r] = true;
  g.send[r] = static_cast<const float*>(send);
  g.recv[r] = static_cast<float*>(recv);
  g.count = count;
  me.waiting_for = g.round + 1;
  me.reduced = true;
  if (++g.arrivals < g.ranks || g.broken) return 0;
  // The last rank of the round: the sum in rank order, then into every rank's buffer.
  std::vector<float> sum(count, 0.0f);
  for (int k = 0; k < g.ranks; ++k)
    for (std::size_t i = 0; i < count; ++i) sum[i] += g.send[static_cast<std::size_t>(k)][i];
  for (int k = 0; k < g.ranks; ++k) std::memcpy(g.recv[static_cast<std::size_t>(k)], sum.data(), count * sizeof(float));
  g.arrivals = 0;
  g.arrived.assign(g.arrived.size(), false);
  ++g.round;
  return 0;
}

int ncclCommGetAsyncError(void* c, int* error) {
  std::lock_guard<std::mutex> lock(mu);
  const comm& me = *static_cast<comm*>(c);
  // After its first allreduce completed: the group's other ranks have theirs, whatever the order.
  *error = me.rank == error_rank && me.reduced && me.g->round >= me.waiting_for ? error_code : 0;
  return 0;
}

int ncclCommAbort(void* c) {
  std::lock_guard<std::mutex> lock(mu);
  ++aborts;
  static_cast<comm*>(c)->g->broken = true;
  delete static_cast<comm*>(c);
  return 0;
}

int ncclCommDestroy(void* c) {
  std::lock_guard<std::mutex> lock(mu);
  ++destroys;
  comm& me = *static_cast<comm*>(c);
  if (me.g->arrived[static_cast<std::size_t>(me.rank)]) me.g->broken = true; // its buffer goes with it
  delete static_cast<comm*>(c);
  return 0;
}

const char* ncclGetErrorString(int r) {
  switch (r) {
  case 0: return "no error";
  case 2: return "unhandled system error (fake)";
  case 4: return "invalid argument (fake)";
  case 5: return "invalid usage (fake)";
  case 6: return "remote process exited or there was a network error (fake)";
  default: return "unknown result (fake)";
  }
}

// The test's controls.
void fake_nccl_set(int fail_id, int rank_with_error, int code, int rank_failing_init) {
  std::lock_guard<std::mutex> lock(mu);
  fail_unique_id = fail_id;
  error_rank = rank_with_error;
  error_code = code;
  fail_init_rank = rank_failing_init;
}

int fake_nccl_done(void* c) {
  std::lock_guard<std::mutex> lock(mu);
  const comm& me = *static_cast<comm*>(c);
  return me.g->round >= me.waiting_for ? 1 : 0;
}

int fake_nccl_aborts() {
  std::lock_guard<std::mutex> lock(mu);
  return aborts;
}

int fake_nccl_destroys() {
  std::lock_guard<std::mutex> lock(mu);
  return destroys;
}

} // extern "C"
