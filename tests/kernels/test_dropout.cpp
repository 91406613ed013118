// tests for kernels/cpu/dropout land with the kernels work.
