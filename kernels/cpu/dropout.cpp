// dropout: implementation lands with the kernels work.
