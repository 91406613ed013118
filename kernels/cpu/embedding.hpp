// Embedding gather (forward) and scatter-add (backward).
#pragma once

#include <cstdint>

namespace dsa::cpu {

// y: (tokens, c) = table[ids[t]]; table: (vocab, c). Every id must be in [0, vocab).
void embedding_forward(float* y, const float* table, const std::int32_t* ids, std::int64_t tokens,
                       std::int64_t vocab, std::int64_t c);
// dtable: (vocab, c) += scatter of dy: (tokens, c) by ids. Deterministic order.
void embedding_backward(float* dtable, const float* dy, const std::int32_t* ids, std::int64_t tokens,
                        std::int64_t vocab, std::int64_t c);

} // namespace dsa::cpu
