// What the CPU emulations of block-cooperative CUDA kernels share (attention.cpp, norm.cpp): every CUDA thread
// of a block is a std::thread, with barriers for __syncthreads and for warp shuffles (blocks of up to 8 warps),
// and bf16/f16 storage emulated as float.
#pragma once
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct dim3 { int x, y, z; };
static dim3 blockIdx, gridDim;
thread_local dim3 threadIdx;
struct __nv_bfloat16 { float f; };  // emulation: bf16 storage as float
struct __half { float f; };
inline float __bfloat162float(__nv_bfloat16 x) { return x.f; }
inline float __half2float(__half x) { return x.f; }
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {x}; }
inline float __int_as_float(int bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline __half __float2half_rn(float x) { return {x}; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// A reusable barrier for n threads (std::barrier is C++20 and not everywhere yet).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(m_);
    int gen = gen_;
    if (++count_ == n_) {
      count_ = 0, ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};
static Barrier* block_bar;
static Barrier* warp_bar[8];
static float shfl_buf[8][32];
inline void __syncthreads() { block_bar->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float x, int off) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  shfl_buf[w][lane] = x;
  warp_bar[w]->arrive_and_wait();
  float y = shfl_buf[w][lane ^ off];
  warp_bar[w]->arrive_and_wait();
  return y;
}
// Runs `body` as every thread of one block of `threads` (a multiple of 32, at most 256) at blockIdx `block`.
template <typename F>
void run_block(dim3 block, int threads, F body) {
  blockIdx = block;
  Barrier bb(threads);
  block_bar = &bb;
  for (int w = 0; w < threads / 32; ++w) warp_bar[w] = new Barrier(32);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      threadIdx = {t, 0, 0};
      body();
    });
  for (auto& t : ts) t.join();
  for (int w = 0; w < threads / 32; ++w) delete warp_bar[w];
}
