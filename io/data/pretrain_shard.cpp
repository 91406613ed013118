// Pre-training shard write (pad into int32 tensors) and read (validate, unpad).
#include "io/data/pretrain_shard.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

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

} // namespace

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
  meta["count"] = std::to_string(end - begin);
  return ckpt::write_safetensors(path, pack_instances(instances, begin, end, layout), meta);
}

expected<pretrain_shard> pretrain_shard::load(const std::string& path) {
  pretrain_shard s;
  DSA_ASSIGN_OR_RETURN(s.file_, ckpt::read_safetensors(path));
  const auto& meta = s.file_.metadata;
  auto format = meta.find("format");
  if (format == meta.end() || format->second != pretrain_shard_format)
    return make_error(errc::format,
                      "'{}' is not a pre-training shard (metadata format is not '{}')", path,
                      pretrain_shard_format);
  DSA_ASSIGN_OR_RETURN(std::int64_t t, meta_int(path, meta, "seq_length"));
  DSA_ASSIGN_OR_RETURN(std::int64_t p, meta_int(path, meta, "max_predictions"));
  DSA_ASSIGN_OR_RETURN(std::int64_t v, meta_int(path, meta, "vocab_size"));
  DSA_ASSIGN_OR_RETURN(s.count_, meta_int(path, meta, "count"));
  s.layout_ = shard_layout{static_cast<int>(t), static_cast<int>(p), static_cast<std::int32_t>(v)};
  const std::int64_t b = s.count_;
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
  inst.next_sentence_label = ts.at("next_sentence_labels").data<std::int32_t>()[i];
  return inst;
}

} // namespace dsa::data
