// torch binding of the fused flow-loss kernels: argument checks, workspace, launches.
//
//   forward(student, teacher, lengths, meta, n_layers, n_pairs, n_tasks, need_dir, need_geo,
//           eps, mode, n_chunks, poison)
//     -> (dir [nL, B], geo [nL, B], adj [nP, B], mats, stats, vecs, n_chunks_used)
//   backward(student, teacher, lengths, meta, n_layers, n_pairs, n_tasks, layers, need_dir,
//            need_geo, eps, mode, mats, stats, vecs, g_dir, g_geo, g_adj, poison) -> grad
// `mode` is the product mode of flow_params.h (0 = fp32 FMA, 1 = bf16, 2 = 3xTF32, 3 = 3xBF16).
//
// `meta` (int32, on the device) packs the plan built by phf_megatron/kernels/flow_cuda.py:
// tasks [n_tasks, 4], layer_ids [nL], pair_lo [nP], pair_hi [nP], up_pair [nL], dn_pair [nL].
// `poison` fills every output with NaN before the launch so that unwritten elements show.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <limits>
#include <tuple>
#include <vector>

#include "flow_params.h"

namespace {

using phf_flow::DType;
using phf_flow::FlowParams;
constexpr int64_t kTile = phf_flow::kTile;

DType dtype_of(const at::Tensor& x) {
  switch (x.scalar_type()) {
    case at::kFloat: return DType::kF32;
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    default: TORCH_CHECK(false, "student: dtype ", x.scalar_type(), " is not supported (float32, float16, bfloat16)");
  }
  return DType::kF32;
}

void check_inputs(const at::Tensor& s, const at::Tensor& t, const at::Tensor& lengths, const at::Tensor& meta) {
  TORCH_CHECK(s.is_cuda() && t.is_cuda(), "student/teacher: must be CUDA tensors");
  TORCH_CHECK(s.device() == t.device(), "teacher: on ", t.device(), " but student is on ", s.device());
  TORCH_CHECK(s.dim() == 4, "student: expected [L, B, m, H], got ", s.sizes());
  TORCH_CHECK(s.sizes() == t.sizes(), "teacher: shape ", t.sizes(), " does not match student ", s.sizes());
  TORCH_CHECK(s.scalar_type() == t.scalar_type(), "teacher: dtype ", t.scalar_type(), " != student ", s.scalar_type());
  TORCH_CHECK(s.is_contiguous() && t.is_contiguous(), "student/teacher: must be contiguous");
  TORCH_CHECK(s.size(2) >= 1 && s.size(2) <= kTile, "student: the kernel supports 1 <= m <= 128 window positions, got ",
              s.size(2));
  TORCH_CHECK(s.size(3) >= 1 && s.size(3) < (1 << 30), "student: bad hidden size ", s.size(3));
  TORCH_CHECK(lengths.is_cuda() && lengths.scalar_type() == at::kInt && lengths.dim() == 1 &&
                  lengths.size(0) == s.size(1) && lengths.is_contiguous(),
              "lengths: expected int32 [B] on the device");
  TORCH_CHECK(meta.is_cuda() && meta.scalar_type() == at::kInt && meta.is_contiguous(),
              "meta: expected a contiguous int32 tensor on the device");
}

FlowParams make_params(const at::Tensor& s, const at::Tensor& t, const at::Tensor& lengths, const at::Tensor& meta,
                       int64_t n_layers, int64_t n_pairs, int64_t n_tasks, bool need_dir, bool need_geo, double eps) {
  check_inputs(s, t, lengths, meta);
  TORCH_CHECK(meta.numel() == phf_flow::meta_length(n_tasks, n_layers, n_pairs), "meta: ", meta.numel(),
              " entries do not match n_tasks/n_layers/n_pairs");
  FlowParams p;
  p.student = s.data_ptr();
  p.teacher = t.data_ptr();
  p.L = (int)s.size(0);
  p.B = (int)s.size(1);
  p.m = (int)s.size(2);
  p.H = (int)s.size(3);
  const auto align = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  p.vec_ok = p.H % 4 == 0 && align(p.student) && align(p.teacher);
  p.lengths = lengths.data_ptr<int>();
  phf_flow::bind_plan(p, meta.data_ptr<int>(), (int)n_tasks, (int)n_layers, (int)n_pairs);
  p.need_dir = need_dir;
  p.need_geo = need_geo;
  p.eps = (float)eps;
  return p;
}

void bind_workspace(FlowParams& p, const at::Tensor& mats, const at::Tensor& stats, const at::Tensor& vecs) {
  TORCH_CHECK(mats.numel() >= phf_flow::mats_count(p) * p.B * kTile * kTile &&
                  stats.numel() == phf_flow::stats_floats(p) && vecs.numel() == phf_flow::vecs_floats(p),
              "workspace: sizes do not match the plan");
  phf_flow::bind_workspace(p, mats.data_ptr<float>(), stats.data_ptr<float>(), vecs.data_ptr<float>());
}

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "phf flow kernel ", what, " failed: ", cudaGetErrorString(err));
}

// Calls fn(mode) with the mode as a compile-time constant.
template <typename Fn>
cudaError_t by_mode(int64_t mode, Fn&& fn) {
  using phf_flow::kBf16, phf_flow::kBf16x3, phf_flow::kSimt, phf_flow::kTf32x3;
  using std::integral_constant;
  switch (mode) {
    case kSimt: return fn(integral_constant<int, kSimt>{});
    case kBf16: return fn(integral_constant<int, kBf16>{});
    case kTf32x3: return fn(integral_constant<int, kTf32x3>{});
    case kBf16x3: return fn(integral_constant<int, kBf16x3>{});
  }
  TORCH_CHECK(false, "mode: unknown product mode ", mode, " (0 = fp32 FMA, 1 = bf16, 2 = 3xTF32, 3 = 3xBF16)");
  return cudaErrorInvalidValue;
}

at::Tensor new_output(at::IntArrayRef shape, const at::TensorOptions& opts, bool poison) {
  at::Tensor x = at::empty(shape, opts);
  if (poison) x.fill_(std::numeric_limits<float>::quiet_NaN());
  return x;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t> flow_forward(
    const at::Tensor& student, const at::Tensor& teacher, const at::Tensor& lengths, const at::Tensor& meta,
    int64_t n_layers, int64_t n_pairs, int64_t n_tasks, bool need_dir, bool need_geo, double eps, int64_t mode,
    int64_t n_chunks, bool poison) {
  const c10::cuda::CUDAGuard guard(student.device());
  FlowParams p = make_params(student, teacher, lengths, meta, n_layers, n_pairs, n_tasks, need_dir, need_geo, eps);
  const auto f32 = student.options().dtype(at::kFloat);
  const int64_t B = p.B;
  const int64_t n_mats = phf_flow::mats_count(p);
  at::Tensor mats = at::zeros({std::max<int64_t>(n_mats, 1), B, kTile, kTile}, f32);  // accumulated into
  at::Tensor stats = at::zeros({3, n_layers, B, kTile}, f32);                          // accumulated into
  at::Tensor vecs = new_output({2 * n_layers + 2 * n_pairs, B, kTile}, f32, poison);
  at::Tensor dir = new_output({n_layers, B}, f32, poison);
  at::Tensor geo = new_output({n_layers, B}, f32, poison);
  at::Tensor adj = new_output({n_pairs, B}, f32, poison);
  bind_workspace(p, mats, stats, vecs);
  p.out_dir = dir.data_ptr<float>();
  p.out_geo = geo.data_ptr<float>();
  p.out_adj = adj.data_ptr<float>();
  p.n_chunks = (int)n_chunks;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const DType dtype = dtype_of(student);
  check_launch(by_mode(mode, [&](auto m) { return phf_flow::launch_products<decltype(m)::value>(p, dtype, stream); }),
               "products");
  check_launch(phf_flow::launch_finalize(p, stream), "finalize");
  return {dir, geo, adj, mats, stats, vecs, (int64_t)p.n_chunks};
}

at::Tensor flow_backward(const at::Tensor& student, const at::Tensor& teacher, const at::Tensor& lengths,
                         const at::Tensor& meta, int64_t n_layers, int64_t n_pairs, int64_t n_tasks,
                         const std::vector<int64_t>& layers, bool need_dir, bool need_geo, double eps, int64_t mode,
                         const at::Tensor& mats, const at::Tensor& stats, const at::Tensor& vecs,
                         const at::Tensor& g_dir, const at::Tensor& g_geo, const at::Tensor& g_adj, bool poison) {
  const c10::cuda::CUDAGuard guard(student.device());
  FlowParams p = make_params(student, teacher, lengths, meta, n_layers, n_pairs, n_tasks, need_dir, need_geo, eps);
  TORCH_CHECK((int64_t)layers.size() == n_layers, "layers: ", layers.size(), " entries, expected ", n_layers);
  for (const at::Tensor* g : {&g_dir, &g_geo, &g_adj})
    TORCH_CHECK(g->is_cuda() && g->scalar_type() == at::kFloat && g->is_contiguous(),
                "g_*: upstream gradients must be contiguous float32 on the device");
  TORCH_CHECK(g_dir.numel() == n_layers * p.B && g_geo.numel() == n_layers * p.B && g_adj.numel() == n_pairs * p.B,
              "g_*: upstream gradients must be [n_layers, B] / [n_pairs, B]");
  bind_workspace(p, mats, stats, vecs);
  p.g_dir = g_dir.data_ptr<float>();
  p.g_geo = g_geo.data_ptr<float>();
  p.g_adj = g_adj.data_ptr<float>();

  at::Tensor grad = at::empty_like(student);
  if (poison) grad.fill_(std::numeric_limits<float>::quiet_NaN());
  std::vector<bool> selected(p.L, false);
  for (int64_t l : layers) {
    TORCH_CHECK(l >= 0 && l < p.L, "layers: index ", l, " outside [0, ", p.L, ")");
    selected[l] = true;
  }
  for (int64_t l = 0; l < p.L; ++l)
    if (!selected[l]) grad.select(0, l).zero_();  // layers outside the plan get no gradient
  p.grad = grad.data_ptr();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const DType dtype = dtype_of(student);
  check_launch(by_mode(mode, [&](auto m) { return phf_flow::launch_backward<decltype(m)::value>(p, dtype, stream); }),
               "backward");
  return grad;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Fused CUDA kernels of the PHF hidden flow loss (forward terms and student gradient)";
  m.def("forward", &flow_forward, "per-term flow loss values and the backward's workspace");
  m.def("backward", &flow_backward, "gradient of the flow terms with respect to the student");
}
