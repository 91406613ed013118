// tests for kernels/cpu/loss land with the kernels work.
