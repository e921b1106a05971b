// Forward pass 2: from the raw 128x128 products and row statistics of flow_products.cuh to
// the per-(layer, sample) and per-(pair, sample) loss terms, plus what the backward needs.
//
// One CTA per layer unit (position l, sample b) or pair unit (pair p, sample b):
//   r_i   = 1 / (sqrt(||Δh_i||²) + eps) for i < n_b, else 0              (Eq. d)
//   layer: cos_i = <Δh^S_i, Δh^T_i> r^S_i r^T_i,  L_dir = 1/n Σ_i (1 - cos_i)       (Eq. L_dir)
//          G_ij = RS_ij r^S_i r^S_j,  E_ij = G_ij - RT_ij r^T_i r^T_j,
//          L_geo = Σ E_ij² / n²,  W'_geo = r^S_i E_ij r^S_j,  ρgeo_i = Σ_j E_ij G_ij  (Eq. L_geo)
//          On the diagonal G_ii = ||d_i||² = (1 - eps r_i)² exactly, so the fp32 norms give
//          E_ii = eps (r^T_i - r^S_i)(2 - eps (r^S_i + r^T_i)) without the cancellation of
//          two rounded products (E_ii is O(eps), G_ii is ~1).
//   pair:  C_ij = XS_ij r^S_{l,i} r^S_{l+1,j},  F_ij = C_ij - XT_ij r^T_{l,i} r^T_{l+1,j},
//          L_adj = Σ F_ij² / n²,  W'_up = r^S_{l,i} F_ij r^S_{l+1,j},  W'_dn = W'_upᵀ,
//          ρup_i = Σ_j F_ij C_ij,  ρdn_j = Σ_i F_ij C_ij                                (Eq. L_adj)
// W' overwrite the raw products in place (RS -> W'_geo, XS -> W'_up, XT -> W'_dn).
#include "flow_common.cuh"

namespace phf_flow {

constexpr int kLdF = kTile + 1;  // [128][129] staging of F: conflict-free transposed reads
constexpr int kFinalizeSmem = kTile * kLdF * 4;
constexpr int kFinalizeThreads = 256;

__global__ void __launch_bounds__(kFinalizeThreads) flow_finalize_kernel(FlowParams p) {
  PHF_DYNAMIC_SMEM(smem4);
  float* Fs = reinterpret_cast<float*>(smem4);
  __shared__ float r_a[kTile], r_b[kTile], r_c[kTile], r_d[kTile], colsum[kTile];
  __shared__ float red[kFinalizeThreads / 32];

  const int unit = blockIdx.x / p.B, b = blockIdx.x % p.B;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int nb = max(p.lengths[b] - 1, 0);
  const float inv_n = 1.f / (float)max(nb, 1);
  const float inv_n2 = inv_n * inv_n;
  auto inv_norm = [&](const float* nsq, int pos, int i) {
    return i < nb ? 1.f / (sqrtf(nsq[vec_offset(pos, b, p.B) + i]) + p.eps) : 0.f;
  };

  if (unit < p.n_layers) {
    const int pos = unit;
    if (t < kTile) {
      r_a[t] = inv_norm(p.nsq_s, pos, t);
      r_b[t] = inv_norm(p.nsq_t, pos, t);
    }
    __syncthreads();
    if (p.need_dir) {
      float term = 0.f;
      if (t < kTile) {
        const size_t v = vec_offset(pos, b, p.B) + t;
        const float c = t < nb ? p.dot_st[v] * r_a[t] * r_b[t] : 0.f;
        p.cos[v] = c;
        term = t < nb ? 1.f - c : 0.f;
      }
      const float s = block_sum<kFinalizeThreads>(term, red);
      if (t == 0) p.out_dir[pos * p.B + b] = s * inv_n;
    }
    if (p.need_geo) {
      float* R = p.rs + mat_offset(pos, b, p.B);
      const float* RT = p.rt + mat_offset(pos, b, p.B);
      float sq = 0.f;
      for (int i = warp; i < kTile; i += kFinalizeThreads / 32) {
        const float ri = r_a[i], ti = r_b[i];
        float rho = 0.f;
        for (int j = lane; j < kTile; j += 32) {
          float gs = R[i * kTile + j] * ri * r_a[j];
          float e = gs - RT[i * kTile + j] * ti * r_b[j];
          if (i == j && i < nb) {
            gs = (1.f - p.eps * ri) * (1.f - p.eps * ri);
            e = p.eps * (ti - ri) * (2.f - p.eps * (ri + ti));
          }
          R[i * kTile + j] = ri * e * r_a[j];  // same element, same thread: in place is safe
          sq += e * e;
          rho += e * gs;
        }
        rho = warp_sum(rho);
        if (lane == 0) p.rho_geo[vec_offset(pos, b, p.B) + i] = rho;
      }
      const float s = block_sum<kFinalizeThreads>(sq, red);
      if (t == 0) p.out_geo[pos * p.B + b] = s * inv_n2;
    }
    return;
  }

  const int pp = unit - p.n_layers;
  const int lo = p.pair_lo[pp], hi = p.pair_hi[pp];
  if (t < kTile) {
    r_a[t] = inv_norm(p.nsq_s, lo, t);
    r_b[t] = inv_norm(p.nsq_s, hi, t);
    r_c[t] = inv_norm(p.nsq_t, lo, t);
    r_d[t] = inv_norm(p.nsq_t, hi, t);
    colsum[t] = 0.f;
  }
  __syncthreads();
  float* XS = p.xs + mat_offset(pp, b, p.B);
  float* XT = p.xt + mat_offset(pp, b, p.B);
  float sq = 0.f;
  for (int i = warp; i < kTile; i += kFinalizeThreads / 32) {
    float rho = 0.f;
    for (int j = lane; j < kTile; j += 32) {
      const float c = XS[i * kTile + j] * r_a[i] * r_b[j];
      const float f = c - XT[i * kTile + j] * r_c[i] * r_d[j];
      Fs[i * kLdF + j] = f;
      sq += f * f;
      rho += f * c;
      atomicAdd(&colsum[j], f * c);
    }
    rho = warp_sum(rho);
    if (lane == 0) p.rho_up[vec_offset(pp, b, p.B) + i] = rho;
  }
  const float s = block_sum<kFinalizeThreads>(sq, red);  // also a barrier: every XS/XT read is done below
  if (t == 0) p.out_adj[pp * p.B + b] = s * inv_n2;
  for (int i = warp; i < kTile; i += kFinalizeThreads / 32) {
    for (int j = lane; j < kTile; j += 32) {
      XS[i * kTile + j] = r_a[i] * Fs[i * kLdF + j] * r_b[j];  // W'_up[i][j]
      XT[i * kTile + j] = r_b[i] * Fs[j * kLdF + i] * r_a[j];  // W'_dn[i][j] = W'_up[j][i]
    }
  }
  if (t < kTile) p.rho_dn[vec_offset(pp, b, p.B) + t] = colsum[t];
}

#ifndef PHF_FLOW_CPU_EMULATION
cudaError_t launch_finalize(const FlowParams& p, cudaStream_t stream) {
  cudaError_t err =
      cudaFuncSetAttribute(flow_finalize_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kFinalizeSmem);
  if (err != cudaSuccess) return err;
  const int grid = (p.n_layers + p.n_pairs) * p.B;
  if (grid == 0) return cudaSuccess;
  flow_finalize_kernel<<<grid, kFinalizeThreads, kFinalizeSmem, stream>>>(p);
  return cudaGetLastError();
}
#endif  // PHF_FLOW_CPU_EMULATION

}  // namespace phf_flow
