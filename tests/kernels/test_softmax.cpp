// tests for kernels/cpu/softmax land with the kernels work.
