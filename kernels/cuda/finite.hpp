// Loss-scaler support on the GPU: unscale gradients and detect inf/NaN in one pass.
#pragma once

#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// grad: (n) of `type`, multiplied in place by inv_scale (skipped when inv_scale == 1).
// *found_nonfinite (device int) is set to 1 when any input element is inf or NaN and is
// otherwise left as it was, so one flag can cover several buffers; the caller zeroes it
// first and reads it back through a copy on the same stream.
cudaError_t unscale_and_check(void* grad, int* found_nonfinite, float inv_scale, elem type,
                              std::int64_t n, cudaStream_t stream);

} // namespace dsa::cuda
