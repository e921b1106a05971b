// Runs the CUDA kernels of csrc/ as host code, for tests only. One CTA at a time, by as many
// std::threads as the launch has; __syncthreads is a barrier, warp shuffles and the warp-wide
// tensor-core instructions (mma_cpu_fake.h) go through a per-warp exchange buffer between two
// warp barriers, atomics are std::atomic_ref. __shared__ arrays become statics (one CTA runs at
// a time) and the dynamic shared memory is a heap buffer of exactly the launch's size, so
// AddressSanitizer reports any access beyond it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

using std::max;
using std::min;

namespace phf_emu {

constexpr int kMaxWarps = 16;
constexpr int kSlots = 12;  // 64-bit values one lane can publish to its warp

struct Cta {
  std::barrier<> block;
  std::unique_ptr<std::barrier<>> warp[kMaxWarps];
  uint64_t exchange[kMaxWarps][32][kSlots];
  explicit Cta(int threads) : block(threads) {
    for (auto& w : warp) w = std::make_unique<std::barrier<>>(32);
  }
};

inline thread_local uint3 tls_thread;
inline thread_local uint3 tls_block;
inline Cta* current_cta = nullptr;
inline char* smem_base = nullptr;
inline size_t smem_bytes = 0;

inline float4* dynamic_smem() { return reinterpret_cast<float4*>(smem_base); }

inline void fail(const char* what) {
  std::fprintf(stderr, "emulation check failed: %s\n", what);
  std::abort();
}

// Run `kernel()` for every CTA of a 1-D grid: `threads` threads walk the CTAs in order, meeting
// at a barrier between CTAs (the kernels return early only CTA-uniformly or after their last
// barrier, so all threads arrive). `smem` bytes of dynamic shared memory, poisoned with NaN.
template <typename Kernel>
void launch(long long grid, int threads, size_t smem, Kernel kernel) {
  if (threads % 32 != 0 || threads / 32 > kMaxWarps) fail("unsupported CTA size");
  if (smem % 16 != 0) fail("dynamic shared memory size not a multiple of 16 bytes");
  smem_base = smem ? static_cast<char*>(std::aligned_alloc(16, smem)) : nullptr;
  smem_bytes = smem;
  for (size_t i = 0; i + 4 <= smem; i += 4) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(smem_base + i, &nan, 4);
  }
  auto cta = std::make_unique<Cta>(threads);
  current_cta = cta.get();
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (long long blk = 0; blk < grid; ++blk) {
        tls_thread = make_uint3(t, 0, 0);
        tls_block = make_uint3((unsigned)blk, 0, 0);
        kernel();
        current_cta->block.arrive_and_wait();
      }
    });
  }
  for (auto& th : pool) th.join();
  current_cta = nullptr;
  std::free(smem_base);
  smem_base = nullptr;
  smem_bytes = 0;
}

// Lane `lane` publishes `n` values, the warp meets, `read(slots)` sees every lane's values, the
// warp meets again (so nobody overwrites a slot another lane still reads).
template <typename Read>
void warp_exchange(const uint64_t* mine, int n, Read read) {
  Cta& cta = *current_cta;
  const int w = (int)tls_thread.x >> 5, lane = (int)tls_thread.x & 31;
  for (int i = 0; i < n; ++i) cta.exchange[w][lane][i] = mine[i];
  cta.warp[w]->arrive_and_wait();
  read(cta.exchange[w]);
  cta.warp[w]->arrive_and_wait();
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
  uint64_t mine = 0;
  std::memcpy(&mine, &v, 4);
  float out = 0.f;
  const int lane = (int)threadIdx.x & 31;
  phf_emu::warp_exchange(&mine, 1, [&](const uint64_t (*slots)[phf_emu::kSlots]) {
    std::memcpy(&out, &slots[lane ^ lane_mask][0], 4);
  });
  return out;
}

inline float atomicAdd(float* address, float v) { return std::atomic_ref<float>(*address).fetch_add(v); }
