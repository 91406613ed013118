// gemm: implementation lands with the kernels work.
