// Device helpers shared by the flow-loss kernels: tile constants, raw 4-element loads of
// fp32/fp16/bf16 rows (kept raw in registers so a prefetch does not stall on conversion),
// and warp/block sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "flow_params.h"

namespace phf_flow {

constexpr int kThreads = 256;    // 8 warps per CTA
constexpr int kLdk = kKc + 4;    // row stride (floats) of [128 x 32] operand tiles
constexpr int kLdc = kTile + 4;  // row stride (floats) of [.. x 128] tiles
constexpr int kHt = 128;         // hidden columns per backward CTA

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

// Four consecutive elements of one row, as loaded (16 bytes of fp32 or 8 bytes of fp16/bf16).
template <typename T> struct Raw4;
template <> struct Raw4<float> { float4 v; };
template <> struct Raw4<__half> { uint2 v; };
template <> struct Raw4<__nv_bfloat16> { uint2 v; };

template <typename T>
__device__ __forceinline__ Raw4<T> raw4_zero() {
  Raw4<T> r;
  memset(&r.v, 0, sizeof(r.v));  // all-zero bits are +0.0 in every element type
  return r;
}

// row[k .. k+3] with elements at or beyond `limit` read as 0. `vec_ok` promises 4-element
// alignment of row + k (H % 4 == 0, aligned base, k % 4 == 0).
template <typename T>
__device__ __forceinline__ Raw4<T> load_raw4(const T* row, int k, int limit, bool vec_ok) {
  Raw4<T> r;
  if (vec_ok && k + 3 < limit) {
    r.v = *reinterpret_cast<const decltype(r.v)*>(row + k);
  } else {
    T e[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) e[i] = (k + i < limit) ? row[k + i] : from_f<T>(0.f);
    memcpy(&r.v, e, sizeof(r.v));
  }
  return r;
}

template <typename T> struct Pair2;  // two packed elements
template <> struct Pair2<__half> { using type = __half2; };
template <> struct Pair2<__nv_bfloat16> { using type = __nv_bfloat162; };
__device__ __forceinline__ float2 to_float2(__half2 x) { return __half22float2(x); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }

__device__ __forceinline__ float4 to_float4(const Raw4<float>& r) { return r.v; }
template <typename T>
__device__ __forceinline__ float4 to_float4(const Raw4<T>& r) {
  typename Pair2<T>::type lo, hi;
  memcpy(&lo, &r.v.x, 4);
  memcpy(&hi, &r.v.y, 4);
  const float2 a = to_float2(lo), b = to_float2(hi);
  return make_float4(a.x, a.y, b.x, b.y);
}

// Δh for four columns: upper - lower in fp32 (exact for bf16/fp16 inputs up to one rounding).
template <typename T>
__device__ __forceinline__ float4 diff4(const Raw4<T>& upper, const Raw4<T>& lower) {
  const float4 a = to_float4(upper), b = to_float4(lower);
  return make_float4(a.x - b.x, a.y - b.y, a.z - b.z, a.w - b.w);
}

// ----------------------------------------------------------------------------- reductions

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the CTA; the result is valid in thread 0. Every thread must call it.
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / 32; ++w) s += red[w];
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
