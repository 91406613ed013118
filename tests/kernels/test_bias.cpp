// tests for kernels/cpu/bias land with the kernels work.
