// The one table of numerical tolerances, each with its reason. Tests name an
// entry; they never write a bare number.
#pragma once

namespace dsa::test {

struct tolerance {
  double abs;
  double rel;
  const char* reason;
};

// f32 kernel vs double reference, reductions of length <= ~4096: a few ulps
// of accumulated rounding per term.
inline constexpr tolerance f32_kernel{1e-5, 1e-4, "f32 accumulation vs double reference"};
// f32 GEMM through OpenBLAS vs double reference: k-term dot products, blocked summation order.
inline constexpr tolerance f32_gemm{1e-4, 1e-4, "blocked f32 dot products of length k <= 4096"};
// Finite differences in double of a double-precision forward: O(h^2) truncation, h = 1e-6.
inline constexpr tolerance finite_diff{1e-6, 1e-5, "central differences, h=1e-6, double forward"};
// Finite differences through f32 kernels: roundoff eps_f32/h dominates.
inline constexpr tolerance finite_diff_f32{2e-3, 2e-2, "central differences of an f32 forward, h=1e-2"};
// Whole-model BERT gradients vs central differences (h = 1e-2) of its f32 forward
// (tests/models): truncation plus f32 loss roundoff / 2h, measured <= 1.1e-4 abs and
// <= 4.3e-3 rel on the small test model with weights ~ N(0, 0.3); ~2x margin.
inline constexpr tolerance finite_diff_model{2.5e-4, 1e-2, "central differences of the f32 BERT forward, h=1e-2"};
// f16 round trip: half an ulp of a 10-bit mantissa.
inline constexpr tolerance f16_roundtrip{0.0, 4.9e-4, "RNE to 11 significant bits"};
// bf16 round trip: half an ulp of an 8-bit significand.
inline constexpr tolerance bf16_roundtrip{0.0, 3.9e-3, "RNE to 8 significant bits"};
// Gradients of a BERT backward from activations stashed in f16 / bf16 vs the same
// backward from f32 stashes (tests/models/test_bert_precision.cpp, small model with
// weights ~ N(0, 0.3), dropout on): each stashed value carries its rounding (2^-11 and
// 2^-8 relative) into products through softmax, GELU and LayerNorm backward; gradients
// near zero see it as absolute error. Measured max abs 2.8e-4 (f16) and 4.3e-3 (bf16)
// over both LayerNorm placements, both heads and all memory flags; ~2x margin.
inline constexpr tolerance f16_stash{6e-4, 1e-2, "activations rounded to 11 significant bits"};
inline constexpr tolerance bf16_stash{9e-3, 8e-2, "activations rounded to 8 significant bits"};
// Per-step losses of 5 steps of a run in fp16 / bf16 vs the same run in fp32
// (tests/train/test_run_precision.cpp, tiny model, dropout off): weights and stash
// rounded to the working precision. Measured max rel 1.3e-5 (f16), 1.3e-4 (bf16).
inline constexpr tolerance f16_run_loss{0.0, 5e-5, "f16 weights and stash, 5 steps"};
inline constexpr tolerance bf16_run_loss{0.0, 5e-4, "bf16 weights and stash, 5 steps"};
// The same with every GEMM's operands rounded to bf16 too (bf16.cpu_gemm, oneDNN). Measured
// max rel 1.4e-4 (Intel Xeon with AMX).
inline constexpr tolerance bf16_gemm_run_loss{0.0, 1e-3, "bf16 GEMM operands, weights and stash, 5 steps"};
// fp32 master weights after those 5 Adam steps (lr 1e-3): where a gradient is near
// zero, m/sqrt(v) is +-1 in either run, so a weight may differ by up to 2 lr per step;
// measured max abs 2.0e-3 (f16) and 2.6e-3 (bf16). Bound: 5 lr.
inline constexpr tolerance half_run_masters{5e-3, 0.0,
                                            "Adam steps of size lr where gradients are near zero"};
// Same computation, different but exact recompute path (memory flags): identical up to
// reassociation inside a vectorized reduction.
inline constexpr tolerance recompute{1e-6, 1e-5, "recomputed activations, reassociated sums"};
// LayerNorm backward from the output (normalize_invertible): xhat = (y - beta) / gamma is
// rebuilt from the f32-rounded y, an error of ~eps_f32 * |y| / |gamma| per element
// (|gamma| >= 0.5 in the tests) that the usual backward from x does not have; measured
// <= 1.5e-6 abs for c <= 1024, rows <= 67 (dgamma sums), so f32-kernel bounds hold.
inline constexpr tolerance layernorm_invertible{1e-5, 1e-4, "xhat rebuilt from rounded y"};
// Pipeline layouts vs one stage: the same kernels on the same rows; gradient sums over
// micro-batches are added in the same order, so differences come only from tied-weight
// gradient addition order.
inline constexpr tolerance layout_equivalence{1e-6, 1e-5, "tied-embedding gradient sum order"};
// The same after 1-bit Adam's or 0/1 Adam's variance freeze: each update divides the
// momentum by the frozen sqrt(v), so the tied gradient's last-bit differences grow where v
// is tiny. Measured between uninterrupted runs on 1 and 2 stages of the tiny model: 3 of
// 46,540 parameters beyond layout_equivalence, the worst 2.4e-5 absolute, 5.6e-4 relative.
inline constexpr tolerance layout_after_freeze{1e-4, 2e-3, "tied gradient sum order through a frozen variance"};
// Parameters after a few Adam steps in fp16 with R data-parallel ranks vs one: each
// rank rounds its partial gradient sum to fp16 before the ranks add them (one rank
// rounds the whole sum once). Adam divides by sqrt(v), so a half-ulp difference in a
// tiny gradient moves its parameter by up to lr per step. Measured: largest
// difference 2.8e-4 after 5 steps at lr 1e-3 on 2 ranks (test_run_data_parallel.cpp).
inline constexpr tolerance data_parallel_fp16{1e-3, 0, "per-rank fp16 rounding of partial gradient sums"};
// ZeRO stage 3 vs stage 0 after a few steps: stage 3 sums each micro-batch's gradients
// over the ranks (rounded to the working precision first) and accumulates the sums over
// micro-batches, where stage 0 accumulates each rank's micro-batches and sums over ranks
// once; and it adds the ranks' partial sums of squares for the norm. Only the rounding
// order differs; Adam's division by sqrt(v) lets a one-ulp difference in a tiny
// gradient move its parameter by up to lr per step (as data_parallel_fp16). Measured:
// largest difference 9.6e-5 after 5 steps at lr 1e-3 on 2 and 4 ranks, AdamW, LAMB and
// fp16 (tests/train/test_run_zero3.cpp).
inline constexpr tolerance zero3_reduction_order{3e-4, 0, "gradient sum order: per micro-batch over ranks first"};
// The same runs' Adam/LAMB first moments (exp_avg, which keep the gradients' scale and
// sign where the updates do not): measured up to 3.9e-7 absolute, relative errors up to
// 0.96 only where an element's sum cancels to near 0 (below 4e-9 absolute there).
// A gradient off by a factor of 2 or in sign breaks the relative bound at every element
// above 1e-6.
inline constexpr tolerance zero3_first_moments{1e-6, 1e-2, "gradient sum order, first moments"};
// The same in fp16: each micro-batch's gradient is rounded to fp16 before the sum over
// ranks (stage 0 rounds each rank's accumulated sum once), so where micro-batch terms
// cancel an element's relative error grows: measured up to 8.8e-6 absolute (4.5% of an
// element of 4e-5) on 2 ranks with ZeRO-2; a doubled gradient still moves typical
// elements (~4e-4) by far more.
inline constexpr tolerance zero_fp16_first_moments{1e-5, 1e-2, "gradient sum order with fp16 rounding, first moments"};
// Elementwise math vs the double libm function, in units in the last place of the float
// nearest the exact result (subnormal results: in units of the smallest subnormal).
struct ulp_tolerance {
  double ulps;
  const char* reason;
};
// Vectorized erf (kernels/cpu/vec_math.hpp) vs std::erf in double: measured <= 1.02 ulp with
// FMA and <= 1.27 without (polynomial fits, exp, and the rounding of 1 - exp); margin to 2.
inline constexpr ulp_tolerance erf_f32{2.0, "fitted erf polynomials, 1 - exp(q) rounding"};
// Collective sums (io/net) vs a double sum over ranks rounded to f32 and then to the dtype;
// inputs in [-1, 1), at most 5 ranks. The fp32 accumulation of N terms in the ring's order
// errs by at most (N-1) u sum|x| <= 4 * 6e-8 * 5 = 1.2e-6 absolute; the result and the
// reference each round once to the dtype, so they may sit one ulp of it apart (2 x half an
// ulp relative). Ranks agree with each other exactly: that is checked bit for bit.
inline constexpr tolerance collective_sum_f32{2e-6, 0.0,
                                              "fp32 sum of <= 5 terms in |x| < 1, ring order"};
inline constexpr tolerance collective_sum_f16{2e-6, 9.8e-4, "fp32 sum, one f16 rounding each side"};
inline constexpr tolerance collective_sum_bf16{2e-6, 7.8e-3,
                                               "fp32 sum, one bf16 rounding each side"};
// Optimizer kernels vs double reference over a few steps.
inline constexpr tolerance optimizer_step{1e-6, 1e-5, "f32 vs double optimizer arithmetic, few steps"};

// GPU kernels vs their CPU twin (the same kernels/common math run serially on the host).
// Elementwise f32: CUDA's erff and expf are within 2 ulp of glibc's (CUDA math API
// accuracy tables). GELU = x/2 (1 + erf) cancels for negative x, so the absolute error is
// up to |x|/2 * 2 ulp(1) = 6e-7 for the tests' |x| <= 5; the relative part covers the rest.
inline constexpr tolerance gpu_f32_elementwise{1e-6, 1e-6, "CUDA erff/expf vs glibc, <= 2 ulp each"};
// Row reductions in f32 (LayerNorm statistics and gradient sums): a block merges 256
// strided partials in a tree, the twin sums in order; dgamma/dbeta add rows through
// atomics in any order. Same order of error as an f32 kernel vs double.
inline constexpr tolerance gpu_f32_reduction{1e-5, 1e-4, "tree vs serial f32 summation, atomic row order"};
// Outputs stored as f16 / bf16: both sides compute in f32 from the same rounded inputs
// and round once; a few-ulp f32 difference may round to the neighbouring half value.
inline constexpr tolerance gpu_f16_storage{1e-6, 9.8e-4, "f32 math, one f16 rounding each side"};
inline constexpr tolerance gpu_bf16_storage{1e-6, 7.9e-3, "f32 math, one bf16 rounding each side"};
// Softmax probabilities on the GPU (cross-entropy's gradient away from the label, about
// scale / classes each, so far below gpu_f32_reduction's absolute part) vs the CPU's:
// expf within 2 ulp and exp_nonpositive within 1 ulp of exp; the row's f32 sum (a thread's
// serial sum of classes / 256 positive terms, then a tree over the block) vs the CPU's
// double sum, at most ~130 u = 7.8e-6 relative at 30522 classes; an ulp each for 1 / sum
// and the product. Relative, with ~2x margin over that worst case.
inline constexpr tolerance gpu_softmax_probs{1e-12, 2e-5, "f32 exp and block sum vs double sum"};
// cuBLASLt products against a double reference (tests/gpu/test_gpu_gemm.cpp): f32
// accumulation of k terms, relative to the sum of the terms' magnitudes, plus an absolute
// floor for results near zero; a half output adds its own rounding (gpu_f16_storage's and
// gpu_bf16_storage's relative parts) at the result's magnitude.
inline constexpr tolerance gpu_gemm{1e-6, 1e-5, "f32-accumulated products vs double, relative to sum |terms|"};
// Column sums of thousands of rows in f32 (bias gradients) vs a double sum: the error
// grows with sqrt(rows) ulps.
inline constexpr tolerance gpu_f32_column_sums{1e-4, 1e-4, "f32 chunked vs double column sums of many rows"};
// 1-bit compression's scale (the mean |x + error|) summed by a block tree on the GPU and
// in order on the CPU: a few f32 ulps.
inline constexpr tolerance gpu_onebit_scale{0.0, 1e-6, "tree vs serial f32 mean of |x|"};
// A whole encoder layer, or the whole pre-training model, on the GPU against the CPU's
// (tests/gpu/test_gpu_bert_layer.cpp, test_gpu_bert_model.cpp): errors relative to the
// reference's norm (losses: to the loss). f32 storage: cuBLASLt's and the kernels'
// summation orders differ from OpenBLAS's and the CPU's reductions through every product,
// softmax, GELU and LayerNorm of the chain. bf16/f16 storage: activations, the stash and
// the products' weight copies rounded to the storage type, against an all-f32 CPU run.
// The absolute part is the NSP loss's floor (a loss near zero).
inline constexpr tolerance gpu_f32_vs_cpu{1e-6, 1e-4, "f32 chain, other summation orders"};
inline constexpr tolerance gpu_half_vs_cpu{1e-6, 3e-2, "half activations and weight copies vs all-f32 CPU"};
// `dsactor run` on a CUDA rank against the same config on the CPU (tools/gpu-check rank,
// read by tools/compare_runs.py): each step's loss and gradient norm. The per-step
// differences of the entries above compound through 20 optimizer updates; f32: other
// summation orders only; bf16/f16: both sides round to the storage type, but a value near
// a rounding boundary may round the other way on the other device (one half ulp, 0.4% in
// bf16), and that moves the next steps. Estimates until the first GPU run measures them.
inline constexpr tolerance gpu_run_f32_vs_cpu{1e-5, 1e-3, "20 f32 steps, other summation orders"};
inline constexpr tolerance gpu_run_half_vs_cpu{1e-4, 3e-2, "20 half-storage steps, rounding flips compound"};
// Two runs that must agree bit for bit (devices.deterministic: a run against its resume).
inline constexpr tolerance bitwise{0.0, 0.0, "the same bits"};

} // namespace dsa::test
