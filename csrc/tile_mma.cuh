// One CTA (256 threads) accumulates a 128x128 fp32 tile  C += A · B  over K steps of 32:
//   A: [128 rows x 32 k] row-major in shared memory (stride lda),
//   B: [32 k x 128 cols], either col-major (B_COL: stored as 128 rows of 32 k, stride ldb —
//      the "A · Bᵀ" case of a Gram matrix) or row-major (stored as 32 rows of 128, stride ldb).
// Three engines with the same interface (see Mode in flow_params.h).
#pragma once

#ifdef PHF_FLOW_CPU_EMULATION
#include "wmma_cpu_fake.h"  // tests/kernels/cpu_harness: the documented WMMA semantics, on the host
#else
#include <mma.h>
#endif

#include <type_traits>

#include "flow_common.cuh"

namespace phf_flow {

template <int MODE, bool B_COL, typename Enable = void>
struct TileMma;

// ----------------------------------------------------------------------------- fp32 FMA
// Thread (ty, tx) = (t / 16, t % 16) owns rows ty + 16u and columns tx + 16v, u, v < 8.
template <bool B_COL>
struct TileMma<kSimt, B_COL, void> {
  float acc[8][8];
  int ty, tx;

  __device__ __forceinline__ void init() {
    ty = threadIdx.x >> 4;
    tx = threadIdx.x & 15;
#pragma unroll
    for (int u = 0; u < 8; ++u)
#pragma unroll
      for (int v = 0; v < 8; ++v) acc[u][v] = 0.f;
  }

  // row_limit / col_limit let tensor-core warps skip all-zero blocks; unused here.
  __device__ __forceinline__ void mma(const float* A, int lda, const float* B, int ldb, int, int) {
#pragma unroll 4
    for (int k = 0; k < kKc; ++k) {
      float a[8], b[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) a[u] = A[(ty + 16 * u) * lda + k];
#pragma unroll
      for (int v = 0; v < 8; ++v) b[v] = B_COL ? B[(tx + 16 * v) * ldb + k] : B[k * ldb + tx + 16 * v];
#pragma unroll
      for (int u = 0; u < 8; ++u)
#pragma unroll
        for (int v = 0; v < 8; ++v) acc[u][v] = fmaf(a[u], b[v], acc[u][v]);
    }
  }

  __device__ __forceinline__ void store(float* C, int ldc) const {
#pragma unroll
    for (int u = 0; u < 8; ++u)
#pragma unroll
      for (int v = 0; v < 8; ++v) C[(ty + 16 * u) * ldc + tx + 16 * v] = acc[u][v];
  }
};

// ----------------------------------------------------------------------------- TF32 tensor cores
// Warp w owns the 32x64 block at rows 32*(w/2), columns 64*(w%2): 2x4 fragments of 16x16.
// kTf32x3 splits every operand x = big + small (both TF32) and accumulates
// small*big + big*small + big*big, which recovers fp32 accuracy (the small*small term is
// below fp32 rounding).
template <int MODE, bool B_COL>
struct TileMma<MODE, B_COL, std::enable_if_t<MODE == kTf32 || MODE == kTf32x3>> {
  using Layout = std::conditional_t<B_COL, nvcuda::wmma::col_major, nvcuda::wmma::row_major>;
  using FragA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32,
                                       nvcuda::wmma::row_major>;
  using FragB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 8, nvcuda::wmma::precision::tf32, Layout>;
  using FragC = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float>;

  FragC acc[2][4];
  int row0, col0;

  __device__ __forceinline__ void init() {
    const int w = threadIdx.x >> 5;
    row0 = (w >> 1) * 32;
    col0 = (w & 1) * 64;
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int y = 0; y < 4; ++y) nvcuda::wmma::fill_fragment(acc[x][y], 0.f);
  }

  template <typename Frag>
  __device__ __forceinline__ static void split(Frag& big, Frag& small) {
#pragma unroll
    for (int e = 0; e < big.num_elements; ++e) {
      const float v = big.x[e];
      const float hi = nvcuda::wmma::__float_to_tf32(v);
      big.x[e] = hi;
      if (MODE == kTf32x3) small.x[e] = nvcuda::wmma::__float_to_tf32(v - hi);
    }
  }

  // Rows >= row_limit of A and columns >= col_limit of B are zero: a warp whose whole block
  // lies beyond them has nothing to add (warp-uniform branch).
  __device__ __forceinline__ void mma(const float* A, int lda, const float* B, int ldb, int row_limit,
                                      int col_limit) {
    if (row0 >= row_limit || col0 >= col_limit) return;
#pragma unroll
    for (int kk = 0; kk < kKc; kk += 8) {
      FragA a_big[2], a_small[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        nvcuda::wmma::load_matrix_sync(a_big[x], A + (row0 + 16 * x) * lda + kk, lda);
        split(a_big[x], a_small[x]);
      }
#pragma unroll
      for (int y = 0; y < 4; ++y) {
        FragB b_big, b_small;
        const float* bp = B_COL ? B + (col0 + 16 * y) * ldb + kk : B + kk * ldb + col0 + 16 * y;
        nvcuda::wmma::load_matrix_sync(b_big, bp, ldb);
        split(b_big, b_small);
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          if (MODE == kTf32x3) {
            nvcuda::wmma::mma_sync(acc[x][y], a_small[x], b_big, acc[x][y]);
            nvcuda::wmma::mma_sync(acc[x][y], a_big[x], b_small, acc[x][y]);
          }
          nvcuda::wmma::mma_sync(acc[x][y], a_big[x], b_big, acc[x][y]);
        }
      }
    }
  }

  __device__ __forceinline__ void store(float* C, int ldc) const {
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int y = 0; y < 4; ++y)
        nvcuda::wmma::store_matrix_sync(C + (row0 + 16 * x) * ldc + col0 + 16 * y, acc[x][y], ldc,
                                        nvcuda::wmma::mem_row_major);
  }
};

}  // namespace phf_flow
