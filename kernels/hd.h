// Portability macros for the math headers shared by the CPU and CUDA backends: one source of the arithmetic,
// compiled by the host compiler for the CPU kernels and by nvcc for the device kernels.
#pragma once

#if defined(__CUDACC__)
#define LBOPT_HD __host__ __device__ __forceinline__
// Tables are read from device code only through pointers the CUDA backend places in constant or shared memory;
// the host copies below serve the CPU path and the upload.
#define LBOPT_TABLE inline constexpr
#else
#define LBOPT_HD inline
#define LBOPT_TABLE inline constexpr
#endif

#define LBOPT_INF __builtin_inff()
