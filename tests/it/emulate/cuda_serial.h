// What the CPU emulations of thread-independent CUDA kernels share (conv.cpp, conv_window.cpp): the launch's
// threads run one after another (no barriers or shuffles needed), bf16/f16 storage emulated as float.
#pragma once
#include <cmath>
#include <cstring>
#define __device__
#define __forceinline__ inline
struct dim3 { int x, y, z; };
static dim3 blockIdx, threadIdx, blockDim;
struct __nv_bfloat16 { float f; };
struct __half { float f; };
inline float __bfloat162float(__nv_bfloat16 x) { return x.f; }
inline float __half2float(__half x) { return x.f; }
