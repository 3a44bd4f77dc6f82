// Verify-width affine-quantized matmul: y[M, N] = x[M, K] @ dequantize(w, scales, biases)^T for M = 1..32,
// 4- or 8-bit weights in MLX's packed layout (uint32 words, value i of a word in bits [i*BITS, (i+1)*BITS)),
// group size 64, scales and biases [N, K/64] in x's dtype (bf16 or f16).
//
// MLX's CUDA op costs almost linearly in M at these widths; here the M rows ride in the N=8 side of one
// tensor-core mma.sync.m16n8k16 per 16 weight rows and 16 k, so M = 1 and M = 8 read the same weight bytes
// and issue the same instructions. Per group of 64 k: the integer codes q (exact in bf16 and f16) meet x in
// fp32-accumulating mmas, the group's scale is applied in fp32, and bias * sum(x) comes from one more set of
// mmas whose A operand is the bias broadcast along k, as MLX's own kernels compute scale * (q . x) + bias * sum(x).
//
// Work split: a block owns 16 * R weight rows; its KS warps take interleaved groups of K and meet in shared
// memory, summed in warp order. Nothing depends on M or on the values of other rows of x, so a row of x gives
// the same bits at M = 1 as inside a verify of M = 8 (MTP's verify logits are decoding's own).
//
// This file is the kernel's header (device functions); quantized_matmul.cu is the body MLX wraps in the
// generated __global__ function. The Rust glue is src/kernels/quantized_matmul.rs; kernels/README.md says more.

namespace tandem_qmm {

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
  static __device__ __forceinline__ uint32_t sub_magic(uint32_t h, uint32_t magic) {
    __nv_bfloat162 a = *reinterpret_cast<__nv_bfloat162*>(&h);
    __nv_bfloat162 b = *reinterpret_cast<__nv_bfloat162*>(&magic);
    __nv_bfloat162 r = __hsub2(a, b);
    return *reinterpret_cast<uint32_t*>(&r);
  }
  // Four 4-bit codes pairs (v_i, v_{i+4}) of one word, as bf16x2: 128 + q built in the bits, then 128 taken away
  // (both exact).
  static __device__ __forceinline__ void q4(uint32_t q, uint32_t (&p)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p[i] = sub_magic(((q >> (4 * i)) & 0x000F000Fu) | 0x43004300u, 0x43004300u);
    }
  }
  // Pairs (v0, v2), (v1, v3) of one word of 8-bit codes. bf16 holds 0..255 exactly but has no room for the
  // magic-number trick, so each code goes through fp32 (2^23 + q, minus 2^23).
  static __device__ __forceinline__ void q8(uint32_t q, uint32_t (&p)[2]) {
    float f0 = __uint_as_float(__byte_perm(q, 0x4B000000u, 0x7440)) - 8388608.0f;
    float f1 = __uint_as_float(__byte_perm(q, 0x4B000000u, 0x7441)) - 8388608.0f;
    float f2 = __uint_as_float(__byte_perm(q, 0x4B000000u, 0x7442)) - 8388608.0f;
    float f3 = __uint_as_float(__byte_perm(q, 0x4B000000u, 0x7443)) - 8388608.0f;
    __nv_bfloat162 a = __floats2bfloat162_rn(f0, f2);
    __nv_bfloat162 b = __floats2bfloat162_rn(f1, f3);
    p[0] = *reinterpret_cast<uint32_t*>(&a);
    p[1] = *reinterpret_cast<uint32_t*>(&b);
  }
  static __device__ __forceinline__ uint32_t dup(__nv_bfloat16 v) {
    __nv_bfloat162 r = __halves2bfloat162(v, v);
    return *reinterpret_cast<uint32_t*>(&r);
  }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
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
  static __device__ __forceinline__ uint32_t sub_magic(uint32_t h, uint32_t magic) {
    __half2 a = *reinterpret_cast<__half2*>(&h);
    __half2 b = *reinterpret_cast<__half2*>(&magic);
    __half2 r = __hsub2(a, b);
    return *reinterpret_cast<uint32_t*>(&r);
  }
  // 1024 + q in f16's bits, minus 1024 (exact for q < 1024).
  static __device__ __forceinline__ void q4(uint32_t q, uint32_t (&p)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p[i] = sub_magic(((q >> (4 * i)) & 0x000F000Fu) | 0x64006400u, 0x64006400u);
    }
  }
  static __device__ __forceinline__ void q8(uint32_t q, uint32_t (&p)[2]) {
    p[0] = sub_magic(__byte_perm(q, 0x64646464u, 0x4240), 0x64006400u);
    p[1] = sub_magic(__byte_perm(q, 0x64646464u, 0x4341), 0x64006400u);
  }
  static __device__ __forceinline__ uint32_t dup(__half v) {
    __half2 r = __halves2half2(v, v);
    return *reinterpret_cast<uint32_t*>(&r);
  }
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
};

// Sixteen consecutive elements of x (32 bytes) as eight 32-bit pairs.
template <typename T>
__device__ __forceinline__ void load_x16(const T* p, bool aligned, uint32_t (&v)[8]) {
  if (aligned) {
    uint4 a = reinterpret_cast<const uint4*>(p)[0];
    uint4 b = reinterpret_cast<const uint4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const unsigned short* s = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = uint32_t(s[2 * i]) | (uint32_t(s[2 * i + 1]) << 16);
  }
}

// WPL consecutive words of a weight row (8 or 16 bytes). P = 1: the load asks L2 to fetch the 256 bytes
// around it (the row's next groups, which this block's other warps load next), so more of the weight stream is
// in flight than the registers of the resident warps hold; P = 0 is a plain load. The bytes are the same.
template <int WPL, int P>
__device__ __forceinline__ void load_w(const uint32_t* p, bool aligned, uint32_t (&v)[WPL]) {
  if (aligned) {
    if constexpr (P == 1 && WPL == 2) {
      asm volatile("ld.global.nc.L2::256B.v2.u32 {%0,%1}, [%2];" : "=r"(v[0]), "=r"(v[1]) : "l"(p));
    } else if constexpr (P == 1) {
      asm volatile("ld.global.nc.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                   : "l"(p));
    } else if constexpr (WPL == 2) {
      uint2 a = *reinterpret_cast<const uint2*>(p);
      v[0] = a.x, v[1] = a.y;
    } else {
      uint4 a = *reinterpret_cast<const uint4*>(p);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < WPL; ++i) v[i] = p[i];
  }
}

// One scale or bias (2 bytes), with the same L2 hint as the weights when P = 1.
template <int P, typename T>
__device__ __forceinline__ T load_sb(const T* p) {
  if constexpr (P == 1) {
    unsigned short v;
    asm volatile("ld.global.nc.L2::256B.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return *reinterpret_cast<T*>(&v);
  } else {
    return *p;
  }
}

// What one warp loads for one round: U groups of x (as pairs) for each of its S slabs of rows, and, for each
// of its R tiles, the two rows' words, scales and biases of those groups.
template <int BITS, int R, int U, int S, typename T>
struct Round {
  uint32_t xv[U][S][8];
  uint32_t wq[U][R][2][BITS / 2];
  T sc[U][R][2], bi[U][R][2];
};

template <int BITS, int R, int KS, int U, int S, int P, typename T>
__device__ __forceinline__ void load_round(Round<BITS, R, U, S, T>& f, int g0, int G, const T* const (&xr)[S],
                                           const bool (&mine)[S], bool xa, const uint32_t* w, bool wa,
                                           const T* scales, const T* biases, const int (&rows)[R][2], int wrow,
                                           int t) {
  constexpr int WPG = 2 * BITS;  // words per row per group of 64
  constexpr int WPL = BITS / 2;  // words per lane per group (each lane owns 16 consecutive k)
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int g = (g0 + u * KS < G) ? g0 + u * KS : g0;  // out-of-range slots reload g0, unused
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if (mine[s]) {
        load_x16(xr[s] + g * 64, xa, f.xv[u][s]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) f.xv[u][s][i] = 0u;
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        load_w<WPL, P>(w + size_t(rows[r][h]) * wrow + g * WPG + t * WPL, wa, f.wq[u][r][h]);
        f.sc[u][r][h] = load_sb<P>(scales + size_t(rows[r][h]) * G + g);
        f.bi[u][r][h] = load_sb<P>(biases + size_t(rows[r][h]) * G + g);
      }
    }
  }
}

// x as B pairs in the order the weight pairs come out of the words (a permutation of the group's k, the same
// for A and B, so the mma still sums every k once).
template <int BITS>
__device__ __forceinline__ void x_pairs(const uint32_t (&xv)[8], uint32_t (&bp)[8]) {
  if constexpr (BITS == 4) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      bp[4 * i + 0] = __byte_perm(xv[4 * i + 0], xv[4 * i + 2], 0x5410);
      bp[4 * i + 1] = __byte_perm(xv[4 * i + 0], xv[4 * i + 2], 0x7632);
      bp[4 * i + 2] = __byte_perm(xv[4 * i + 1], xv[4 * i + 3], 0x5410);
      bp[4 * i + 3] = __byte_perm(xv[4 * i + 1], xv[4 * i + 3], 0x7632);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      bp[2 * i + 0] = __byte_perm(xv[2 * i], xv[2 * i + 1], 0x5410);
      bp[2 * i + 1] = __byte_perm(xv[2 * i], xv[2 * i + 1], 0x7632);
    }
  }
}

// Each tile's weights are unpacked once and meet every slab's x: a slab's sums are the same instructions in the
// same order as in a launch of its rows alone (acc[s] is that launch's acc).
template <int BITS, int R, int KS, int U, int S, typename T>
__device__ __forceinline__ void compute_round(const Round<BITS, R, U, S, T>& f, int g0, int G,
                                              float (&acc)[S][R][4]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (g0 + u * KS >= G) break;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      uint32_t ap[2][8];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (BITS == 4) {
          uint32_t p0[4], p1[4];
          Num<T>::q4(f.wq[u][r][h][0], p0);
          Num<T>::q4(f.wq[u][r][h][1], p1);
#pragma unroll
          for (int i = 0; i < 4; ++i) ap[h][i] = p0[i], ap[h][4 + i] = p1[i];
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            uint32_t p[2];
            Num<T>::q8(f.wq[u][r][h][i], p);
            ap[h][2 * i] = p[0], ap[h][2 * i + 1] = p[1];
          }
        }
      }
      const float s0 = Num<T>::to_float(f.sc[u][r][0]), s1 = Num<T>::to_float(f.sc[u][r][1]);
      const uint32_t b0 = Num<T>::dup(f.bi[u][r][0]), b1 = Num<T>::dup(f.bi[u][r][1]);
#pragma unroll
      for (int s = 0; s < S; ++s) {
        uint32_t bp[8];
        x_pairs<BITS>(f.xv[u][s], bp);
        float cq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          Num<T>::mma(cq, ap[0][2 * j], ap[1][2 * j], ap[0][2 * j + 1], ap[1][2 * j + 1], bp[2 * j], bp[2 * j + 1]);
        }
        float(&a)[4] = acc[s][r];
        a[0] = fmaf(s0, cq[0], a[0]);
        a[1] = fmaf(s0, cq[1], a[1]);
        a[2] = fmaf(s1, cq[2], a[2]);
        a[3] = fmaf(s1, cq[3], a[3]);
#pragma unroll
        for (int j = 0; j < 4; ++j) Num<T>::mma(a, b0, b1, b0, b1, bp[2 * j], bp[2 * j + 1]);
      }
    }
  }
}

// BITS: 4 or 8. R: 16-row tiles per warp. KS: warps per block, splitting K. U: groups each warp loads per round.
// P: 1 loads with L2's 256-byte prefetch hint, 0 plain loads; the same bits either way. S: 8-row slabs of x per
// block (below). A row's bits depend on KS only (the order its partial sums meet in); R, U, P and S change how
// the work is spread and loaded.
template <int BITS, int R, int KS, int U, int P, int S, typename T>
__device__ __forceinline__ void qmv(const T* x, const uint32_t* w, const T* scales, const T* biases, T* y, int M,
                                    int N, int K) {
  static_assert(BITS == 4 || BITS == 8, "4 or 8 bits");
  static_assert(R >= 1 && R <= KS, "each tile is finished by one warp");
  static_assert(S >= 1 && S <= 4, "1 to 4 slabs a block");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, t = lane & 3;
  const int G = K / 64;
  const int wrow = K * BITS / 32;
  // Rows of x past 8 (a batch's verify) go in 8-row slabs. A block takes S consecutive slabs: it unpacks each
  // weight tile once for all of them. With fewer slabs a block than the rows need, the blocks of the other slabs
  // sit beside those of the same weight rows (they meet those weights in L2). Either way a slab is computed
  // exactly as a launch of its rows alone.
  const int groups = ((M + 7) / 8 + S - 1) / S, slab0 = S * (blockIdx.x % groups);
  const int row0 = (blockIdx.x / groups) * 16 * R;
  const bool xa = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const bool wa = (reinterpret_cast<uintptr_t>(w) & 15) == 0;
  int ms[S];          // rows of x in each slab (0 past the last)
  bool mine[S];       // this lane carries column gid of the mma's B (row gid of the slab)
  const T* xr[S];
#pragma unroll
  for (int s = 0; s < S; ++s) {
    ms[s] = max(0, min(M - 8 * (slab0 + s), 8));
    mine[s] = gid < ms[s];
    xr[s] = x + (size_t(8 * (slab0 + s)) + (mine[s] ? gid : 0)) * K + 16 * t;
  }

  int rows[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[r][h] = min(row0 + 16 * r + gid + 8 * h, N - 1);
  }

  float acc[S][R][4];
#pragma unroll
  for (int s = 0; s < S; ++s) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[s][r][0] = acc[s][r][1] = acc[s][r][2] = acc[s][r][3] = 0.0f;
  }

  for (int g0 = warp; g0 < G; g0 += KS * U) {
    Round<BITS, R, U, S, T> f;
    load_round<BITS, R, KS, U, S, P>(f, g0, G, xr, mine, xa, w, wa, scales, biases, rows, wrow, t);
    compute_round<BITS, R, KS, U, S>(f, g0, G, acc);
  }

  // The KS partial sums of each (slab, tile), added in warp order by one warp.
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
#pragma unroll
  for (int s = 0; s < S; ++s) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if ((s * R + r) % KS != warp || ms[s] == 0) continue;
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

}  // namespace tandem_qmm
