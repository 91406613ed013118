// Pre-training shard write (pad into int32 tensors) and read (validate, unpad).
#include "io/data/pretrain_shard.hpp"

#include "core/log.hpp"

#include <sys/mman.h>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <utility>

namespace dsa::data {
namespace {

expected<std::int64_t> meta_int(const std::string& path, const ckpt::metadata_map& meta,
                                const std::string& key) {
  auto it = meta.find(key);
  if (it == meta.end())
    return make_error(errc::format, "shard '{}': metadata has no '{}'", path, key);
  std::int64_t v = 0;
  const char* end = it->second.data() + it->second.size();
  auto r = std::from_chars(it->second.data(), end, v);
  if (r.ec != std::errc{} || r.ptr != end || v < 0)
    return make_error(errc::format, "shard '{}': metadata '{}' = '{}' is not a count", path, key,
                      it->second);
  return v;
}

// A token id that older shards do not record: -1 when absent.
expected<std::int32_t> meta_id(const std::string& path, const ckpt::metadata_map& meta,
                               const std::string& key, std::int64_t vocab_size) {
  if (meta.find(key) == meta.end())
    return -1;
  DSA_ASSIGN_OR_RETURN(std::int64_t id, meta_int(path, meta, key));
  if (id >= vocab_size)
    return make_error(errc::format,
                      "shard '{}': metadata '{}' = {} is outside the vocabulary of {}", path, key,
                      id, vocab_size);
  return static_cast<std::int32_t>(id);
}

constexpr std::pair<const char*, std::int32_t shard_vocab_info::*> special_ids[] = {
    {"cls_id", &shard_vocab_info::cls_id},
    {"sep_id", &shard_vocab_info::sep_id},
    {"mask_id", &shard_vocab_info::mask_id},
    {"pad_id", &shard_vocab_info::pad_id}};

} // namespace

bool shard_vocab_info::operator==(const shard_vocab_info& o) const {
  return cls_id == o.cls_id && sep_id == o.sep_id && mask_id == o.mask_id && pad_id == o.pad_id &&
         fingerprint == o.fingerprint;
}

shard_vocab_info shard_vocab_of(const tok::vocab& v) {
  shard_vocab_info info;
  info.cls_id = v.contains("[CLS]") ? v.cls_id() : -1;
  info.sep_id = v.contains("[SEP]") ? v.sep_id() : -1;
  info.mask_id = v.contains("[MASK]") ? v.mask_id() : -1;
  info.pad_id = v.contains("[PAD]") ? v.pad_id() : -1;
  std::uint64_t h = 0xCBF29CE484222325ull; // FNV-1a 64
  for (const auto& token : v.tokens()) {
    for (unsigned char c : token)
      h = (h ^ c) * 0x100000001B3ull;
    h = (h ^ static_cast<unsigned char>('\n')) * 0x100000001B3ull;
  }
  info.fingerprint = fmt::format("{:016x}", h);
  return info;
}

expected<shard_header> read_shard_header(const std::string& path, const ckpt::metadata_map& meta) {
  auto format = meta.find("format");
  if (format == meta.end() || format->second != pretrain_shard_format)
    return make_error(errc::format,
                      "'{}' is not a pre-training shard (metadata format is not '{}')", path,
                      pretrain_shard_format);
  DSA_ASSIGN_OR_RETURN(std::int64_t t, meta_int(path, meta, "seq_length"));
  DSA_ASSIGN_OR_RETURN(std::int64_t p, meta_int(path, meta, "max_predictions"));
  DSA_ASSIGN_OR_RETURN(std::int64_t v, meta_int(path, meta, "vocab_size"));
  shard_header h;
  DSA_ASSIGN_OR_RETURN(h.count, meta_int(path, meta, "count"));
  h.layout =
      shard_layout{static_cast<int>(t), static_cast<int>(p), static_cast<std::int32_t>(v), {}};
  for (const auto& [key, member] : special_ids) {
    DSA_ASSIGN_OR_RETURN(h.layout.vocab.*member, meta_id(path, meta, key, v));
  }
  if (auto it = meta.find("vocab_fingerprint"); it != meta.end())
    h.layout.vocab.fingerprint = it->second;
  return h;
}

status check_shard_vocab(const shard_layout& layout, const std::string& shard_path,
                         const tok::vocab& v, const std::string& vocab_path) {
  auto differ = [&](const std::string& what) {
    return make_error(errc::config,
                      "the vocabulary {} is not the one the shard {} was written with: {}",
                      vocab_path, shard_path, what);
  };
  if (v.size() != layout.vocab_size)
    return differ(fmt::format("{} tokens in {}, vocab_size {} in the shard", v.size(), vocab_path,
                              layout.vocab_size));
  const shard_vocab_info mine = shard_vocab_of(v);
  for (const auto& [key, member] : special_ids)
    if (layout.vocab.*member >= 0 && layout.vocab.*member != mine.*member)
      return differ(fmt::format("{} is {} in {}, {} in the shard", key, mine.*member, vocab_path,
                                layout.vocab.*member));
  if (!layout.vocab.fingerprint.empty() && layout.vocab.fingerprint != mine.fingerprint)
    return differ(fmt::format("the tokens differ (vocab_fingerprint {} of {}, {} in the shard)",
                              mine.fingerprint, vocab_path, layout.vocab.fingerprint));
  return {};
}

std::string shard_file_name(const std::string& prefix, std::int64_t index) {
  return fmt::format("{}-{:05d}.safetensors", prefix, index);
}

ckpt::named_tensors pack_instances(const std::vector<pretrain_instance>& instances,
                                   std::size_t begin, std::size_t end, const shard_layout& layout) {
  const auto b = static_cast<std::int64_t>(end - begin);
  const std::int64_t t = layout.seq_length, p = layout.max_predictions;
  ckpt::named_tensors out;
  for (const char* name : {"input_ids", "token_type_ids", "attention_mask"})
    out[name] = tensor::zeros({b, t}, dtype::i32);
  out["masked_lm_positions"] = tensor::zeros({b, p}, dtype::i32);
  out["masked_lm_ids"] = tensor::empty({b, p}, dtype::i32);
  out["next_sentence_labels"] = tensor::zeros({b}, dtype::i32);
  auto* ids = out["input_ids"].data<std::int32_t>();
  auto* types = out["token_type_ids"].data<std::int32_t>();
  auto* mask = out["attention_mask"].data<std::int32_t>();
  auto* positions = out["masked_lm_positions"].data<std::int32_t>();
  auto* labels = out["masked_lm_ids"].data<std::int32_t>();
  auto* nsp = out["next_sentence_labels"].data<std::int32_t>();
  std::fill(labels, labels + b * p, -1);
  for (std::int64_t r = 0; r < b; ++r) {
    const pretrain_instance& inst = instances[begin + static_cast<std::size_t>(r)];
    DSA_CHECK(static_cast<std::int64_t>(inst.input_ids.size()) <= t,
              "instance of {} tokens in a shard of length {}", inst.input_ids.size(), t);
    DSA_CHECK(static_cast<std::int64_t>(inst.masked_lm_positions.size()) <= p,
              "instance with {} predictions in a shard of {}", inst.masked_lm_positions.size(), p);
    std::copy(inst.input_ids.begin(), inst.input_ids.end(), ids + r * t);
    std::copy(inst.token_type_ids.begin(), inst.token_type_ids.end(), types + r * t);
    std::fill(mask + r * t, mask + r * t + static_cast<std::int64_t>(inst.input_ids.size()), 1);
    std::copy(inst.masked_lm_positions.begin(), inst.masked_lm_positions.end(), positions + r * p);
    std::copy(inst.masked_lm_ids.begin(), inst.masked_lm_ids.end(), labels + r * p);
    nsp[r] = inst.next_sentence_label;
  }
  return out;
}

status write_pretrain_shard(const std::string& path,
                            const std::vector<pretrain_instance>& instances, std::size_t begin,
                            std::size_t end, const shard_layout& layout,
                            const ckpt::metadata_map& extra) {
  ckpt::metadata_map meta = extra;
  meta["format"] = pretrain_shard_format;
  meta["seq_length"] = std::to_string(layout.seq_length);
  meta["max_predictions"] = std::to_string(layout.max_predictions);
  meta["vocab_size"] = std::to_string(layout.vocab_size);
  for (const auto& [key, member] : special_ids)
    if (layout.vocab.*member >= 0)
      meta[key] = std::to_string(layout.vocab.*member);
  if (!layout.vocab.fingerprint.empty())
    meta["vocab_fingerprint"] = layout.vocab.fingerprint;
  meta["count"] = std::to_string(end - begin);
  return ckpt::write_safetensors(path, pack_instances(instances, begin, end, layout), meta);
}

namespace {

// The mapping every tensor of `file` views (map_safetensors), or null when they were read.
const storage* mapping_of(const ckpt::safetensors_file& file) {
  if (file.tensors.empty()) return nullptr;
  const auto& first = file.tensors.begin()->second.storage_ptr();
  for (const auto& [name, t] : file.tensors)
    if (t.storage_ptr() != first) return nullptr;
  return first && first->bytes() > 0 ? first.get() : nullptr;
}

} // namespace

expected<pretrain_shard> pretrain_shard::load(const std::string& path) {
  pretrain_shard s;
  // Mapped, not read: the rows stay in the page cache, which the kernel may drop, so the
  // shards a reader keeps open do not hold the data set in anonymous memory.
  DSA_ASSIGN_OR_RETURN(s.file_, ckpt::map_safetensors(path));
  // Rows are read in shuffled order: no read-ahead around each one.
  if (const storage* m = mapping_of(s.file_))
    (void)::madvise(m->data(), m->bytes(), MADV_RANDOM);
  else if (!s.file_.tensors.empty())
    log_warn("shard '{}' could not be mapped and was read into memory: it stays resident until the reader "
             "closes it, beyond the host-memory plan's bound for the reader", path);
  DSA_ASSIGN_OR_RETURN(shard_header header, read_shard_header(path, s.file_.metadata));
  s.layout_ = header.layout;
  s.count_ = header.count;
  const std::int64_t b = s.count_, t = s.layout_.seq_length, p = s.layout_.max_predictions;
  DSA_TRY(ckpt::check_tensors(path, s.file_.tensors,
                              {{"input_ids", {{b, t}, dtype::i32}},
                               {"token_type_ids", {{b, t}, dtype::i32}},
                               {"attention_mask", {{b, t}, dtype::i32}},
                               {"masked_lm_positions", {{b, p}, dtype::i32}},
                               {"masked_lm_ids", {{b, p}, dtype::i32}},
                               {"next_sentence_labels", {{b}, dtype::i32}}}));
  DSA_TRY(s.check_rows(path));
  return s;
}

status pretrain_shard::check_rows(const std::string& path) const {
  const std::int64_t t = layout_.seq_length, p = layout_.max_predictions;
  const auto& ts = file_.tensors;
  const auto* mask = ts.at("attention_mask").data<std::int32_t>();
  const auto* positions = ts.at("masked_lm_positions").data<std::int32_t>();
  const auto* labels = ts.at("masked_lm_ids").data<std::int32_t>();
  const auto* nsp = ts.at("next_sentence_labels").data<std::int32_t>();
  for (std::int64_t i = 0; i < count_; ++i) {
    if (i % 1024 == 1023) release_pages(); // the check reads every page: not all at once
    std::int64_t length = 0;
    while (length < t && mask[i * t + length] == 1)
      ++length;
    for (std::int64_t k = length; k < t; ++k)
      if (mask[i * t + k] != 0)
        return make_error(errc::format, "shard '{}': row {} attention_mask is not ones then zeros",
                          path, i);
    bool padding = false;
    for (std::int64_t k = 0; k < p; ++k) {
      std::int32_t id = labels[i * p + k], pos = positions[i * p + k];
      if (id < 0) {
        padding = true;
        continue;
      }
      if (padding || id >= layout_.vocab_size || pos < 0 || pos >= length)
        return make_error(errc::format,
                          "shard '{}': row {} masked_lm entry {} (position {}, id {}) is invalid",
                          path, i, k, pos, id);
    }
    if (nsp[i] != 0 && nsp[i] != 1)
      return make_error(errc::format, "shard '{}': row {} next_sentence_label {} is not 0 or 1",
                        path, i, nsp[i]);
  }
  return {};
}


void pretrain_shard::release_pages() const {
  if (const storage* m = mapping_of(file_)) (void)::madvise(m->data(), m->bytes(), MADV_DONTNEED);
}

// The pages around [p, p + bytes) leave the process (they stay in the page cache): a read
// fault maps up to 64 KiB around the faulting page (the kernel's fault-around), so the
// window dropped is the aligned row_window_bytes around the slice, within the mapping.
static void drop_window(const storage* mapping, const void* p, std::size_t bytes) {
  const auto base = reinterpret_cast<std::uintptr_t>(mapping->data());
  const auto end = base + mapping->bytes();
  const auto w = static_cast<std::uintptr_t>(pretrain_shard::row_window_bytes);
  const auto lo = std::max(base, reinterpret_cast<std::uintptr_t>(p) / w * w);
  const auto hi = std::min(end, (reinterpret_cast<std::uintptr_t>(p) + bytes + w - 1) / w * w);
  const std::uintptr_t page = 4096;
  const auto lo_page = lo / page * page; // madvise wants a page-aligned start
  if (hi > lo_page) (void)::madvise(reinterpret_cast<void*>(lo_page), hi - lo_page, MADV_DONTNEED);
}

pretrain_instance pretrain_shard::row(std::int64_t i) const {
  DSA_CHECK(i >= 0 && i < count_, "row {} of a shard of {}", i, count_);
  const std::int64_t t = layout_.seq_length, p = layout_.max_predictions;
  const auto& ts = file_.tensors;
  const auto* ids = ts.at("input_ids").data<std::int32_t>() + i * t;
  const auto* types = ts.at("token_type_ids").data<std::int32_t>() + i * t;
  const auto* mask = ts.at("attention_mask").data<std::int32_t>() + i * t;
  const auto* positions = ts.at("masked_lm_positions").data<std::int32_t>() + i * p;
  const auto* labels = ts.at("masked_lm_ids").data<std::int32_t>() + i * p;
  std::int64_t length = 0;
  while (length < t && mask[length])
    ++length;
  std::int64_t predictions = 0;
  while (predictions < p && labels[predictions] >= 0)
    ++predictions;
  pretrain_instance inst;
  inst.input_ids.assign(ids, ids + length);
  inst.token_type_ids.assign(types, types + length);
  inst.masked_lm_positions.assign(positions, positions + predictions);
  inst.masked_lm_ids.assign(labels, labels + predictions);
  const auto* nsp = ts.at("next_sentence_labels").data<std::int32_t>() + i;
  inst.next_sentence_label = *nsp;
  // A mapped shard gives the row's pages back at once: the resident set holds one row's
  // windows, whatever the shard's or the data set's size.
  if (const storage* m = mapping_of(file_)) {
    const auto row_bytes = static_cast<std::size_t>(t) * 4, prediction_bytes = static_cast<std::size_t>(p) * 4;
    for (const auto* slice : {ids, types, mask}) drop_window(m, slice, row_bytes);
    for (const auto* slice : {positions, labels}) drop_window(m, slice, prediction_bytes);
    drop_window(m, nsp, 4);
  }
  return inst;
}

} // namespace dsa::data
