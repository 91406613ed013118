// The in-memory store and whole-array copies through any store.
#include "optim/chunked_state.hpp"

#include <cstring>

namespace dsa::optim {

resident_state::resident_state(tensor master, tensor exp_avg, tensor exp_avg_sq)
    : arrays_{std::move(master), std::move(exp_avg), std::move(exp_avg_sq)} {
  for (const tensor& t : arrays_)
    DSA_CHECK(t.defined() && t.type() == dtype::f32 && t.is_contiguous() && t.numel() == arrays_[0].numel(),
              "resident_state: three contiguous f32 arrays of one length, got {}", t.describe());
}

status resident_state::sweep(unsigned read, unsigned write, const chunk_fn& fn) {
  if (numel() == 0) return {};
  state_chunk c;
  c.hi = numel();
  for (unsigned a = 0; a < state_arrays; ++a)
    if ((read | write) & (1u << a)) c.arrays[a] = arrays_[a].data<float>();
  return fn(c);
}

status chunked_state::sweep_when(unsigned read, unsigned write, const chunk_ready& ready, const chunk_fn& fn) {
  if (!ready) return sweep(read, write, fn);
  return sweep(read, write, [&](const state_chunk& c) -> status {
    std::unique_lock<std::mutex> lock(gate_mu_);
    for (;;) {
      const std::uint64_t seen = gate_events_;
      DSA_ASSIGN_OR_RETURN(const bool final, ready(c.lo, c.hi));
      if (final) break;
      gate_cv_.wait(lock, [&] { return gate_events_ != seen; });
    }
    lock.unlock();
    return fn(c);
  });
}

void chunked_state::wake() {
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    ++gate_events_;
  }
  gate_cv_.notify_all();
}

std::int64_t resident_state::resident_bytes() const {
  std::int64_t n = 0;
  for (const tensor& t : arrays_) n += static_cast<std::int64_t>(t.nbytes());
  return n;
}

expected<std::vector<tensor>> read_arrays(chunked_state& store, unsigned which) {
  std::vector<tensor> out(state_arrays);
  for (unsigned a = 0; a < state_arrays; ++a)
    if (which & (1u << a)) out[a] = tensor::empty({store.numel()}, dtype::f32);
  DSA_TRY(store.sweep(which, 0, [&](const state_chunk& c) -> status {
    for (unsigned a = 0; a < state_arrays; ++a)
      if (which & (1u << a))
        std::memcpy(out[a].data<float>() + c.lo, c.arrays[a], static_cast<std::size_t>(c.hi - c.lo) * sizeof(float));
    return {};
  }));
  return out;
}

status write_arrays(chunked_state& store, const std::vector<tensor>& arrays) {
  if (arrays.size() != state_arrays)
    return make_error(errc::invalid_argument, "write_arrays: {} arrays, expected {}", arrays.size(), state_arrays);
  for (const tensor& t : arrays)
    if (!t.defined() || t.type() != dtype::f32 || !t.is_contiguous() || t.numel() != store.numel())
      return make_error(errc::invalid_argument, "write_arrays: expected contiguous f32[{}], got {}", store.numel(),
                        t.defined() ? t.describe() : "undefined");
  return store.sweep(0, all_arrays, [&](const state_chunk& c) -> status {
    for (unsigned a = 0; a < state_arrays; ++a)
      std::memcpy(c.arrays[a], arrays[a].data<float>() + c.lo, static_cast<std::size_t>(c.hi - c.lo) * sizeof(float));
    return {};
  });
}

} // namespace dsa::optim
