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
//
// Pipeline per K step (warp_tile.cuh): the global loads of step s+1 go to registers while the
// warps multiply step s out of one shared-memory stage; then Δh of step s+1 is formed in fp32
// (row statistics taken here, before any rounding) and written to the other stage. Gram tasks
// skip the 6 warp tiles below the diagonal and mirror the 6 above it.
#pragma once

#include "flow_common.cuh"
#include "warp_tile.cuh"

namespace phf_flow {

template <int MODE>
constexpr int products_smem_bytes() {
  const int stages = 2 * 2 * Operand<MODE>::kParts * kKMajorBytes;  // 2 stages x (P, Q)
  const int staging = kTile * kLdc * 4;
  return stages > staging ? stages : staging;
}

template <typename T, int MODE>
__global__ void __launch_bounds__(kThreads, 1) flow_products_kernel(FlowParams p) {
  using Op = Operand<MODE>;
  constexpr int C = Op::kC, kPart = kKMajorBytes, kOperand = Op::kParts * kKMajorBytes;
  PHF_DYNAMIC_SMEM(smem4);
  char* smem = reinterpret_cast<char*>(smem4);  // stage s: P at s * 2 * kOperand, Q after it
  float* Cs = reinterpret_cast<float*>(smem4);  // [128][kLdc] result staging (after the K loop)

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
  const bool store_q = !gram;  // kGramS reads Q = Δh^T only for the statistics

  // Loader: thread t covers K columns C*(t%16) .. +C-1 of the step and transitions
  // 4*(t/16) .. +3, i.e. hidden rows 4*(t/16) .. +4 (one row shared with the next group).
  const int t = threadIdx.x;
  const int cq = t & 15, rg = t >> 4;
  Raw<T, C> rp[5], rq[5];
  float ss[4] = {0.f, 0.f, 0.f, 0.f}, tt[4] = {0.f, 0.f, 0.f, 0.f}, st[4] = {0.f, 0.f, 0.f, 0.f};

  auto load = [&](int k0) {
    const int col = k0 + C * cq;
#pragma unroll
    for (int u = 0; u < 5; ++u) {
      const int r = 4 * rg + u;  // rows >= m_b may hold padding (even NaN): never read them
      rp[u] = r < mb ? load_raw<T, C>(P_src + (size_t)r * p.H, col, k_end, p.vec_ok) : raw_zero<T, C>();
      if (load_q) rq[u] = r < mb ? load_raw<T, C>(Q_src + (size_t)r * p.H, col, k_end, p.vec_ok) : raw_zero<T, C>();
    }
  };
  // Eq. (Δh): row i of the tile is Δh_i = h_{i+1} - h_i for i < n_b, else 0.
  auto stash = [&](int stage) {
    char* Ps = smem + stage * 2 * kOperand;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = 4 * rg + u;
      float a[C], q[C] = {};
      diff(rp[u + 1], rp[u], a);
      if (load_q) diff(rq[u + 1], rq[u], q);
      if (i >= nb) {
#pragma unroll
        for (int e = 0; e < C; ++e) a[e] = q[e] = 0.f;
      }
      if (do_stats) {
#pragma unroll
        for (int e = 0; e < C; ++e) {
          ss[u] = fmaf(a[e], a[e], ss[u]);
          tt[u] = fmaf(q[e], q[e], tt[u]);
          st[u] = fmaf(a[e], q[e], st[u]);
        }
      }
      const int off = i * kRowBytes + 8 * cq;
      if (do_mma) stash8<MODE>(Ps, kPart, off, a);
      if (store_q) stash8<MODE>(Ps + kOperand, kPart, off, q);
    }
  };

  WarpTile<MODE, true> mm;
  mm.init();
  const WarpPos wp = WarpPos::here();
  const int row0 = wp.row0, col0 = wp.col0;
  const bool below = gram && row0 > col0;  // mirrored from the tile above the diagonal
  const bool warp_active = do_mma && !below && row0 < nb && col0 < nb;

  const int n_steps = ceil_div(k_end - k_begin, Op::kK);
  load(k_begin);
  stash(0);
  __syncthreads();
  for (int s = 0; s < n_steps; ++s) {
    const bool more = s + 1 < n_steps;
    if (more) load(k_begin + (s + 1) * Op::kK);  // lands while this step multiplies
    if (warp_active) {
      const char* Ps = smem + (s & 1) * 2 * kOperand;
      mm.step(Ps, kPart, gram ? Ps : Ps + kOperand, kPart);
      mm.end_step();
    }
    if (more) stash((s + 1) & 1);  // the other stage: its last readers passed the barrier below
    __syncthreads();
  }

  const bool split_k = p.n_chunks > 1;
  if (do_stats) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
#pragma unroll
      for (int o = 1; o < 16; o <<= 1) {  // the 16 column groups of a row are lanes cq = 0..15
        ss[u] += __shfl_xor_sync(0xffffffffu, ss[u], o);
        tt[u] += __shfl_xor_sync(0xffffffffu, tt[u], o);
        st[u] += __shfl_xor_sync(0xffffffffu, st[u], o);
      }
      const int i = 4 * rg + u;
      if (cq == 0 && i < nb) {
        const size_t v = vec_offset(slot, b, p.B) + i;
        if (split_k) {
          atomicAdd(p.nsq_s + v, ss[u]);
          atomicAdd(p.nsq_t + v, tt[u]);
          atomicAdd(p.dot_st + v, st[u]);
        } else {
          p.nsq_s[v] = ss[u];
          p.nsq_t[v] = tt[u];
          p.dot_st[v] = st[u];
        }
      }
    }
  }
  if (!do_mma) return;

  if (!below) mm.store(Cs, kLdc, gram && row0 < col0);
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
template <typename T, int MODE>
cudaError_t launch_products_typed(FlowParams& p, cudaStream_t stream) {
  auto kernel = flow_products_kernel<T, MODE>;
  constexpr int smem = products_smem_bytes<MODE>();
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  int device = 0, sms = 1, per_sm = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
  set_chunks(p, sms * (per_sm > 0 ? per_sm : 1));
  const long long grid = (long long)p.n_tasks * p.B * p.n_chunks;
  if (grid == 0) return cudaSuccess;
  kernel<<<(unsigned)grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <int MODE>
cudaError_t launch_products(FlowParams& p, DType dtype, cudaStream_t stream) {
  return by_dtype(dtype, [&](auto tag) { return launch_products_typed<decltype(tag), MODE>(p, stream); });
}
#endif  // PHF_FLOW_CPU_EMULATION

}  // namespace phf_flow
