// tests for kernels/cpu/layernorm land with the kernels work.
