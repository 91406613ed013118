// tests for kernels/cpu/lamb land with the kernels work.
