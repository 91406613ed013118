// tests for kernels/cpu/activation land with the kernels work.
