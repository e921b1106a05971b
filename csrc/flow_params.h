// Host/device contract of the fused flow-loss kernels (no CUDA or torch types beyond cudaStream_t).
//
// Notation (paper Section 3.2): inputs h[l, b, i, :] of shape [L, B, m, H]; per sample b the
// valid window is a prefix of length m_b and n_b = m_b - 1 transitions
//     Δh_i = h_{i+1} - h_i,   d_i = Δh_i / (||Δh_i|| + eps),   D = stack(d_i)  [n_b x H].
// Per selected layer l: L_dir(l) = 1/n sum_i (1 - <d^S_i, d^T_i>),
//                       L_geo(l) = ||D^S D^S^T - D^T D^T^T||_F^2 / n^2,
// per pair p = (l, l+1): L_adj(p) = ||D^S_l D^S_{l+1}^T - D^T_l D^T_{l+1}^T||_F^2 / n^2.
// The kernels return these per (layer, sample) / (pair, sample) terms; the Python side
// averages them exactly as phf_megatron.objectives.flow does.
#pragma once

#include <cuda_runtime_api.h>

namespace phf_flow {

constexpr int kTile = 128;       // transitions per (layer, sample), zero-padded: m - 1 <= 127
constexpr int kMat = kTile * kTile;
constexpr int kChunkAlign = 64;  // hidden-axis chunks are multiples of every mode's K step

enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// How the 128x128 products are computed (fp32 accumulation in every mode; see warp_tile.cuh):
//   kSimt   - fp32 FMA on CUDA cores (plain fp32; the fallback / cross-check);
//   kBf16   - operands (Δh, coef·W') rounded to bf16, bf16 tensor cores (mma m16n8k16):
//             fastest, ~2^-9 operand error;
//   kBf16x3 - operands split x = hi + lo (both bf16), lo*hi + hi*lo + hi*hi on bf16 tensor
//             cores: ~2^-17 operand error; the default for bf16/fp16 inputs;
//   kTf32x3 - operands split x = big + small (both TF32), small*big + big*small + big*big on
//             TF32 tensor cores (mma m16n8k8), summed into an fp32 register accumulator every
//             K step: fp32-level accuracy; the default for fp32 inputs.
enum Mode : int { kSimt = 0, kBf16 = 1, kTf32x3 = 2, kBf16x3 = 3 };

// Forward product tasks, one 128x128 product each (see flow_products.cuh).
enum TaskKind : int { kGramS = 0, kGramT = 1, kCrossS = 2, kCrossT = 3 };

struct FlowParams {
  // Inputs [L, B, m, H], contiguous, element type given by DType; grad has the student's layout.
  const void* student = nullptr;
  const void* teacher = nullptr;
  void* grad = nullptr;
  int L = 0, B = 0, m = 0, H = 0;
  bool vec_ok = false;  // H % 4 == 0 and 16-byte aligned bases: 4-element vector loads are legal
  const int* lengths = nullptr;  // [B] m_b (valid prefix length)

  // Plan tables (device int32). Positions index the selected layers 0..n_layers-1.
  const int* tasks = nullptr;  // [n_tasks, 4]: kind, layer_a, layer_b (global layer ids), slot
  int n_tasks = 0;
  const int* layer_ids = nullptr;  // [n_layers] global layer of each position
  const int* pair_lo = nullptr;    // [n_pairs] position of the lower layer of pair p
  const int* pair_hi = nullptr;    // [n_pairs] position of the upper layer
  const int* up_pair = nullptr;    // [n_layers] pair whose lower layer is this position, or -1
  const int* dn_pair = nullptr;    // [n_layers] pair whose upper layer is this position, or -1
  int n_layers = 0, n_pairs = 0;
  bool need_dir = false, need_geo = false;
  float eps = 1e-6f;

  // Workspace (fp32). Matrices are [slot, B, 128, 128]; vectors [slot, B, 128].
  float* rs = nullptr;  // raw Δh^S Δh^S^T per layer; finalize overwrites it with W'_geo
  float* rt = nullptr;  // raw Δh^T Δh^T^T per layer
  float* xs = nullptr;  // raw Δh^S_l Δh^S_{l+1}^T per pair; finalize overwrites it with W'_up
  float* xt = nullptr;  // raw Δh^T_l Δh^T_{l+1}^T per pair; finalize overwrites it with W'_dn
  float* nsq_s = nullptr;   // ||Δh^S_i||^2       [n_layers, B, 128]
  float* nsq_t = nullptr;   // ||Δh^T_i||^2
  float* dot_st = nullptr;  // <Δh^S_i, Δh^T_i>
  float* cos = nullptr;      // <d^S_i, d^T_i>                     [n_layers, B, 128]
  float* rho_geo = nullptr;  // sum_j E_ij G^S_ij                   [n_layers, B, 128]
  float* rho_up = nullptr;   // sum_j F_ij C^S_ij   (row sums)      [n_pairs, B, 128]
  float* rho_dn = nullptr;   // sum_i F_ij C^S_ij   (column sums)   [n_pairs, B, 128]

  // Outputs: per-term values [n_layers, B] / [n_pairs, B].
  float* out_dir = nullptr;
  float* out_geo = nullptr;
  float* out_adj = nullptr;

  // Split of the hidden axis over CTAs in the forward products (0 = choose automatically).
  int n_chunks = 0, chunk_cols = 0;

  // Backward: upstream gradients of the terms (fp32, same shapes as the outputs).
  const float* g_dir = nullptr;
  const float* g_geo = nullptr;
  const float* g_adj = nullptr;
};

// ----------------------------------------------------------------------------- host helpers
// Shared by the torch binding (flow_binding.cpp) and the CPU test harness, so both run the
// same plan/workspace layout.

inline int ceil_div_host(int a, int b) { return (a + b - 1) / b; }

// `meta` packs tasks [n_tasks, 4], layer_ids [nL], pair_lo [nP], pair_hi [nP], up [nL], dn [nL].
inline long long meta_length(long long n_tasks, long long n_layers, long long n_pairs) {
  return 4 * n_tasks + 3 * n_layers + 2 * n_pairs;
}

inline void bind_plan(FlowParams& p, const int* meta, int n_tasks, int n_layers, int n_pairs) {
  p.tasks = meta;
  p.layer_ids = meta + 4 * n_tasks;
  p.pair_lo = p.layer_ids + n_layers;
  p.pair_hi = p.pair_lo + n_pairs;
  p.up_pair = p.pair_hi + n_pairs;
  p.dn_pair = p.up_pair + n_layers;
  p.n_tasks = n_tasks;
  p.n_layers = n_layers;
  p.n_pairs = n_pairs;
}

// Workspace sizes in floats. mats: [RS (nL) | RT (nL) if need_geo][XS (nP) | XT (nP)] x [B, 128, 128]
// (zeroed: accumulated into); stats: [3, nL, B, 128] = (||Δh^S||², ||Δh^T||², <Δh^S, Δh^T>)
// (zeroed); vecs: [2 nL + 2 nP, B, 128] = (cos, rho_geo, rho_up, rho_dn) (written).
inline long long mats_count(const FlowParams& p) { return (p.need_geo ? 2LL * p.n_layers : 0) + 2LL * p.n_pairs; }
inline long long stats_floats(const FlowParams& p) { return 3LL * p.n_layers * p.B * kTile; }
inline long long vecs_floats(const FlowParams& p) { return (2LL * p.n_layers + 2LL * p.n_pairs) * p.B * kTile; }

inline void bind_workspace(FlowParams& p, float* mats, float* stats, float* vecs) {
  const long long mat = (long long)p.B * kMat, vec = (long long)p.B * kTile;
  if (p.need_geo) {
    p.rs = mats;
    p.rt = mats + p.n_layers * mat;
    mats += 2 * p.n_layers * mat;
  }
  p.xs = mats;
  p.xt = mats + p.n_pairs * mat;
  p.nsq_s = stats;
  p.nsq_t = stats + p.n_layers * vec;
  p.dot_st = stats + 2 * p.n_layers * vec;
  p.cos = vecs;
  p.rho_geo = vecs + p.n_layers * vec;
  p.rho_up = vecs + 2 * p.n_layers * vec;
  p.rho_dn = p.rho_up + p.n_pairs * vec;
}

// How many CTAs share one task's hidden axis: more chunks fill the GPU in fewer, fuller waves
// but cost atomics. A wave model: time ~ ceil(work * c / slots) / c.
inline int choose_chunks(int work, int slots, int max_chunks) {
  int best = 1;
  double best_cost = 1e30;
  for (int c = 1; c <= 8 && c <= max_chunks; ++c) {
    const double waves = (double)ceil_div_host(work * c, slots);
    const double cost = waves / c * (1.0 + 0.03 * (c - 1));
    if (cost < best_cost - 1e-9) {
      best_cost = cost;
      best = c;
    }
  }
  return best;
}

// Fix p.n_chunks (requested, or <= 0 for automatic given `slots` concurrent CTAs) and
// p.chunk_cols (a multiple of kChunkAlign); no chunk is empty.
inline void set_chunks(FlowParams& p, int slots) {
  const int max_chunks = ceil_div_host(p.H, kChunkAlign);
  if (p.n_chunks <= 0) p.n_chunks = choose_chunks(p.n_tasks * p.B, slots > 0 ? slots : 1, max_chunks);
  if (p.n_chunks > max_chunks) p.n_chunks = max_chunks;
  p.chunk_cols = ceil_div_host(ceil_div_host(p.H, p.n_chunks), kChunkAlign) * kChunkAlign;
  p.n_chunks = ceil_div_host(p.H, p.chunk_cols);
}

// Forward pass 1: all 128x128 raw products and row statistics (fills p.n_chunks/chunk_cols).
template <int MODE>
cudaError_t launch_products(FlowParams& p, DType dtype, cudaStream_t stream);

// Forward pass 2: normalize, per-term losses, and the backward's coefficient matrices.
cudaError_t launch_finalize(const FlowParams& p, cudaStream_t stream);

// Backward: d loss / d student for the selected layers.
template <int MODE>
cudaError_t launch_backward(const FlowParams& p, DType dtype, cudaStream_t stream);

}  // namespace phf_flow
