// bias: implementation lands with the kernels work.
