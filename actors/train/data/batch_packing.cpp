// Packing micro-batches into the runtime's input and label tensors.
#include "actors/train/data/batch_packing.hpp"

#include <cstring>

namespace dsa::train {
namespace {

void copy_i32(std::int32_t* dst, const tensor& src, std::int64_t n) {
  DSA_CHECK(src.numel() == n && src.is_contiguous(), "packing {}: expected {} elements", src.describe(), n);
  if (src.type() == dtype::i32) {
    std::memcpy(dst, src.raw_data(), static_cast<std::size_t>(n) * 4);
  } else {
    DSA_CHECK(src.type() == dtype::f32, "packing {}: expected i32 or f32", src.describe());
    const float* s = src.data<float>();
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<std::int32_t>(s[i]);
  }
}

tensor i32_rows(const std::int32_t* src, std::int64_t rows, std::int64_t cols, std::int64_t stride, std::int64_t offset) {
  tensor t = tensor::empty({rows, cols}, dtype::i32);
  for (std::int64_t r = 0; r < rows; ++r)
    std::memcpy(t.data<std::int32_t>() + r * cols, src + r * stride + offset, static_cast<std::size_t>(cols) * 4);
  return t;
}

} // namespace

tensor pack_inputs(const bert::bert_batch& b) {
  const std::int64_t B = b.batch_size(), T = b.seq_length(), n = B * T;
  tensor out = tensor::empty({3, B, T}, dtype::i32);
  std::int32_t* p = out.data<std::int32_t>();
  copy_i32(p, b.input_ids, n);
  if (b.token_type_ids.defined()) copy_i32(p + n, b.token_type_ids, n);
  else std::memset(p + n, 0, static_cast<std::size_t>(n) * 4);
  if (b.attention_mask.defined()) copy_i32(p + 2 * n, b.attention_mask, n);
  else for (std::int64_t i = 0; i < n; ++i) p[2 * n + i] = 1;
  return out;
}

void unpack_inputs(const tensor& packed, bert::bert_batch& out) {
  DSA_CHECK(packed.ndim() == 3 && packed.dim(0) == 3 && packed.type() == dtype::i32, "packed input {}",
            packed.describe());
  const std::int64_t B = packed.dim(1), T = packed.dim(2), n = B * T;
  out.input_ids = packed.slice_rows(0, 1).reshape({B, T});
  out.token_type_ids = packed.slice_rows(1, 2).reshape({B, T});
  out.attention_mask = tensor::empty({B, T}, dtype::f32);
  const std::int32_t* m = packed.data<std::int32_t>() + 2 * n;
  for (std::int64_t i = 0; i < n; ++i) out.attention_mask.data<float>()[i] = static_cast<float>(m[i]);
}

tensor pack_labels(const bert::bert_batch& b, bert::head_kind head) {
  const std::int64_t B = b.batch_size();
  if (head == bert::head_kind::squad) {
    tensor out = tensor::empty({B, 2}, dtype::i32);
    for (std::int64_t r = 0; r < B; ++r) {
      out.data<std::int32_t>()[2 * r] = b.start_positions.data<std::int32_t>()[r];
      out.data<std::int32_t>()[2 * r + 1] = b.end_positions.data<std::int32_t>()[r];
    }
    return out;
  }
  const std::int64_t P = b.masked_lm_positions.dim(1);
  tensor out = tensor::empty({B, 2 * P + 1}, dtype::i32);
  for (std::int64_t r = 0; r < B; ++r) {
    std::int32_t* row = out.data<std::int32_t>() + r * (2 * P + 1);
    std::memcpy(row, b.masked_lm_positions.data<std::int32_t>() + r * P, static_cast<std::size_t>(P) * 4);
    std::memcpy(row + P, b.masked_lm_ids.data<std::int32_t>() + r * P, static_cast<std::size_t>(P) * 4);
    row[2 * P] = b.next_sentence_labels.data<std::int32_t>()[r];
  }
  return out;
}

void unpack_labels(const tensor& packed, bert::head_kind head, bert::bert_batch& out) {
  DSA_CHECK(packed.ndim() == 2 && packed.type() == dtype::i32, "packed labels {}", packed.describe());
  const std::int64_t B = packed.dim(0), W = packed.dim(1);
  const std::int32_t* p = packed.data<std::int32_t>();
  if (head == bert::head_kind::squad) {
    out.start_positions = i32_rows(p, B, 1, W, 0).reshape({B});
    out.end_positions = i32_rows(p, B, 1, W, 1).reshape({B});
    return;
  }
  const std::int64_t P = (W - 1) / 2;
  out.masked_lm_positions = i32_rows(p, B, P, W, 0);
  out.masked_lm_ids = i32_rows(p, B, P, W, P);
  out.next_sentence_labels = i32_rows(p, B, 1, W, 2 * P).reshape({B});
}

} // namespace dsa::train
