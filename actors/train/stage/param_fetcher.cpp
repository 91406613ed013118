// ZeRO-3 parameter fetcher; see param_fetcher.hpp.
#include "actors/train/stage/param_fetcher.hpp"

#include "actors/data_parallel.hpp"
#include "core/file_backed.hpp"
#include "kernels/cpu/convert.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <stdexcept>

namespace dsa::train {
namespace {

std::byte* at_element(const tensor& t, std::int64_t element) {
  return static_cast<std::byte*>(t.raw_data()) + static_cast<std::size_t>(element) * dtype_size(t.type());
}

} // namespace

param_fetcher::param_fetcher(optim::flat_layout layout, std::uint32_t rank, dtype working,
                             std::shared_ptr<net::communicator> comm, std::vector<fetch_part> parts,
                             std::vector<std::int64_t> sequence, std::uint32_t micro_batches, fetch_settings settings,
                             std::unique_ptr<param_store> store)
    : layout_(std::move(layout)), rank_(rank), working_(working), comm_(std::move(comm)), parts_(std::move(parts)),
      settings_(settings), store_(std::move(store)) {
  DSA_CHECK(comm_ && comm_->size() == static_cast<int>(layout_.ranks()) && comm_->rank() == static_cast<int>(rank),
            "param fetcher: rank {} of {} needs that rank's communicator", rank, layout_.ranks());
  DSA_CHECK(micro_batches >= 1 && !sequence.empty(), "param fetcher: an empty use sequence");
  const auto& tensors = layout_.tensors();
  persistent_.assign(tensors.size(), false);
  for (std::size_t t = 0; t < tensors.size(); ++t)
    if (tensors[t].numel <= settings_.persistence_threshold) {
      persistent_[t] = true;
      persistent_elements_ += tensors[t].numel;
    }
  for (const auto& p : parts_)
    for (std::size_t t : p.tensors)
      DSA_CHECK(t < tensors.size(), "param fetcher: part {} names tensor {} of {}", p.id, t, tensors.size());
  plan_uses(sequence, micro_batches);
  if (!store_) store_ = memory_param_store(layout_.partition_numel(), working_);
  DSA_CHECK(store_->numel() == layout_.partition_numel(), "param fetcher: a store of {} elements for a partition of {}",
            store_->numel(), layout_.partition_numel());
  thread_ = std::thread([this] { run_thread(); });
}

param_fetcher::~param_fetcher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void param_fetcher::plan_uses(const std::vector<std::int64_t>& sequence, std::uint32_t micro_batches) {
  // The non-persistent tensors of each use, in order.
  std::vector<std::size_t> order;
  for (std::uint32_t m = 0; m < micro_batches; ++m)
    for (std::int64_t id : sequence) {
      auto it = std::find_if(parts_.begin(), parts_.end(), [&](const fetch_part& p) { return p.id == id; });
      DSA_CHECK(it != parts_.end(), "param fetcher: the use sequence names part {}, which no part has", id);
      order.push_back(static_cast<std::size_t>(it - parts_.begin()));
    }
  auto held = [&](std::size_t use) {
    std::set<std::size_t> out;
    for (std::size_t t : parts_[order[use]].tensors)
      if (!persistent_[t]) out.insert(t);
    return out;
  };
  const auto& tensors = layout_.tensors();
  std::vector<std::size_t> gathered_at(tensors.size(), 0);
  uses_.clear();
  std::set<std::size_t> prev;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::set<std::size_t> cur = held(i);
    const std::set<std::size_t> next = i + 1 < order.size() ? held(i + 1) : std::set<std::size_t>{};
    use_plan u;
    u.part = order[i];
    for (std::size_t t : cur)
      if (!prev.count(t)) {
        u.gather.push_back(t);
        u.gather_elements += tensors[t].numel;
        gathered_at[t] = i;
      }
    for (std::size_t t : cur)
      if (!next.count(t)) {
        u.free.emplace_back(t, gathered_at[t]);
        u.free_elements += tensors[t].numel;
      }
    uses_.push_back(std::move(u));
    prev = cur;
  }
}

void param_fetcher::take_whole(const std::vector<tensor>& whole) {
  const auto& tensors = layout_.tensors();
  DSA_CHECK(whole.size() == tensors.size(), "param fetcher: {} whole tensors for {} parameters", whole.size(),
            tensors.size());
  std::lock_guard<std::mutex> lk(mu_);
  DSA_CHECK(!step_open_, "param fetcher: new weights during a step");
  const optim::flat_range mine = layout_.partition(rank_);
  // Streamed into the store piece by piece, zeros in the padding: no whole partition copy
  // (the stage's whole weights exist at this moment too).
  const tensor zeros = tensor::zeros({std::min<std::int64_t>(layout_.partition_numel(), 1 << 16)}, working_);
  std::int64_t at = 0; // elements of the partition written so far
  auto pad_to = [&](std::int64_t to) -> status {
    for (; at < to; at += std::min(to - at, zeros.numel())) DSA_TRY(store_->append(zeros.slice_rows(0, std::min(to - at, zeros.numel()))));
    return {};
  };
  auto stream = [&]() -> status {
    DSA_TRY(store_->begin_write());
    for (const auto& p : layout_.pieces(mine)) {
      const tensor& src = whole[p.tensor];
      DSA_CHECK(src.defined() && src.is_contiguous() && src.numel() == tensors[p.tensor].numel,
                "param fetcher: whole tensor {} ({}) is {}", p.tensor, tensors[p.tensor].name,
                src.defined() ? src.describe() : "undefined");
      DSA_CHECK(p.flat_offset - mine.lo >= at, "param fetcher: pieces of the partition out of order");
      DSA_TRY(pad_to(p.flat_offset - mine.lo));
      DSA_TRY(store_->append(src.flatten().slice_rows(p.tensor_offset, p.tensor_offset + p.count)));
      DSA_TRY(try_page_out(src.raw_data(), src.nbytes())); // a stage built in a file (core/file_backed.hpp)
      at += p.count;
    }
    return pad_to(layout_.partition_numel());
  };
  status streamed = stream();
  status ended = store_->end_write(); // always: closes the write
  if (!streamed || !ended)
    throw std::runtime_error("storing the ZeRO-3 weight partition: " + (!streamed ? streamed : ended).err().message);
}

status param_fetcher::begin_version() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (step_open_ || writing_version_)
      return make_error(errc::protocol, "ZeRO-3 weight partition: a new version written {}",
                        step_open_ ? "during a step" : "while another is being written");
    writing_version_ = true;
  }
  return store_->begin_write();
}

status param_fetcher::keep_version() {
  std::lock_guard<std::mutex> lk(mu_);
  if (step_open_ || writing_version_)
    return make_error(errc::protocol, "ZeRO-3 weight partition: the version kept {}",
                      step_open_ ? "during a step" : "while another is being written");
  version_written_ = true;
  return {};
}

status param_fetcher::end_version() {
  status ended = store_->end_write();
  std::lock_guard<std::mutex> lk(mu_);
  writing_version_ = false;
  version_written_ = ended.has_value();
  return ended;
}

void param_fetcher::load(const tensor& partition) {
  std::lock_guard<std::mutex> lk(mu_);
  DSA_CHECK(!step_open_, "param fetcher: a new parameter version during a step");
  if (!partition.defined()) {
    DSA_CHECK(version_written_ && !writing_version_,
              "param fetcher: a parameter version without weights, and the shard wrote none");
    version_written_ = false;
    return;
  }
  DSA_CHECK(partition.is_contiguous() && partition.numel() == store_->numel(),
            "param fetcher: a parameter version of {} elements for a partition of {}", partition.numel(),
            store_->numel());
  if (auto w = store_->write(partition); !w)
    throw std::runtime_error("storing the ZeRO-3 weight partition: " + w.err().message);
}

bool param_fetcher::may_gather(std::size_t i) const {
  if (i <= next_use_) return true; // the compute's next use: always
  std::int64_t ahead = 0;
  for (std::size_t k = next_use_; k < i; ++k) ahead += uses_[k].gather_elements;
  const std::int64_t more = uses_[i].gather_elements;
  return ahead + more <= settings_.prefetch_elements && live_ + more <= settings_.max_live_elements;
}

void param_fetcher::run_thread() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || (step_open_ && !failed_ && fetched_ < uses_.size() && may_gather(fetched_)); });
    if (stop_) return;
    const std::size_t i = fetched_;
    const bool ahead = !(i == next_use_ && waiting_);
    lk.unlock();
    status s;
    if (i == 0) s = gather_persistent();
    std::vector<std::pair<std::size_t, tensor>> got;
    for (std::size_t t : uses_[i].gather) {
      if (!s) break;
      auto g = gather_tensor(t);
      if (!g) s = g.err();
      else got.emplace_back(t, std::move(*g));
    }
    lk.lock();
    if (!s) {
      failed_ = s.err();
      cv_.notify_all();
      return;
    }
    for (auto& [t, v] : got) resident_[{i, t}] = std::move(v);
    live_ += uses_[i].gather_elements;
    stats_.peak_live_elements = std::max(stats_.peak_live_elements, live_);
    stats_.gathers += static_cast<std::int64_t>(got.size());
    stats_.gathered_elements += uses_[i].gather_elements;
    if (ahead) ++stats_.ahead;
    ++fetched_;
    cv_.notify_all();
  }
}

expected<tensor> param_fetcher::gather_tensor(std::size_t t) {
  const optim::flat_tensor& ft = layout_.tensors()[t];
  tensor out = tensor::empty(ft.shape, working_);
  const optim::flat_range mine = layout_.partition(rank_);
  for (std::uint32_t r = layout_.first_owner(t); r <= layout_.last_owner(t); ++r) {
    const optim::flat_range owned = layout_.partition(r);
    const std::int64_t lo = std::max(owned.lo, ft.offset), hi = std::min(owned.hi, ft.offset + ft.numel);
    if (hi <= lo) continue;
    if (r == rank_)
      if (auto read = store_->read(lo - mine.lo, hi - lo, at_element(out, lo - ft.offset)); !read)
        return make_error(read.err().code, "reading this rank's elements of {}: {}", ft.name, read.err().message);
    if (comm_->size() > 1)
      if (auto b = actors::log_collective(settings_.logger, "broadcast",
                                          (hi - lo) * static_cast<std::int64_t>(dtype_size(working_)), settings_.caller,
                                          [&] { return comm_->broadcast(at_element(out, lo - ft.offset), working_, hi - lo,
                                                                        static_cast<int>(r)); });
          !b)
        return make_error(b.err().code, "gathering {} (rank {}'s elements): {}", ft.name, r, b.err().message);
  }
  return out;
}

status param_fetcher::gather_persistent() {
  std::vector<std::pair<std::size_t, tensor>> whole;
  for (std::size_t t = 0; t < persistent_.size(); ++t)
    if (persistent_[t]) {
      DSA_ASSIGN_OR_RETURN(auto g, gather_tensor(t));
      whole.emplace_back(t, std::move(g));
    }
  std::lock_guard<std::mutex> lk(mu_);
  persistent_whole_ = std::move(whole);
  return {};
}

void param_fetcher::allow(std::uint32_t step) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    allowed_ = std::max<std::int64_t>(allowed_, step);
  }
  cv_.notify_all();
}

void param_fetcher::cancel() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

std::vector<std::pair<std::size_t, tensor>> param_fetcher::acquire(std::int64_t id, std::uint32_t step) {
  std::unique_lock<std::mutex> lk(mu_);
  if (failed_) throw std::runtime_error("ZeRO-3 parameter gather failed: " + failed_->message);
  if (cancelled_) throw std::runtime_error("ZeRO-3 parameter fetch: the run is ending");
  if (in_use_ || next_use_ >= uses_.size())
    throw std::runtime_error(fmt::format("ZeRO-3 parameter fetch: part {} asked for {}", id,
                                         in_use_ ? "while the previous part is still in use"
                                                 : "after the step's last use"));
  const std::size_t i = next_use_;
  if (parts_[uses_[i].part].id != id)
    throw std::runtime_error(fmt::format("ZeRO-3 parameter fetch out of order: use {} of the step is part {}, the "
                                         "model asked for part {} (every rank must run the same sequence)",
                                         i, parts_[uses_[i].part].id, id));
  if (i == 0) {
    if (writing_version_)
      throw std::runtime_error("ZeRO-3 parameter fetch: a step began while the shard writes the next version");
    // The step's gathers are collectives: only once every rank is known to run the step.
    cv_.wait(lk, [&] { return cancelled_ || allowed_ >= static_cast<std::int64_t>(step); });
    if (cancelled_) throw std::runtime_error("ZeRO-3 parameter fetch: the run is ending");
    step_open_ = true;
  }
  cv_.notify_all();
  if (fetched_ <= i) {
    ++stats_.waits;
    waiting_ = true;
    cv_.wait(lk, [&] { return failed_.has_value() || cancelled_ || fetched_ > i; });
    waiting_ = false;
  }
  if (cancelled_ && fetched_ <= i) throw std::runtime_error("ZeRO-3 parameter fetch: the run is ending");
  if (failed_) throw std::runtime_error("ZeRO-3 parameter gather failed: " + failed_->message);
  std::vector<std::pair<std::size_t, tensor>> out;
  if (i == 0) out = persistent_whole_;
  for (std::size_t t : uses_[i].gather) out.emplace_back(t, resident_.at({i, t}));
  in_use_ = true;
  ++next_use_;
  cv_.notify_all(); // the prefetch window moved
  return out;
}

std::vector<std::size_t> param_fetcher::release(std::int64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  DSA_CHECK(in_use_ && parts_[uses_[next_use_ - 1].part].id == id, "param fetcher: release of part {} not in use", id);
  const use_plan& u = uses_[next_use_ - 1];
  std::vector<std::size_t> out;
  for (const auto& [t, at] : u.free) {
    resident_.erase({at, t});
    out.push_back(t);
  }
  live_ -= u.free_elements;
  in_use_ = false;
  if (next_use_ == uses_.size()) { // the step's last use: the next step starts at its first acquire
    step_open_ = false;
    fetched_ = 0;
    next_use_ = 0;
  }
  cv_.notify_all();
  return out;
}

std::vector<tensor> param_fetcher::gather_all() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    // A run that ended inside a step (a failure) cannot gather: an error, not an abort.
    if (step_open_)
      throw std::runtime_error(fmt::format("gathering the ZeRO-3 weights after the run: the run ended during a "
                                           "step (use {} of {})", next_use_, uses_.size()));
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<tensor> out;
  for (std::size_t t = 0; t < layout_.tensors().size(); ++t) {
    auto g = gather_tensor(t);
    if (!g) throw std::runtime_error("gathering the ZeRO-3 weights after the run: " + g.err().message);
    out.push_back(std::move(*g));
  }
  return out;
}

std::int64_t param_fetcher::held_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  // The persistent tensors as gathered (before the first step: what they will take).
  std::int64_t persistent = 0;
  for (const auto& [t, v] : persistent_whole_) persistent += static_cast<std::int64_t>(v.nbytes());
  if (persistent_whole_.empty()) persistent = persistent_elements_ * static_cast<std::int64_t>(dtype_size(working_));
  return store_->resident_bytes() + persistent;
}

bool param_fetcher::wait_gathered(std::size_t uses, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return failed_.has_value() || (step_open_ && fetched_ >= uses); }) &&
         !failed_;
}

fetch_stats param_fetcher::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

} // namespace dsa::train
