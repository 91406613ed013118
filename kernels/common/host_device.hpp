// DSA_HD marks math that nvcc compiles for both host and device and g++ compiles as
// plain inline C++: the CPU tests run the same functions the CUDA kernels call.
#pragma once

#if defined(__CUDACC__)
#define DSA_HD __host__ __device__ __forceinline__
#else
#define DSA_HD inline
#endif
