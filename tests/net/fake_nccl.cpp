// A fake NCCL for the tests of io/net/nccl.hpp, built as a shared library and loaded at run
// time as the real one is: the C symbols dsactor resolves, over host memory, with ranks as
// threads of one process. ncclCommInitRank waits for the group's ranks as NCCL does; a
// collective (an allreduce, an allgather) returns at once and completes when the group's
// last rank has enqueued its own, in order, several in flight allowed (fake_nccl_done,
// whether a rank's last one completed, stands in for cudaStreamQuery), so a rank that never
// comes leaves the others waiting, as on a GPU. fake_nccl_set makes rank 0 fail to make an id, one rank
// report an asynchronous error once its latest collective completed, or one rank's
// ncclCommInitRank fail before it joins the group; counters tell aborts and
// destroys apart. An abort breaks the group: nothing of it completes after. Sums of f32 only.
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

// One collective of the group: the k-th each rank enqueued. Rounds complete in order (a
// rank enqueues its k-th after its (k-1)-th), each once every rank has enqueued its own.
struct round_state {
  int kind = 0; // 1: allreduce (f32 sum), 2: allgather
  std::size_t count = 0, elem = 0;
  std::vector<const void*> send;
  std::vector<void*> recv;
  int arrivals = 0;
};

struct group {
  int ranks = 0, joined = 0;
  std::map<std::uint64_t, round_state> pending; // by round number, from 1
  std::uint64_t round = 0; // completed collectives
  bool broken = false;      // a rank aborted: nothing completes any more (no writes to its buffers)
};

struct comm {
  std::shared_ptr<group> g;
  int rank = 0;
  std::uint64_t waiting_for = 0; // the round its last collective completes
  bool reduced = false;          // it has enqueued a collective
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
  }
  if (g->ranks != nranks) return 5; // ncclInvalidUsage
  ++g->joined;
  cv.notify_all();
  const std::shared_ptr<group> mine = g;
  cv.wait(lock, [&] { return mine->joined >= mine->ranks; });
  *out = new comm{mine, rank};
  return 0;
}

} // extern "C"

namespace {

// Bytes per element of ncclDataType_t `type`; 0 for one the fake does not know.
std::size_t element_bytes(int type) {
  switch (type) {
  case 0: case 1: return 1;
  case 2: case 3: case 7: return 4;
  case 4: case 5: case 8: return 8;
  case 6: case 9: return 2;
  default: return 0;
  }
}

// Rank `me` enqueues its next collective; the last rank of a round runs it (under mu).
int enqueue(comm& me, int kind, const void* send, void* recv, std::size_t count, std::size_t elem) {
  group& g = *me.g;
  const std::uint64_t k = me.waiting_for + 1; // this rank's next round
  round_state& rs = g.pending[k];
  if (rs.arrivals == 0) {
    rs.kind = kind;
    rs.count = count;
    rs.elem = elem;
    rs.send.assign(static_cast<std::size_t>(g.ranks), nullptr);
    rs.recv.assign(static_cast<std::size_t>(g.ranks), nullptr);
  } else if (rs.kind != kind || rs.count != count || rs.elem != elem) {
    return 5; // ncclInvalidUsage: the ranks' k-th collectives differ
  }
  const auto r = static_cast<std::size_t>(me.rank);
  rs.send[r] = send;
  rs.recv[r] = recv;
  me.waiting_for = k;
  me.reduced = true;
  if (++rs.arrivals < g.ranks || g.broken) return 0;
  if (kind == 1) { // the sum in rank order, then into every rank's buffer
    std::vector<float> sum(count, 0.0f);
    for (int q = 0; q < g.ranks; ++q)
      for (std::size_t i = 0; i < count; ++i) sum[i] += static_cast<const float*>(rs.send[static_cast<std::size_t>(q)])[i];
    for (int q = 0; q < g.ranks; ++q) std::memcpy(rs.recv[static_cast<std::size_t>(q)], sum.data(), count * sizeof(float));
  } else { // rank q's count elements at q x count in every rank's output
    for (int to = 0; to < g.ranks; ++to)
      for (int q = 0; q < g.ranks; ++q)
        std::memcpy(static_cast<char*>(rs.recv[static_cast<std::size_t>(to)]) + static_cast<std::size_t>(q) * count * elem,
                    rs.send[static_cast<std::size_t>(q)], count * elem);
  }
  g.pending.erase(k);
  g.round = k;
  return 0;
}

} // namespace

extern "C" {

int ncclAllReduce(const void* send, void* recv, std::size_t count, int type, int op, void* c, void* /*stream*/) {
  if (type != 7 || op != 0) return 4; // f32 sums only
  std::lock_guard<std::mutex> lock(mu);
  return enqueue(*static_cast<comm*>(c), 1, send, recv, count, 4);
}

int ncclAllGather(const void* send, void* recv, std::size_t count, int type, void* c, void* /*stream*/) {
  const std::size_t elem = element_bytes(type);
  if (elem == 0) return 4;
  std::lock_guard<std::mutex> lock(mu);
  return enqueue(*static_cast<comm*>(c), 2, send, recv, count, elem);
}

int ncclCommGetAsyncError(void* c, int* error) {
  std::lock_guard<std::mutex> lock(mu);
  const comm& me = *static_cast<comm*>(c);
  // Once its latest collective completed: the group's other ranks have theirs, whatever the order.
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
  if (me.g->round < me.waiting_for) me.g->broken = true; // a collective not complete: its buffer goes with it
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
