// Embedding gather and scatter-add on CPU. The scatter splits columns across threads
// and adds tokens in order, so repeated ids accumulate without races or reordering. A half
// table's rows widen through cast's vector paths; the scatter loop (embedding_impl.inc) is
// compiled for the build's target and for AVX-512. Every path gives the same bits.
#include "kernels/cpu/embedding.hpp"

#include "core/error.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/isa.hpp"

#include <algorithm>
#include <cstring>

namespace dsa::cpu {
namespace {

constexpr std::int64_t parallel_threshold = 1 << 15;
// Columns per scatter work unit: four cache lines, so each token's slice is a
// contiguous stream and c = 768 still splits twelve ways.
constexpr std::int64_t column_block = 64;

void check_ids(const std::int32_t* ids, std::int64_t tokens, std::int64_t vocab, std::int64_t c) {
  DSA_CHECK(tokens >= 0 && vocab > 0 && c > 0, "embedding: bad sizes tokens={} vocab={} c={}",
            tokens, vocab, c);
  for (std::int64_t t = 0; t < tokens; ++t)
    DSA_CHECK(ids[t] >= 0 && ids[t] < vocab, "embedding: ids[{}]={} outside [0, {})", t, ids[t],
              vocab);
}

} // namespace

namespace embedding_base {
#include "kernels/cpu/embedding_impl.inc"
} // namespace embedding_base

DSA_AVX512_REGION_BEGIN
namespace embedding_avx512 {
#include "kernels/cpu/embedding_impl.inc"
} // namespace embedding_avx512
DSA_AVX512_REGION_END

void embedding_forward(float* y, const float* table, const std::int32_t* ids, std::int64_t tokens,
                       std::int64_t vocab, std::int64_t c) {
  check_ids(ids, tokens, vocab, c);
  const auto row_bytes = static_cast<std::size_t>(c) * sizeof(float);
#pragma omp parallel for schedule(static) if (tokens * c >= parallel_threshold)
  for (std::int64_t t = 0; t < tokens; ++t)
    std::memcpy(y + t * c, table + ids[t] * c, row_bytes);
}

void embedding_forward(float* y, const void* table, dtype table_type, const std::int32_t* ids,
                       std::int64_t tokens, std::int64_t vocab, std::int64_t c) {
  embedding_forward(active_isa(), y, table, table_type, ids, tokens, vocab, c);
}

void embedding_forward(isa path, float* y, const void* table, dtype table_type, const std::int32_t* ids,
                       std::int64_t tokens, std::int64_t vocab, std::int64_t c) {
  check_path(path, "embedding");
  if (table_type == dtype::f32) {
    embedding_forward(y, static_cast<const float*>(table), ids, tokens, vocab, c);
    return;
  }
  DSA_CHECK(table_type == dtype::f16 || table_type == dtype::bf16,
            "embedding: a {} table; expected f32, f16 or bf16", dtype_name(table_type));
  check_ids(ids, tokens, vocab, c);
  const auto* rows = static_cast<const std::uint16_t*>(table);
#pragma omp parallel for schedule(static) if (tokens * c >= parallel_threshold)
  for (std::int64_t t = 0; t < tokens; ++t)
    cast(path, y + t * c, dtype::f32, rows + ids[t] * c, table_type, c);
}

void embedding_backward(float* dtable, const float* dy, const std::int32_t* ids, std::int64_t tokens,
                        std::int64_t vocab, std::int64_t c) {
  embedding_backward(active_isa(), dtable, dy, ids, tokens, vocab, c);
}

void embedding_backward(isa path, float* dtable, const float* dy, const std::int32_t* ids, std::int64_t tokens,
                        std::int64_t vocab, std::int64_t c) {
  check_path(path, "embedding");
  check_ids(ids, tokens, vocab, c);
  const std::int64_t blocks = (c + column_block - 1) / column_block;
#pragma omp parallel for schedule(static) if (tokens * c >= parallel_threshold)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t j0 = b * column_block, j1 = std::min(c, j0 + column_block);
    if (path == isa::avx512)
      embedding_avx512::scatter_columns(dtable, dy, ids, tokens, c, j0, j1);
    else
      embedding_base::scatter_columns(dtable, dy, ids, tokens, c, j0, j1);
  }
}

} // namespace dsa::cpu
