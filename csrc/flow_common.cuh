// Device helpers shared by the flow-loss kernels: CTA shape, shared-memory operand layout,
// raw C-element loads of fp32/fp16/bf16 rows (kept raw in registers so a prefetch does not stall
// on conversion), and warp/block sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "flow_params.h"

namespace phf_flow {

// Products and backward: 16 warps, a 4 x 4 grid of 32 x 32 warp tiles over the 128 x 128 CTA tile.
constexpr int kThreads = 512;
constexpr int kLdc = kTile + 4;  // row stride (floats) of the fp32 [128 x 128] result staging
constexpr int kHt = 128;         // hidden columns per backward CTA

// One K step of an operand in shared memory is 128 data bytes per row (64 bf16 or 32 fp32
// values) plus 16 bytes of padding:
//   K-major  [128 rows][144 B]  (A, and B of A·Bᵀ): 144 = 9 x 16 B, so the 8 rows of an
//            ldmatrix phase and the (row, k) pattern of the fp32 fragments hit distinct banks;
//   N-major  [K rows][128 columns + 16 B]  (B of A·B, rows are transitions): bf16 64 x 272 B
//            (17 x 16 B: conflict-free ldmatrix.trans), fp32 32 x 544 B (136 floats ≡ 8 mod 32
//            banks: conflict-free fragment loads).
constexpr int kRowBytes = 144;
constexpr int kKMajorBytes = kTile * kRowBytes;  // 18432
constexpr int kNMajorBytes = 17408;              // 64 x 272 = 32 x 544
constexpr int kSmemAlign = 16;

// Dynamic shared memory. The CPU test harness (tests/kernels/cpu_harness) compiles these
// kernels as host code with PHF_FLOW_CPU_EMULATION and supplies its own buffer.
#ifdef PHF_FLOW_CPU_EMULATION
#define PHF_DYNAMIC_SMEM(name) float4* name = phf_emu::dynamic_smem()
#else
#define PHF_DYNAMIC_SMEM(name) extern __shared__ float4 name[]
#endif

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ----------------------------------------------------------------------------- conversions

template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T> struct Pair2;  // two packed 16-bit elements
template <> struct Pair2<__half> { using type = __half2; };
template <> struct Pair2<__nv_bfloat16> { using type = __nv_bfloat162; };
__device__ __forceinline__ float2 to_float2(__half2 x) { return __half22float2(x); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }

// ----------------------------------------------------------------------------- raw row chunks

// C consecutive elements of one row as loaded (C * sizeof(T) = 4, 8 or 16 bytes).
template <typename T, int C>
struct Raw {
  static constexpr int kWords = C * (int)sizeof(T) / 4;
  static_assert(kWords == 1 || kWords == 2 || kWords == 4, "a chunk is 4, 8 or 16 bytes");
  uint32_t w[kWords];
};

template <typename T, int C>
__device__ __forceinline__ Raw<T, C> raw_zero() {
  Raw<T, C> r;
#pragma unroll
  for (int i = 0; i < Raw<T, C>::kWords; ++i) r.w[i] = 0u;  // all-zero bits are +0.0 in every type
  return r;
}

// row[k .. k+C) with elements at or beyond `limit` read as 0. `vec_ok` promises that a C-element
// vector at row + k is aligned when k is a multiple of C (H % 4 == 0, 16-byte aligned bases).
template <typename T, int C>
__device__ __forceinline__ Raw<T, C> load_raw(const T* row, int k, int limit, bool vec_ok) {
  Raw<T, C> r;
  if (vec_ok && k + C <= limit) {
    if constexpr (Raw<T, C>::kWords == 1) {
      r.w[0] = *reinterpret_cast<const uint32_t*>(row + k);
    } else if constexpr (Raw<T, C>::kWords == 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(row + k);
      r.w[0] = v.x, r.w[1] = v.y;
    } else {
      const uint4 v = *reinterpret_cast<const uint4*>(row + k);
      r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
    }
  } else {
    T e[C];
#pragma unroll
    for (int i = 0; i < C; ++i) e[i] = (k + i < limit) ? row[k + i] : from_f<T>(0.f);
    memcpy(r.w, e, sizeof(e));
  }
  return r;
}

template <typename T, int C>
__device__ __forceinline__ void raw_to_float(const Raw<T, C>& r, float (&out)[C]) {
  if constexpr (std::is_same_v<T, float>) {
    memcpy(out, r.w, sizeof(out));
  } else {
#pragma unroll
    for (int i = 0; i < C / 2; ++i) {
      typename Pair2<T>::type pair;
      memcpy(&pair, &r.w[i], 4);
      const float2 f = to_float2(pair);
      out[2 * i] = f.x, out[2 * i + 1] = f.y;
    }
  }
}

// Δh for C columns: upper - lower in fp32 (exact for bf16/fp16 inputs up to one rounding).
template <typename T, int C>
__device__ __forceinline__ void diff(const Raw<T, C>& upper, const Raw<T, C>& lower, float (&out)[C]) {
  float lo[C];
  raw_to_float(upper, out);
  raw_to_float(lower, lo);
#pragma unroll
  for (int i = 0; i < C; ++i) out[i] -= lo[i];
}

// ----------------------------------------------------------------------------- reductions

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the CTA of THREADS threads; the result is valid in thread 0. Every thread must call it.
template <int THREADS>
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  if (threadIdx.x == 0)
    for (int w = 0; w < THREADS / 32; ++w) s += red[w];
  __syncthreads();
  return s;
}

__device__ __forceinline__ void atomic_add4(float* dst, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(dst), v);
#else
  atomicAdd(dst + 0, v.x);
  atomicAdd(dst + 1, v.y);
  atomicAdd(dst + 2, v.z);
  atomicAdd(dst + 3, v.w);
#endif
}

// fn(T{}) with T the element type of `dtype` (host side: picks the kernel instantiation).
template <typename Fn>
cudaError_t by_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: return fn(float{});
    case DType::kF16: return fn(__half{});
    case DType::kBF16: return fn(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

// Offsets into the workspace.
__device__ __forceinline__ size_t mat_offset(int slot, int b, int B) { return ((size_t)slot * B + b) * kMat; }
__device__ __forceinline__ size_t vec_offset(int slot, int b, int B) { return ((size_t)slot * B + b) * kTile; }

}  // namespace phf_flow
