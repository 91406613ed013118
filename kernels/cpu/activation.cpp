// activation: implementation lands with the kernels work.
