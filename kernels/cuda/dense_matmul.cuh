// Verify-width dense matmul: y[M, N] = x[M, K] @ w[N, K]^T for M = 1..32, x and w both bf16 or both f16,
// fp32 accumulation, K a multiple of 64.
//
// MLX 0.32.4's CUDA matmul gives a row of x different bits at M = 1 (its gemv) than inside M = 2..4 (a gemm
// tile), so an MTP verify's logits were not plain decoding's and bf16 MTP lost its exactness. Here, as in
// quantized_matmul.cuh, the M rows ride in the N=8 side of one tensor-core mma.sync.m16n8k16 per 16 weight
// rows and 16 k: M = 1 and M = 8 read the same weight bytes and issue the same instructions, and a row's sum
// is the same chain of mmas whatever M is and whatever the other rows of x hold.
//
// Layout: in each chunk of 64 k, lane (gid, t) of a warp loads 16 bytes at k = 8t and 16 bytes at k = 32 + 8t
// of weight rows gid and gid + 8 of a tile (and of x row gid), so one load instruction reads 64 contiguous
// bytes of each of 8 rows. The four pairs of each 16-byte piece feed two mmas; A and B use the same
// permutation of the chunk's k, so the mma still sums every k once.
//
// Work split: a block owns 16 * R weight rows; its KS warps take interleaved chunks of K (U chunks loaded per
// round) and meet in shared memory, summed in warp order by the tile's own warp.
//
// This file is the kernel's header (device functions); dense_matmul.cu is the body MLX wraps in the generated
// __global__ function. The Rust glue is src/kernels/dense_matmul.rs; kernels/README.md says more.

namespace tandem_dmm {

template <typename T>
struct Num;

template <>
struct Num<__nv_bfloat16> {
  static __device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

template <>
struct Num<__half> {
  static __device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
};

// Eight consecutive elements (16 bytes) as four 32-bit pairs; element-wise where the address is not 16-byte
// aligned (a view into a buffer), with the same values.
template <typename T>
__device__ __forceinline__ void load8(const T* p, bool aligned, uint32_t* v) {
  if (aligned) {
    uint4 a = *reinterpret_cast<const uint4*>(p);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else {
    const unsigned short* s = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = uint32_t(s[2 * i]) | (uint32_t(s[2 * i + 1]) << 16);
  }
}

// What one warp loads for one round: U chunks of x (its row gid) and, for each of its R tiles, rows gid and
// gid + 8, as pairs.
template <int R, int U>
struct Round {
  uint32_t xv[U][8];
  uint32_t wv[U][R][2][8];
};

// R: 16-row tiles per warp. KS: warps per block, splitting K. U: chunks of 64 k each warp loads per round.
template <int R, int KS, int U, typename T>
__device__ __forceinline__ void dmv(const T* x, const T* w, T* y, int M, int N, int K) {
  static_assert(R >= 1 && R <= KS, "each tile is finished by one warp");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, t = lane & 3;
  const int C = K / 64;
  // Rows of x past 8 go in 8-row slabs, as in quantized_matmul.cuh: each slab computed as its rows alone.
  const int slabs = (M + 7) / 8, slab = blockIdx.x % slabs;
  x += size_t(slab) * 8 * K;
  y += size_t(slab) * 8 * N;
  M = min(M - 8 * slab, 8);
  const int row0 = (blockIdx.x / slabs) * 16 * R;
  const bool xa = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const bool wa = (reinterpret_cast<uintptr_t>(w) & 15) == 0;
  const bool mine = gid < M;  // this lane carries column gid of the mma's B (row gid of x)
  const T* xr = x + size_t(mine ? gid : 0) * K + 8 * t;

  const T* wr[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) wr[r][h] = w + size_t(min(row0 + 16 * r + gid + 8 * h, N - 1)) * K + 8 * t;
  }

  float acc[R][4];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.0f;

  for (int c0 = warp; c0 < C; c0 += KS * U) {
    Round<R, U> f;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = (c0 + u * KS < C) ? c0 + u * KS : c0;  // out-of-range slots reload c0, unused
      if (mine) {
        load8(xr + c * 64, xa, &f.xv[u][0]);
        load8(xr + c * 64 + 32, xa, &f.xv[u][4]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) f.xv[u][i] = 0u;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          load8(wr[r][h] + c * 64, wa, &f.wv[u][r][h][0]);
          load8(wr[r][h] + c * 64 + 32, wa, &f.wv[u][r][h][4]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c0 + u * KS >= C) break;
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          Num<T>::mma(acc[r], f.wv[u][r][0][2 * j], f.wv[u][r][1][2 * j], f.wv[u][r][0][2 * j + 1],
                      f.wv[u][r][1][2 * j + 1], f.xv[u][2 * j], f.xv[u][2 * j + 1]);
        }
      }
    }
  }

  // The KS partial sums of each tile, added in warp order by the tile's own warp.
  __shared__ float red[KS][R][32][4];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][r][lane][i] = acc[r][i];
  }
  __syncthreads();
  if (warp < R) {
    const int r = warp;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < KS; ++k) {
#pragma unroll
      for (int i = 0; i < 4; ++i) s[i] += red[k][r][lane][i];
    }
    const int n_lo = row0 + 16 * r + gid, n_hi = n_lo + 8, m0 = 2 * t, m1 = 2 * t + 1;
    if (n_lo < N) {
      if (m0 < M) y[size_t(m0) * N + n_lo] = Num<T>::from_float(s[0]);
      if (m1 < M) y[size_t(m1) * N + n_lo] = Num<T>::from_float(s[1]);
    }
    if (n_hi < N) {
      if (m0 < M) y[size_t(m0) * N + n_hi] = Num<T>::from_float(s[2]);
      if (m1 < M) y[size_t(m1) * N + n_hi] = Num<T>::from_float(s[3]);
    }
  }
}

}  // namespace tandem_dmm
