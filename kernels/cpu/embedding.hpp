// Embedding gather (forward) and scatter-add (backward).
#pragma once

#include "core/dtype.hpp"
#include "kernels/cpu/isa.hpp"

#include <cstdint>

namespace dsa::cpu {

// y: (tokens, c) = table[ids[t]]; table: (vocab, c). Every id must be in [0, vocab).
void embedding_forward(float* y, const float* table, const std::int32_t* ids, std::int64_t tokens,
                       std::int64_t vocab, std::int64_t c);
// The same gather from a table of table_type (f32, f16 or bf16), each row widened to f32
// (exactly: every f16/bf16 value is an f32 value).
void embedding_forward(float* y, const void* table, dtype table_type, const std::int32_t* ids,
                       std::int64_t tokens, std::int64_t vocab, std::int64_t c);
// dtable: (vocab, c) += scatter of dy: (tokens, c) by ids. Deterministic order.
void embedding_backward(float* dtable, const float* dy, const std::int32_t* ids, std::int64_t tokens,
                        std::int64_t vocab, std::int64_t c);

// The same on a given vector path (kernels/cpu/isa.hpp; at most the CPU's best): every path
// gives the same bits.
void embedding_forward(isa path, float* y, const void* table, dtype table_type, const std::int32_t* ids,
                       std::int64_t tokens, std::int64_t vocab, std::int64_t c);
void embedding_backward(isa path, float* dtable, const float* dy, const std::int32_t* ids, std::int64_t tokens,
                        std::int64_t vocab, std::int64_t c);

} // namespace dsa::cpu
