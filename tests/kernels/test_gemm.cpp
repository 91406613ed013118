// tests for kernels/cpu/gemm land with the kernels work.
