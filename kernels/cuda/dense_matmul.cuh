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
// Work split: a block owns 16 * R weight rows (and S slabs of x); its KS warps take interleaved chunks of K (U chunks loaded per
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

// What one warp loads for one round: U chunks of x (its row gid of each of its S slabs) and, for each of its R
// tiles, rows gid and gid + 8, as pairs.
template <int R, int U, int S>
struct Round {
  uint32_t xv[U][S][8];
  uint32_t wv[U][R][2][8];
};

// R: 16-row tiles per warp. KS: warps per block, splitting K. U: chunks of 64 k each warp loads per round.
// S: 8-row slabs of x per block (below). A row's bits depend on KS only (the order its partial sums meet in).
template <int R, int KS, int U, int S, typename T>
__device__ __forceinline__ void dmv(const T* x, const T* w, T* y, int M, int N, int K) {
  static_assert(R >= 1 && R <= KS, "each tile is finished by one warp");
  static_assert(S >= 1 && S <= 4, "1 to 4 slabs a block");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, t = lane & 3;
  const int C = K / 64;
  // Rows of x past 8 go in 8-row slabs, as in quantized_matmul.cuh: a block takes S consecutive slabs and loads
  // each weight chunk once for all of them; the blocks of other slabs sit beside those of the same weight rows
  // (they meet those weights in L2). Either way each slab is computed as its rows alone.
  const int groups = ((M + 7) / 8 + S - 1) / S, slab0 = S * (blockIdx.x % groups);
  const int row0 = (blockIdx.x / groups) * 16 * R;
  const bool xa = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const bool wa = (reinterpret_cast<uintptr_t>(w) & 15) == 0;
  int ms[S];      // rows of x in each slab (0 past the last)
  bool mine[S];   // this lane carries column gid of the mma's B (row gid of the slab)
  const T* xr[S];
#pragma unroll
  for (int s = 0; s < S; ++s) {
    ms[s] = max(0, min(M - 8 * (slab0 + s), 8));
    mine[s] = gid < ms[s];
    xr[s] = x + (size_t(8 * (slab0 + s)) + (mine[s] ? gid : 0)) * K + 8 * t;
  }

  const T* wr[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) wr[r][h] = w + size_t(min(row0 + 16 * r + gid + 8 * h, N - 1)) * K + 8 * t;
  }

  float acc[S][R][4];
#pragma unroll
  for (int s = 0; s < S; ++s) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[s][r][0] = acc[s][r][1] = acc[s][r][2] = acc[s][r][3] = 0.0f;
  }

  for (int c0 = warp; c0 < C; c0 += KS * U) {
    Round<R, U, S> f;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = (c0 + u * KS < C) ? c0 + u * KS : c0;  // out-of-range slots reload c0, unused
#pragma unroll
      for (int s = 0; s < S; ++s) {
        if (mine[s]) {
          load8(xr[s] + c * 64, xa, &f.xv[u][s][0]);
          load8(xr[s] + c * 64 + 32, xa, &f.xv[u][s][4]);
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) f.xv[u][s][i] = 0u;
        }
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
        // Each slab's mmas on the same weight registers, in the order a one-slab block issues them.
#pragma unroll
        for (int s = 0; s < S; ++s) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            Num<T>::mma(acc[s][r], f.wv[u][r][0][2 * j], f.wv[u][r][1][2 * j], f.wv[u][r][0][2 * j + 1],
                        f.wv[u][r][1][2 * j + 1], f.xv[u][s][2 * j], f.xv[u][s][2 * j + 1]);
          }
        }
      }
    }
  }

  // The KS partial sums of each (slab, tile), added in warp order by the tile's own warp.
  __shared__ float red[KS][S][R][32][4];
#pragma unroll
  for (int s = 0; s < S; ++s) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][s][r][lane][i] = acc[s][r][i];
    }
  }
  __syncthreads();
  if (warp < R) {
    const int r = warp;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int k = 0; k < KS; ++k) {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] += red[k][s][r][lane][i];
      }
      T* ys = y + size_t(8 * (slab0 + s)) * N;
      const int n_lo = row0 + 16 * r + gid, n_hi = n_lo + 8, m0 = 2 * t, m1 = 2 * t + 1;
      if (n_lo < N) {
        if (m0 < ms[s]) ys[size_t(m0) * N + n_lo] = Num<T>::from_float(v[0]);
        if (m1 < ms[s]) ys[size_t(m1) * N + n_lo] = Num<T>::from_float(v[1]);
      }
      if (n_hi < N) {
        if (m0 < ms[s]) ys[size_t(m0) * N + n_hi] = Num<T>::from_float(v[2]);
        if (m1 < ms[s]) ys[size_t(m1) * N + n_hi] = Num<T>::from_float(v[3]);
      }
    }
  }
}

}  // namespace tandem_dmm
