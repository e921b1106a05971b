// Backward: d loss / d h^S for one selected layer l, sample b and 128 hidden columns per CTA.
//
// With upstream gradients a = dLoss/dL_dir(l), g = dLoss/dL_geo(l), q_up / q_dn = dLoss/dL_adj
// of the pairs (l, l+1) / (l-1, l), n = max(n_b, 1), E = G^S - G^T, F = C^S - C^T:
//   gD_i  = (4g/n²) (E D_l)_i + (2q_up/n²) (F_up D_{l+1})_i + (2q_dn/n²) (F_dnᵀ D_{l-1})_i
//           - (a/n) d^T_i                                           (Eqs. L_geo, L_adj, L_dir)
//   gΔ_i  = r_i gD_i - Δh_i · r_i <d_i, gD_i> / ||Δh_i||            (Eq. d; second term 0 if Δh_i = 0)
//   gh_j  = gΔ_{j-1} - gΔ_j                                          (Eq. Δh)
// Folding r into the coefficient matrices written by flow_finalize.cu (W'_geo = r E r,
// W'_up = r_l F r_{l+1}, W'_dn = W'_upᵀ of the pair below), this CTA computes
//   gΔ = (4g/n²) W'_geo Δh_l + (2q_up/n²) W'_up Δh_{l+1} + (2q_dn/n²) W'_dn Δh_{l-1}   (tensor cores)
//        - β ⊙ Δh^S_l + γ ⊙ Δh^T_l                                                     (epilogue)
// with β_i = r_i <d_i, gD_i> / ||Δh_i|| and γ_i = -(a/n) r^S_i r^T_i, where the projection
// <d_i, gD_i> = (4g/n²) ρgeo_i + (2q_up/n²) ρup_i + (2q_dn/n²) ρdn_i - (a/n) cos_i comes from
// the row sums ρ = Σ_j E_ij G_ij (and the F ⊙ C analogues) saved by the forward pass, so no
// extra pass over the hidden axis is needed. Then the differencing transpose gives gh.
#pragma once

#include "flow_common.cuh"
#include "tile_mma.cuh"

namespace phf_flow {

constexpr int kBackwardSmem =
    ((kTile * kLdk + kKc * kLdc) > kTile * kLdc ? (kTile * kLdk + kKc * kLdc) : kTile * kLdc) * 4;

template <typename T>
struct BackwardSource {
  const float* w;  // [128 x 128] W' for (layer, sample)
  const T* h;      // [m x H] student hidden states of the source layer, sample b
  float coef;      // scalar upstream factor
};

template <typename T, int MODE, int CTAS>  // CTAS: see flow_products_kernel
__global__ void __launch_bounds__(kThreads, CTAS) flow_backward_kernel(FlowParams p) {
  PHF_DYNAMIC_SMEM(smem4);
  float* As = reinterpret_cast<float*>(smem4);  // [128][kLdk]: coef * W'[:, k0 : k0 + 32]
  float* Bs = As + kTile * kLdk;                // [32][kLdc]: Δh rows k0 .. k0+31, 128 columns
  float* Cs = As;                               // [128][kLdc]: gΔ tile (after the K loop)
  __shared__ float beta_s[kTile], gamma_s[kTile];

  const int n_ht = ceil_div(p.H, kHt);
  int blk = blockIdx.x;  // neighbouring layers of one (b, column tile) run side by side: L2 reuse
  const int pos = blk % p.n_layers;
  blk /= p.n_layers;
  const int ht = blk % n_ht;
  const int b = blk / n_ht;
  const int t = threadIdx.x;
  const int h0 = ht * kHt;

  const int mb = p.lengths[b];
  const int nb = max(mb - 1, 0);
  const float inv_n = 1.f / (float)max(nb, 1);
  const float inv_n2 = inv_n * inv_n;
  const size_t layer_stride = (size_t)p.B * p.m * p.H;
  const size_t sample_off = (size_t)b * p.m * p.H;
  const T* S = static_cast<const T*>(p.student);
  const T* Tt = static_cast<const T*>(p.teacher);
  const int layer = p.layer_ids[pos];

  const float a = p.need_dir ? p.g_dir[pos * p.B + b] : 0.f;
  const float g = p.need_geo ? p.g_geo[pos * p.B + b] : 0.f;
  const int pu = p.up_pair[pos], pd = p.dn_pair[pos];
  const float qu = pu >= 0 ? p.g_adj[pu * p.B + b] : 0.f;
  const float qd = pd >= 0 ? p.g_adj[pd * p.B + b] : 0.f;

  // Per-transition scalars β_i, γ_i (see the header comment).
  if (t < kTile) {
    float beta = 0.f, gamma = 0.f;
    if (t < nb) {
      const size_t v = vec_offset(pos, b, p.B) + t;
      const float nu = sqrtf(p.nsq_s[v]);
      const float r = 1.f / (nu + p.eps);
      float proj = 0.f;
      if (p.need_geo) proj += 4.f * g * inv_n2 * p.rho_geo[v];
      if (pu >= 0) proj += 2.f * qu * inv_n2 * p.rho_up[vec_offset(pu, b, p.B) + t];
      if (pd >= 0) proj += 2.f * qd * inv_n2 * p.rho_dn[vec_offset(pd, b, p.B) + t];
      if (p.need_dir) {
        proj -= a * inv_n * p.cos[v];
        gamma = -a * inv_n * r / (sqrtf(p.nsq_t[v]) + p.eps);
      }
      beta = nu > 0.f ? r * proj / nu : 0.f;
    }
    beta_s[t] = beta;
    gamma_s[t] = gamma;
  }

  // The relational sources; a zero coefficient (e.g. a sample with m_b < 2) adds nothing.
  BackwardSource<T> src[3];
  int n_src = 0;
  if (p.need_geo && g != 0.f)
    src[n_src++] = {p.rs + mat_offset(pos, b, p.B), S + layer * layer_stride + sample_off, 4.f * g * inv_n2};
  if (pu >= 0 && qu != 0.f)
    src[n_src++] = {p.xs + mat_offset(pu, b, p.B), S + p.layer_ids[p.pair_hi[pu]] * layer_stride + sample_off,
                    2.f * qu * inv_n2};
  if (pd >= 0 && qd != 0.f)
    src[n_src++] = {p.xt + mat_offset(pd, b, p.B), S + p.layer_ids[p.pair_lo[pd]] * layer_stride + sample_off,
                    2.f * qd * inv_n2};
  const int n_kc = ceil_div(nb, kKc);  // transitions >= n_b have zero coefficients: skip them
  const int n_steps = n_src * n_kc;

  // Loader layout. A: thread t covers row t/2, columns 16*(t%2) .. +15 of the 32-wide chunk.
  // B: thread t covers columns 4*(t%32) .. +3 and transitions 4*(t/32) .. +3 of the chunk.
  const int a_row = t >> 1, a_half = t & 1;
  const int cq = t & 31, rg = t >> 5;
  float4 aw[4];
  Raw4<T> rb[5];

  auto load = [&](int step) {
    const BackwardSource<T>& s = src[step / n_kc];
    const int k0 = (step % n_kc) * kKc;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      aw[e] = *reinterpret_cast<const float4*>(s.w + a_row * kTile + k0 + 16 * a_half + 4 * e);
#pragma unroll
    for (int u = 0; u < 5; ++u) {
      const int r = k0 + 4 * rg + u;
      rb[u] = r < mb ? load_raw4(s.h + (size_t)r * p.H, h0 + 4 * cq, p.H, p.vec_ok) : raw4_zero<T>();
    }
  };
  auto stash = [&](int step) {
    const float coef = src[step / n_kc].coef;
    const int k0 = (step % n_kc) * kKc;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float4 w = aw[e];
      *reinterpret_cast<float4*>(As + a_row * kLdk + 16 * a_half + 4 * e) =
          make_float4(coef * w.x, coef * w.y, coef * w.z, coef * w.w);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = k0 + 4 * rg + u;
      *reinterpret_cast<float4*>(Bs + (4 * rg + u) * kLdc + 4 * cq) =
          j < nb ? diff4(rb[u + 1], rb[u]) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };

  TileMma<MODE, false> mm;
  mm.init();
  if (n_steps > 0) load(0);
  for (int step = 0; step < n_steps; ++step) {
    stash(step);
    __syncthreads();
    if (step + 1 < n_steps) load(step + 1);
    mm.mma(As, kLdk, Bs, kLdc, nb, kHt);
    __syncthreads();
  }
  mm.store(Cs, kLdc);
  __syncthreads();

  // Epilogue 1: gΔ_i = (products)_i - β_i Δh^S_i + γ_i Δh^T_i for i < n_b, 0 beyond.
  const T* Sl = S + layer * layer_stride + sample_off;
  const T* Tl = Tt + layer * layer_stride + sample_off;
  for (int e = t; e < kTile * kHt; e += kThreads) {
    const int i = e / kHt, c = e % kHt, col = h0 + c;
    float v = 0.f;
    if (i < nb && col < p.H) {
      v = Cs[i * kLdc + c];
      const float be = beta_s[i], ga = gamma_s[i];
      if (be != 0.f) v -= be * (to_f(Sl[(size_t)(i + 1) * p.H + col]) - to_f(Sl[(size_t)i * p.H + col]));
      if (ga != 0.f) v += ga * (to_f(Tl[(size_t)(i + 1) * p.H + col]) - to_f(Tl[(size_t)i * p.H + col]));
    }
    Cs[i * kLdc + c] = v;
  }
  __syncthreads();

  // Epilogue 2 (Eq. Δh transposed): gh_j = gΔ_{j-1} - gΔ_j, every row j < m written.
  T* G = static_cast<T*>(p.grad) + layer * layer_stride + sample_off;
  for (int e = t; e < p.m * kHt; e += kThreads) {
    const int j = e / kHt, c = e % kHt, col = h0 + c;
    if (col >= p.H) continue;
    const float v = (j > 0 ? Cs[(j - 1) * kLdc + c] : 0.f) - Cs[j * kLdc + c];
    G[(size_t)j * p.H + col] = from_f<T>(v);
  }
}

#ifndef PHF_FLOW_CPU_EMULATION
template <typename T, int MODE, int CTAS>
cudaError_t launch_backward_typed(const FlowParams& p, cudaStream_t stream) {
  auto kernel = flow_backward_kernel<T, MODE, CTAS>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBackwardSmem);
  if (err != cudaSuccess) return err;
  const long long grid = (long long)p.n_layers * p.B * ceil_div(p.H, kHt);
  if (grid == 0) return cudaSuccess;
  kernel<<<(unsigned)grid, kThreads, kBackwardSmem, stream>>>(p);
  return cudaGetLastError();
}

template <int MODE, int CTAS>
cudaError_t launch_backward(const FlowParams& p, DType dtype, cudaStream_t stream) {
  return by_dtype(dtype, [&](auto tag) { return launch_backward_typed<decltype(tag), MODE, CTAS>(p, stream); });
}
#endif  // PHF_FLOW_CPU_EMULATION

}  // namespace phf_flow
