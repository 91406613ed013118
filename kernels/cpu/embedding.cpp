// embedding: implementation lands with the kernels work.
