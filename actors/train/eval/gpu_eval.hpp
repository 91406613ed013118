// The end-of-run evaluation on the run's GPU (CUDA builds only): the whole model's
// parameters uploaded once into a GPU BERT (models/bert/cuda_part.hpp), then forward-only
// batches in eval mode (no dropout) on a stream of its own; each batch's losses or SQuAD
// logits come back to the host. What a dev set needs: the CPU twin (cpu_eval_forward)
// rebuilds nothing per batch either, but runs at CPU speed.
#pragma once

#include "actors/train/eval/evaluation.hpp"
#include "core/dtype.hpp"
#include "models/bert/bert_parameters.hpp"

namespace dsa::train {

// An eval_forward on cuda:device with `whole`'s values (any of f32, f16, bf16) copied to
// the device, its products in `working` (the run's working precision). Construction
// throws std::runtime_error naming what failed (no device memory, a CUDA error); each
// call returns such failures as errors. The model holds the device copy until the last
// copy of the function is gone.
eval_forward gpu_eval_forward(const bert::bert_parameters& whole, int device, dtype working);

} // namespace dsa::train
