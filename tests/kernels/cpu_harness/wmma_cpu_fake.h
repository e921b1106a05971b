// The subset of nvcuda::wmma used by csrc/tile_mma.cuh, on the host, with the semantics the
// CUDA programming guide documents (tests only). Lane 0 of each warp holds the whole tile in
// logical order and does the warp's math and stores (the other lanes only check), and each load
// and store checks the documented requirements: a 256-bit aligned pointer, ldm a multiple of
// 4 floats, and the tile inside the shared-memory buffer.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = rows * cols;
  float x[num_elements];  // logical order: x[r * cols + c]
};

// cvt.rna.tf32.f32: keep 10 mantissa bits, round to nearest, ties away from zero.
inline float __float_to_tf32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits = (bits + 0x1000u) & ~0x1fffu;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

inline void check_tile(const float* p, unsigned ldm, int rows, int cols, bool row_major) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) phf_emu::fail("wmma pointer not 256-bit aligned");
  if (ldm % 4 != 0) phf_emu::fail("wmma ldm not a multiple of 4 floats");
  const float* base = reinterpret_cast<const float*>(phf_emu::smem_buffer);
  const float* last = row_major ? p + (size_t)(rows - 1) * ldm + (cols - 1) : p + (size_t)(cols - 1) * ldm + (rows - 1);
  if (p < base || last >= base + phf_emu::kSmemBytes / 4) phf_emu::fail("wmma tile outside shared memory");
}

template <typename Use, int M, int N, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const float* p, unsigned ldm) {
  using F = fragment<Use, M, N, K, T, Layout>;
  constexpr bool rm = std::is_same_v<Layout, row_major>;
  check_tile(p, ldm, F::rows, F::cols, rm);
  if ((threadIdx.x & 31) != 0) return;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c) f.x[r * F::cols + c] = rm ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}

template <int M, int N, int K>
void fill_fragment(fragment<accumulator, M, N, K, float, void>& f, float v) {
  for (float& e : f.x) e = v;
}

// D = A B + C with fp32 accumulation of the (already TF32-valued) products.
template <int M, int N, int K, typename LA, typename LB>
void mma_sync(fragment<accumulator, M, N, K, float, void>& d, const fragment<matrix_a, M, N, K, precision::tf32, LA>& a,
              const fragment<matrix_b, M, N, K, precision::tf32, LB>& b,
              const fragment<accumulator, M, N, K, float, void>& c) {
  if ((threadIdx.x & 31) != 0) return;  // lane 0 computes for the warp
  float out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float acc = c.x[i * N + j];
      for (int k = 0; k < K; ++k) acc += a.x[i * K + k] * b.x[k * N + j];
      out[i * N + j] = acc;
    }
  std::memcpy(d.x, out, sizeof(out));
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float, void>& f, unsigned ldm, layout_t layout) {
  if (layout != mem_row_major) phf_emu::fail("only mem_row_major stores are emulated");
  check_tile(p, ldm, M, N, true);
  if ((threadIdx.x & 31) != 0) return;  // one lane writes what the warp stores collectively
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) p[(size_t)i * ldm + j] = f.x[i * N + j];
}

}  // namespace wmma
}  // namespace nvcuda
