// tests for kernels/cpu/adam land with the kernels work.
