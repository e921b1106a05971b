// Runs the CUDA kernels of csrc/ as host code, for tests only. One CTA at a time, by 256
// std::threads; __syncthreads is a barrier, warp shuffles go through a per-warp
// exchange buffer, atomics are std::atomic_ref. __shared__ arrays become statics (one CTA
// runs at a time) and the dynamic shared memory is one global buffer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

using std::max;
using std::min;

namespace phf_emu {

constexpr int kCtaThreads = 256;
constexpr size_t kSmemBytes = 72 * 1024;  // >= every kernel's dynamic shared memory

struct Cta {
  std::barrier<> block{kCtaThreads};
  std::unique_ptr<std::barrier<>> warp[kCtaThreads / 32];
  float exchange[kCtaThreads / 32][32];
  Cta() {
    for (auto& w : warp) w = std::make_unique<std::barrier<>>(32);
  }
};

inline thread_local uint3 tls_thread;
inline thread_local uint3 tls_block;
inline Cta* current_cta = nullptr;
alignas(128) inline float4 smem_buffer[kSmemBytes / sizeof(float4)];

inline float4* dynamic_smem() { return smem_buffer; }

inline void fail(const char* what) {
  std::fprintf(stderr, "emulation check failed: %s\n", what);
  std::abort();
}

// Run `kernel()` for every CTA of a 1-D grid: 256 threads walk the CTAs in order, meeting at a
// barrier between CTAs (the kernels return early only CTA-uniformly, so all threads arrive).
template <typename Kernel>
void launch(long long grid, Kernel kernel) {
  Cta cta;
  current_cta = &cta;
  std::vector<std::thread> threads;
  threads.reserve(kCtaThreads);
  for (int t = 0; t < kCtaThreads; ++t) {
    threads.emplace_back([&, t] {
      for (long long blk = 0; blk < grid; ++blk) {
        tls_thread = make_uint3(t, 0, 0);
        tls_block = make_uint3((unsigned)blk, 0, 0);
        kernel();
        cta.block.arrive_and_wait();
      }
    });
  }
  for (auto& th : threads) th.join();
  current_cta = nullptr;
}

}  // namespace phf_emu

#define threadIdx (phf_emu::tls_thread)
#define blockIdx (phf_emu::tls_block)
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __shared__
#define __shared__ static

inline void __syncthreads() { phf_emu::current_cta->block.arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
  if (mask != 0xffffffffu) phf_emu::fail("__shfl_xor_sync with a partial mask");
  const int t = threadIdx.x, w = t >> 5, lane = t & 31;
  phf_emu::Cta& cta = *phf_emu::current_cta;
  cta.exchange[w][lane] = v;
  cta.warp[w]->arrive_and_wait();
  const float out = cta.exchange[w][lane ^ lane_mask];
  cta.warp[w]->arrive_and_wait();
  return out;
}

inline float atomicAdd(float* address, float v) { return std::atomic_ref<float>(*address).fetch_add(v); }
