// Forward pass 1: every 128x128 product the flow loss needs, straight from the hidden states.
//
// One CTA = one (task, sample b, chunk of the hidden axis). With P, Q the [128 x H] stacks of
// raw transitions Δh_i = h_{i+1} - h_i (rows i >= n_b zero), a task accumulates over its chunk
//   kGramS:  RS = P Pᵀ with P = Δh^S_l      (+ row statistics ||Δh^S_i||², ||Δh^T_i||²,
//                                            <Δh^S_i, Δh^T_i>, with Q = Δh^T_l)
//   kGramT:  RT = P Pᵀ with P = Δh^T_l
//   kCrossS: XS = P Qᵀ with P = Δh^S_l, Q = Δh^S_{l+1}
//   kCrossT: XT = P Qᵀ with P = Δh^T_l, Q = Δh^T_{l+1}
// Normalization happens afterwards on the small matrices (flow_finalize.cu):
//   G_ij = <d_i, d_j> = RS_ij r_i r_j with r_i = 1 / (||Δh_i|| + eps),
// so the hidden states are read once and never written back. With more than one chunk the
// partial products are added atomically into zeroed buffers; with one chunk they are stored.
#pragma once

#include "flow_common.cuh"
#include "tile_mma.cuh"

namespace phf_flow {

constexpr int kProductsSmem = (2 * kTile * kLdk > kTile * kLdc ? 2 * kTile * kLdk : kTile * kLdc) * 4;

// CTAS: CTAs per SM the register budget is sized for (1: up to 255 registers, no spills;
// 2: at most 128 registers, some spills, twice the warps to hide load latency).
template <typename T, int MODE, int CTAS>
__global__ void __launch_bounds__(kThreads, CTAS) flow_products_kernel(FlowParams p) {
  PHF_DYNAMIC_SMEM(smem4);
  float* Ps = reinterpret_cast<float*>(smem4);  // [128][kLdk] operand P for this K step
  float* Qs = Ps + kTile * kLdk;                // [128][kLdk] operand Q
  float* Cs = Ps;                               // [128][kLdc] result staging (after the K loop)

  int blk = blockIdx.x;
  const int task = blk % p.n_tasks;
  blk /= p.n_tasks;
  const int b = blk % p.B;
  const int chunk = blk / p.B;

  const int kind = p.tasks[4 * task + 0];
  const int layer_a = p.tasks[4 * task + 1];
  const int layer_b = p.tasks[4 * task + 2];
  const int slot = p.tasks[4 * task + 3];

  const int mb = p.lengths[b];
  const int nb = max(mb - 1, 0);  // valid transitions of sample b
  const int k_begin = chunk * p.chunk_cols;
  const int k_end = min(p.H, k_begin + p.chunk_cols);
  if (nb == 0 || k_begin >= k_end) return;  // nothing to add: buffers are pre-zeroed

  const size_t layer_stride = (size_t)p.B * p.m * p.H;
  const size_t sample_off = (size_t)b * p.m * p.H;
  const T* S = static_cast<const T*>(p.student);
  const T* Tt = static_cast<const T*>(p.teacher);
  const T* P_src = (kind == kGramS || kind == kCrossS ? S : Tt) + layer_a * layer_stride + sample_off;
  const T* Q_src = kind == kGramS    ? Tt + layer_a * layer_stride + sample_off
                   : kind == kCrossS ? S + layer_b * layer_stride + sample_off
                   : kind == kCrossT ? Tt + layer_b * layer_stride + sample_off
                                     : nullptr;
  const bool gram = kind == kGramS || kind == kGramT;
  const bool do_mma = kind != kGramS || p.need_geo;
  const bool do_stats = kind == kGramS;
  const bool load_q = Q_src != nullptr;

  // Loader layout: thread t covers columns 4*(t%8) .. +3 of the K step and transitions
  // 4*(t/8) .. +3, i.e. hidden rows 4*(t/8) .. +4 (one row shared with the next group).
  const int t = threadIdx.x;
  const int cq = t & 7, rg = t >> 3;
  Raw4<T> rp[5], rq[5];

  auto load = [&](int k0) {
    const int col = k0 + 4 * cq;
#pragma unroll
    for (int u = 0; u < 5; ++u) {
      const int r = 4 * rg + u;  // rows >= m_b may hold padding (even NaN): never read them
      rp[u] = r < mb ? load_raw4(P_src + (size_t)r * p.H, col, k_end, p.vec_ok) : raw4_zero<T>();
      if (load_q) rq[u] = r < mb ? load_raw4(Q_src + (size_t)r * p.H, col, k_end, p.vec_ok) : raw4_zero<T>();
    }
  };
  // Eq. (Δh): row i of the tile is Δh_i = h_{i+1} - h_i for i < n_b, else 0.
  auto stash = [&]() {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = 4 * rg + u;
      const bool ok = i < nb;
      const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
      *reinterpret_cast<float4*>(Ps + i * kLdk + 4 * cq) = ok ? diff4(rp[u + 1], rp[u]) : zero;
      if (load_q) *reinterpret_cast<float4*>(Qs + i * kLdk + 4 * cq) = ok ? diff4(rq[u + 1], rq[u]) : zero;
    }
  };

  TileMma<MODE, true> mm;
  mm.init();
  // Row statistics (kGramS only): thread t sums row t/2 over half (t%2) of each K step.
  const int st_row = t >> 1, st_half = t & 1;
  float sum_ss = 0.f, sum_tt = 0.f, sum_st = 0.f;

  load(k_begin);
  for (int k0 = k_begin; k0 < k_end; k0 += kKc) {
    stash();
    __syncthreads();
    if (k0 + kKc < k_end) load(k0 + kKc);  // next step's global loads overlap this step's math
    if (do_mma) mm.mma(Ps, kLdk, gram ? Ps : Qs, kLdk, nb, nb);
    if (do_stats) {
#pragma unroll
      for (int c = 0; c < 16; c += 4) {
        const float4 a = *reinterpret_cast<const float4*>(Ps + st_row * kLdk + 16 * st_half + c);
        const float4 q = *reinterpret_cast<const float4*>(Qs + st_row * kLdk + 16 * st_half + c);
        sum_ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
        sum_tt += q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
        sum_st += a.x * q.x + a.y * q.y + a.z * q.z + a.w * q.w;
      }
    }
    __syncthreads();
  }

  const bool split_k = p.n_chunks > 1;
  if (do_stats) {
    sum_ss += __shfl_xor_sync(0xffffffffu, sum_ss, 1);
    sum_tt += __shfl_xor_sync(0xffffffffu, sum_tt, 1);
    sum_st += __shfl_xor_sync(0xffffffffu, sum_st, 1);
    if (st_half == 0 && st_row < nb) {
      const size_t v = vec_offset(slot, b, p.B) + st_row;
      if (split_k) {
        atomicAdd(p.nsq_s + v, sum_ss);
        atomicAdd(p.nsq_t + v, sum_tt);
        atomicAdd(p.dot_st + v, sum_st);
      } else {
        p.nsq_s[v] = sum_ss;
        p.nsq_t[v] = sum_tt;
        p.dot_st[v] = sum_st;
      }
    }
  }
  if (!do_mma) return;

  mm.store(Cs, kLdc);
  __syncthreads();
  float* out = (kind == kGramS ? p.rs : kind == kGramT ? p.rt : kind == kCrossS ? p.xs : p.xt) +
               mat_offset(slot, b, p.B);
  for (int e = t; e < kMat / 4; e += kThreads) {
    const int i = e >> 5, j = (e & 31) * 4;
    if (i >= nb || j >= nb) continue;  // zero rows / columns stay as pre-zeroed
    const float4 v = *reinterpret_cast<const float4*>(Cs + i * kLdc + j);
    if (split_k) {
      atomic_add4(out + i * kTile + j, v);
    } else {
      *reinterpret_cast<float4*>(out + i * kTile + j) = v;
    }
  }
}

#ifndef PHF_FLOW_CPU_EMULATION
template <typename T, int MODE, int CTAS>
cudaError_t launch_products_typed(FlowParams& p, cudaStream_t stream) {
  auto kernel = flow_products_kernel<T, MODE, CTAS>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kProductsSmem);
  if (err != cudaSuccess) return err;
  int device = 0, sms = 1, per_sm = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kProductsSmem);
  set_chunks(p, sms * (per_sm > 0 ? per_sm : 1));
  const long long grid = (long long)p.n_tasks * p.B * p.n_chunks;
  if (grid == 0) return cudaSuccess;
  kernel<<<(unsigned)grid, kThreads, kProductsSmem, stream>>>(p);
  return cudaGetLastError();
}

template <int MODE, int CTAS>
cudaError_t launch_products(FlowParams& p, DType dtype, cudaStream_t stream) {
  return by_dtype(dtype, [&](auto tag) { return launch_products_typed<decltype(tag), MODE, CTAS>(p, stream); });
}
#endif  // PHF_FLOW_CPU_EMULATION

}  // namespace phf_flow
