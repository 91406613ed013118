// convert: implementation lands with the kernels work.
