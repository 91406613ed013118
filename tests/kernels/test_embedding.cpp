// tests for kernels/cpu/embedding land with the kernels work.
