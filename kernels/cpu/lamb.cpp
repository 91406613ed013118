// lamb: implementation lands with the kernels work.
