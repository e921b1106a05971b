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
//        - β ⊙ Δh^S_l + γ ⊙ Δh^T_l                                                     (epilogue, fp32)
// with β_i = r_i <d_i, gD_i> / ||Δh_i|| and γ_i = -(a/n) r^S_i r^T_i, where the projection
// <d_i, gD_i> = (4g/n²) ρgeo_i + (2q_up/n²) ρup_i + (2q_dn/n²) ρdn_i - (a/n) cos_i comes from
// the row sums ρ = Σ_j E_ij G_ij (and the F ⊙ C analogues) saved by the forward pass, so no
// extra pass over the hidden axis is needed. Then the differencing transpose gives gh.
//
// The products run over K = the sources' transitions in steps of Operand<MODE>::kK: A = coef·W'
// (K-major), B = Δh_src (N-major, 128 hidden columns), pipelined as in flow_products.cuh.
#pragma once

#include "flow_common.cuh"
#include "warp_tile.cuh"

namespace phf_flow {

template <int MODE>
constexpr int backward_smem_bytes() {
  const int stages = 2 * Operand<MODE>::kParts * (kKMajorBytes + kNMajorBytes);
  const int staging = kTile * kLdc * 4;
  return stages > staging ? stages : staging;
}

template <typename T>
struct BackwardSource {
  const float* w;  // [128 x 128] W' for (layer, sample)
  const T* h;      // [m x H] student hidden states of the source layer, sample b
  float coef;      // scalar upstream factor
};

template <typename T, int MODE>
__global__ void __launch_bounds__(kThreads, 1) flow_backward_kernel(FlowParams p) {
  using Op = Operand<MODE>;
  constexpr int C = Op::kC, kK = Op::kK;
  constexpr int kA = Op::kParts * kKMajorBytes, kB = Op::kParts * kNMajorBytes;
  PHF_DYNAMIC_SMEM(smem4);
  char* smem = reinterpret_cast<char*>(smem4);  // stage s: A at s * (kA + kB), B after it
  float* Cs = reinterpret_cast<float*>(smem4);  // [128][kLdc]: gΔ tile (after the K loop)
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
  const int n_kc = ceil_div(nb, kK);  // transitions >= n_b have zero coefficients: skip them
  const int n_steps = n_src * n_kc;

  // Loader layout. A: thread t covers row t/4, K values (kK/4)*(t%4) .. +kK/4-1 of the step.
  // B: thread t covers columns C*(t%G) .. +C-1 (G = 128/C column groups) and transitions
  // 4*(t/G) .. +3 of the step, i.e. hidden rows 4*(t/G) .. +4.
  constexpr int kAv = kK / 16;  // float4 of W' per thread
  constexpr int G = kHt / C;
  const int a_row = t >> 2, a_seg = t & 3;
  const int cq = t % G, rg = t / G;
  float4 aw[kAv];
  Raw<T, C> rb[5];

  auto load = [&](int step) {
    const BackwardSource<T>& s = src[step / n_kc];
    const int k0 = (step % n_kc) * kK;
#pragma unroll
    for (int e = 0; e < kAv; ++e)
      aw[e] = *reinterpret_cast<const float4*>(s.w + a_row * kTile + k0 + (kK / 4) * a_seg + 4 * e);
#pragma unroll
    for (int u = 0; u < 5; ++u) {
      const int r = k0 + 4 * rg + u;
      rb[u] = r < mb ? load_raw<T, C>(s.h + (size_t)r * p.H, h0 + C * cq, p.H, p.vec_ok) : raw_zero<T, C>();
    }
  };
  auto stash = [&](int step, int stage) {
    char* As = smem + stage * (kA + kB);
    char* Bs = As + kA;
    const float coef = src[step / n_kc].coef;
    const int k0 = (step % n_kc) * kK;
    const float* w = reinterpret_cast<const float*>(aw);
#pragma unroll
    for (int e = 0; e < kK / 4 / C; ++e) {  // 4 groups of C values: 8 bytes of each part
      float v[C];
#pragma unroll
      for (int i = 0; i < C; ++i) v[i] = coef * w[C * e + i];
      stash8<MODE>(As, kKMajorBytes, a_row * kRowBytes + 32 * a_seg + 8 * e, v);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = k0 + 4 * rg + u;
      float v[C];
      diff(rb[u + 1], rb[u], v);
      if (j >= nb) {
#pragma unroll
        for (int i = 0; i < C; ++i) v[i] = 0.f;
      }
      stash8<MODE>(Bs, kNMajorBytes, (4 * rg + u) * Op::kNMajorRow + 8 * cq, v);
    }
  };

  WarpTile<MODE, false> mm;
  mm.init();
  const WarpPos wp = WarpPos::here();
  const bool warp_active = wp.row0 < nb && h0 + wp.col0 < p.H;  // W' rows >= n_b are zero
  if (n_steps > 0) {
    load(0);
    stash(0, 0);
  }
  __syncthreads();
  for (int s = 0; s < n_steps; ++s) {
    const bool more = s + 1 < n_steps;
    if (more) load(s + 1);
    if (warp_active) {
      const char* As = smem + (s & 1) * (kA + kB);
      mm.step(As, kKMajorBytes, As + kA, kNMajorBytes);
      mm.end_step();
    }
    if (more) stash(s + 1, (s + 1) & 1);
    __syncthreads();
  }
  mm.store(Cs, kLdc, false);
  __syncthreads();

  // Epilogue: thread t covers columns 4*(t%32) .. +3 and rows 8*(t/32) .. +7.
  // 1. gΔ_i = (products)_i - β_i Δh^S_i + γ_i Δh^T_i for i < n_b, 0 beyond. All nine hidden
  //    rows of S and T are requested before any is used, so their latency overlaps.
  const int ec = 4 * (t & 31), er = 8 * (t >> 5), col = h0 + ec;
  const T* Sl = S + layer * layer_stride + sample_off;
  const T* Tl = Tt + layer * layer_stride + sample_off;
  Raw<T, 4> s_rows[9], t_rows[9];
#pragma unroll
  for (int u = 0; u < 9; ++u) {
    const int r = er + u;  // rows >= m_b may hold padding: never read them
    s_rows[u] = r < mb ? load_raw<T, 4>(Sl + (size_t)r * p.H, col, p.H, p.vec_ok) : raw_zero<T, 4>();
    t_rows[u] = r < mb ? load_raw<T, 4>(Tl + (size_t)r * p.H, col, p.H, p.vec_ok) : raw_zero<T, 4>();
  }
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int i = er + u;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (i < nb) {
      float ds[4], dt[4];
      diff(s_rows[u + 1], s_rows[u], ds);
      diff(t_rows[u + 1], t_rows[u], dt);
      const float be = beta_s[i], ga = gamma_s[i];
      v = *reinterpret_cast<const float4*>(Cs + i * kLdc + ec);
      v.x += ga * dt[0] - be * ds[0];
      v.y += ga * dt[1] - be * ds[1];
      v.z += ga * dt[2] - be * ds[2];
      v.w += ga * dt[3] - be * ds[3];
    }
    *reinterpret_cast<float4*>(Cs + i * kLdc + ec) = v;
  }
  __syncthreads();

  // 2. (Eq. Δh transposed): gh_j = gΔ_{j-1} - gΔ_j, every row j < m written.
  if (col >= p.H) return;
  T* G_out = static_cast<T*>(p.grad) + layer * layer_stride + sample_off;
  const int n_cols = min(4, p.H - col);
  for (int u = 0; u < 8; ++u) {
    const int j = er + u;
    if (j >= p.m) break;
    const float4 hi = *reinterpret_cast<const float4*>(Cs + j * kLdc + ec);
    const float4 lo = j > 0 ? *reinterpret_cast<const float4*>(Cs + (j - 1) * kLdc + ec) : make_float4(0.f, 0.f, 0.f, 0.f);
    const T e[4] = {from_f<T>(lo.x - hi.x), from_f<T>(lo.y - hi.y), from_f<T>(lo.z - hi.z), from_f<T>(lo.w - hi.w)};
    T* dst = G_out + (size_t)j * p.H + col;
    if (p.vec_ok && n_cols == 4) {
      if constexpr (sizeof(T) == 4) {
        float4 packed;
        memcpy(&packed, e, 16);
        *reinterpret_cast<float4*>(dst) = packed;
      } else {
        uint2 packed;
        memcpy(&packed, e, 8);
        *reinterpret_cast<uint2*>(dst) = packed;
      }
    } else {
      for (int c = 0; c < n_cols; ++c) dst[c] = e[c];
    }
  }
}

#ifndef PHF_FLOW_CPU_EMULATION
template <typename T, int MODE>
cudaError_t launch_backward_typed(const FlowParams& p, cudaStream_t stream) {
  auto kernel = flow_backward_kernel<T, MODE>;
  constexpr int smem = backward_smem_bytes<MODE>();
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const long long grid = (long long)p.n_layers * p.B * ceil_div(p.H, kHt);
  if (grid == 0) return cudaSuccess;
  kernel<<<(unsigned)grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <int MODE>
cudaError_t launch_backward(const FlowParams& p, DType dtype, cudaStream_t stream) {
  return by_dtype(dtype, [&](auto tag) { return launch_backward_typed<decltype(tag), MODE>(p, stream); });
}
#endif  // PHF_FLOW_CPU_EMULATION

}  // namespace phf_flow
