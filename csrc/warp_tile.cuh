// The 128 x 128 tile engines: how one CTA (16 warps) stores its operands in shared memory and
// accumulates C += A · B over K steps. Warp w owns rows 32 (w / 4) .. +31 and columns
// 32 (w % 4) .. +31. A is K-major [128 rows][K step] (flow_common.cuh); B is K-major too when
// NT (C += A · Bᵀ, B stored as its 128 rows) or N-major [K step rows][128 columns] otherwise.
//
//   kBf16   (K step 64): operands rounded to bf16 (one array), mma m16n8k16, fp32 accumulators.
//           Relative operand error 2^-9: the fastest mode, but a term that is itself a small
//           difference (e.g. one transition, a short hidden axis) can be off by > 1e-2.
//   kBf16x3 (K step 64): operands split x = hi + lo, hi = bf16(x), lo = bf16(x - hi) (two
//           arrays), three bf16 mma: lo·hi + hi·lo + hi·hi (lo·lo ~2^-18 is dropped): operand
//           error ~2^-17, three times the bf16 tensor work. Default for bf16/fp16 inputs.
//   kTf32x3 (K step 32): as kBf16x3 with TF32 halves big = tf32(x), small = tf32(x - big) and
//           mma m16n8k8: fp32-level accuracy; the default for fp32 inputs. The tensor cores
//           accumulate with truncation, which over thousands of steps shrinks the sums by
//           ~1e-5 relative; so each K step starts from zero and is then added to an fp32
//           register sum with round-to-nearest (`end_step`).
//   kSimt   (K step 32): operands fp32 (one array), fp32 FMA in order of k.
// Every stash writes 8 bytes of each operand array: C = 8 / sizeof(element) consecutive K
// (or N-major column) values, so the loaders are the same for every mode.
#pragma once

#include "flow_common.cuh"
#include "warp_mma.cuh"

namespace phf_flow {

template <int MODE> struct Operand;
template <> struct Operand<kBf16> {
  static constexpr int kK = 64, kParts = 1, kC = 4, kNMajorRow = 272;
};
template <> struct Operand<kBf16x3> {
  static constexpr int kK = 64, kParts = 2, kC = 4, kNMajorRow = 272;
};
template <> struct Operand<kTf32x3> {
  static constexpr int kK = 32, kParts = 2, kC = 2, kNMajorRow = 544;
};
template <> struct Operand<kSimt> {
  static constexpr int kK = 32, kParts = 1, kC = 2, kNMajorRow = 544;
};

// Write the C values v (fp32) as operand elements at byte offset `off` of each array part.
template <int MODE>
__device__ __forceinline__ void stash8(char* part0, int part_bytes, int off, const float (&v)[Operand<MODE>::kC]) {
  uint2 w0;
  if constexpr (MODE == kBf16 || MODE == kBf16x3) {
    __nv_bfloat162 hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) hi[h] = __floats2bfloat162_rn(v[2 * h], v[2 * h + 1]);
    memcpy(&w0, hi, 8);
    if constexpr (MODE == kBf16x3) {
      __nv_bfloat162 lo[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 f = __bfloat1622float2(hi[h]);  // v - hi is exact in fp32
        lo[h] = __floats2bfloat162_rn(v[2 * h] - f.x, v[2 * h + 1] - f.y);
      }
      uint2 w1;
      memcpy(&w1, lo, 8);
      *reinterpret_cast<uint2*>(part0 + part_bytes + off) = w1;
    }
  } else if constexpr (MODE == kTf32x3) {
    const float b0 = tf32_round(v[0]), b1 = tf32_round(v[1]);
    const float s0 = tf32_round(v[0] - b0), s1 = tf32_round(v[1] - b1);  // v - big is exact in fp32
    memcpy(&w0.x, &b0, 4);
    memcpy(&w0.y, &b1, 4);
    uint2 w1;
    memcpy(&w1.x, &s0, 4);
    memcpy(&w1.y, &s1, 4);
    *reinterpret_cast<uint2*>(part0 + part_bytes + off) = w1;
  } else {
    memcpy(&w0.x, &v[0], 4);
    memcpy(&w0.y, &v[1], 4);
  }
  *reinterpret_cast<uint2*>(part0 + off) = w0;
}

struct WarpPos {
  int row0, col0, lane;
  __device__ __forceinline__ static WarpPos here() {
    const int w = threadIdx.x >> 5;
    return {32 * (w >> 2), 32 * (w & 3), (int)(threadIdx.x & 31)};
  }
};

// ----------------------------------------------------------------------------- tensor cores
// acc[x][y]: the 16 x 8 block at rows row0 + 16x, columns col0 + 8y (mma C layout).
template <int MODE, bool NT>
struct MmaTileBase {
  float acc[2][4][4];
  WarpPos at;

  __device__ __forceinline__ void zero(float (&a)[2][4][4]) {
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int y = 0; y < 4; ++y)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[x][y][e] = 0.f;
  }

  // ldmatrix addresses of one 32-byte K slab (16 bf16 / 8 tf32 values) at byte `kb` of a step:
  // the A fragment of rows r0 .. r0+15, and the B fragments of columns n0 .. n0+15 (two n8 blocks).
  __device__ __forceinline__ const char* a_addr(const char* A, int r0, int kb) const {
    const int l = at.lane;
    return A + (r0 + (l & 7) + ((l >> 3) & 1) * 8) * kRowBytes + kb + (l >> 4) * 16;
  }
  __device__ __forceinline__ const char* b_addr_nt(const char* B, int n0, int kb) const {
    const int l = at.lane;
    return B + (n0 + (l & 7) + (l >> 4) * 8) * kRowBytes + kb + ((l >> 3) & 1) * 16;
  }

  __device__ __forceinline__ void store_from(const float (&a)[2][4][4], float* C, int ldc, bool mirror) const {
    const int g = at.lane >> 2, t = at.lane & 3;
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int y = 0; y < 4; ++y)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = at.row0 + 16 * x + g + 8 * h, c = at.col0 + 8 * y + 2 * t;
          *reinterpret_cast<float2*>(C + r * ldc + c) = make_float2(a[x][y][2 * h], a[x][y][2 * h + 1]);
          if (mirror) {
            C[c * ldc + r] = a[x][y][2 * h];
            C[(c + 1) * ldc + r] = a[x][y][2 * h + 1];
          }
        }
  }
};

// kBf16 (one product per fragment pair), kBf16x3 and kTf32x3 (three, from two operand parts).
template <int MODE, bool NT>
struct WarpTile : MmaTileBase<MODE, NT> {
  static_assert(MODE == kBf16 || MODE == kBf16x3 || MODE == kTf32x3, "tensor-core modes");
  using Base = MmaTileBase<MODE, NT>;
  using Base::acc;
  using Base::at;
  static constexpr bool kTf32 = MODE == kTf32x3, kSplit = MODE != kBf16;
  static constexpr int kNMajorRow = Operand<MODE>::kNMajorRow;
  float sum[kTf32 ? 2 : 1][4][4];  // kTf32x3: round-to-nearest fp32 sum of the finished K steps

  __device__ __forceinline__ void init() {
    at = WarpPos::here();
    Base::zero(acc);
    if constexpr (kTf32) Base::zero(sum);
  }

  __device__ __forceinline__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (kTf32) {
      mma_tf32_1688(c, a, b0, b1);
    } else {
      mma_bf16_16816(c, a, b0, b1);
    }
  }

  // One operand part's B fragments of n8 blocks 2*y2 (regs 0, 1) and 2*y2+1 (regs 2, 3) for
  // the 32-byte K slab `ks` (16 bf16 / 8 tf32 values).
  __device__ __forceinline__ void load_b(uint32_t (&b)[4], const char* B, int y2, int ks) const {
    const int l = at.lane;
    if constexpr (NT) {
      ldmatrix_x4(b, Base::b_addr_nt(B, at.col0 + 16 * y2, 32 * ks));
    } else if constexpr (!kTf32) {  // N-major bf16: rows k, transposed 8 x 8 loads
      ldmatrix_x4_trans(b, B + (16 * ks + (l & 7) + ((l >> 3) & 1) * 8) * kNMajorRow + (at.col0 + 16 * y2 + (l >> 4) * 8) * 2);
    } else {  // N-major fp32: element (k, n) at row k, column n; conflict-free 32-bit loads
      const int g = l >> 2, t = l & 3;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const char* p = B + (8 * ks + t) * kNMajorRow + (at.col0 + 16 * y2 + 8 * h + g) * 4;
        b[2 * h] = *reinterpret_cast<const uint32_t*>(p);
        b[2 * h + 1] = *reinterpret_cast<const uint32_t*>(p + 4 * kNMajorRow);
      }
    }
  }

  // One K step (four 32-byte slabs). A, B: part 0 of the stage's operands; part 1 follows each
  // at a_part / b_part bytes (split modes).
  __device__ __forceinline__ void step(const char* A, int a_part, const char* B, int b_part) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      uint32_t a_hi[2][4], a_lo[2][4];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const char* p = Base::a_addr(A, at.row0 + 16 * x, 32 * ks);
        ldmatrix_x4(a_hi[x], p);
        if constexpr (kSplit) ldmatrix_x4(a_lo[x], p + a_part);
      }
#pragma unroll
      for (int y2 = 0; y2 < 2; ++y2) {
        uint32_t b_hi[4], b_lo[4];
        load_b(b_hi, B, y2, ks);
        if constexpr (kSplit) load_b(b_lo, B + b_part, y2, ks);
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float(&c)[4] = acc[x][2 * y2 + h];
            if constexpr (kSplit) {
              mma(c, a_lo[x], b_hi[2 * h], b_hi[2 * h + 1]);
              mma(c, a_hi[x], b_lo[2 * h], b_lo[2 * h + 1]);
            }
            mma(c, a_hi[x], b_hi[2 * h], b_hi[2 * h + 1]);
          }
      }
    }
  }

  __device__ __forceinline__ void end_step() {
    if constexpr (kTf32) {
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            sum[x][y][e] += acc[x][y][e];
            acc[x][y][e] = 0.f;
          }
    }
  }

  __device__ __forceinline__ void store(float* C, int ldc, bool mirror) const {
    if constexpr (kTf32) {
      Base::store_from(sum, C, ldc, mirror);
    } else {
      Base::store_from(acc, C, ldc, mirror);
    }
  }
};

// ----------------------------------------------------------------------------- fp32 FMA
// Lane (ly, lx) = (lane / 8, lane % 8) owns rows row0 + ly + 4u (u < 8) and columns
// col0 + lx + 8v (NT) or col0 + 4 lx + v (N-major B), v < 4; operands are read as float4.
template <bool NT>
struct WarpTile<kSimt, NT> {
  float acc[8][4];
  int row, col;

  __device__ __forceinline__ void init() {
    const WarpPos at = WarpPos::here();
    const int ly = at.lane >> 3, lx = at.lane & 7;
    row = at.row0 + ly;
    col = at.col0 + (NT ? lx : 4 * lx);
#pragma unroll
    for (int u = 0; u < 8; ++u)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[u][v] = 0.f;
  }

  __device__ __forceinline__ void step(const char* A, int, const char* B, int) {
    const float* Af = reinterpret_cast<const float*>(A);
    const float* Bf = reinterpret_cast<const float*>(B);
    constexpr int lda = kRowBytes / 4, ldn = Operand<kSimt>::kNMajorRow / 4;
#pragma unroll 2
    for (int k = 0; k < Operand<kSimt>::kK; k += 4) {
      float b[4][4];  // b[v][q]: column v, k + q
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        if constexpr (NT) {
          const float4 x = *reinterpret_cast<const float4*>(Bf + (col + 8 * v) * lda + k);
          b[v][0] = x.x, b[v][1] = x.y, b[v][2] = x.z, b[v][3] = x.w;
        } else {
          const float4 x = *reinterpret_cast<const float4*>(Bf + (k + v) * ldn + col);  // row k + v
          b[0][v] = x.x, b[1][v] = x.y, b[2][v] = x.z, b[3][v] = x.w;
        }
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float4 a = *reinterpret_cast<const float4*>(Af + (row + 4 * u) * lda + k);
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          float s = acc[u][v];
          s = fmaf(a.x, b[v][0], s);
          s = fmaf(a.y, b[v][1], s);
          s = fmaf(a.z, b[v][2], s);
          acc[u][v] = fmaf(a.w, b[v][3], s);
        }
      }
    }
  }

  __device__ __forceinline__ void end_step() {}

  __device__ __forceinline__ void store(float* C, int ldc, bool mirror) const {
#pragma unroll
    for (int u = 0; u < 8; ++u)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int r = row + 4 * u, c = col + (NT ? 8 * v : v);
        C[r * ldc + c] = acc[u][v];
        if (mirror) C[c * ldc + r] = acc[u][v];
      }
  }
};

}  // namespace phf_flow
