// tests for kernels/cpu/convert land with the kernels work.
