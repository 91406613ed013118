// adam: implementation lands with the kernels work.
