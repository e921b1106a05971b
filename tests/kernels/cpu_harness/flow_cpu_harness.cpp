// Runs the real csrc/ kernels on the CPU (tests/kernels/test_cpu_harness.py drives it), with
// the launch configuration of the GPU build (threads per CTA, dynamic shared memory bytes).
//
//   flow_cpu_harness IN OUT
//
// IN (little-endian): int32 header[13] = dtype (0 f32, 1 f16, 2 bf16), L, B, m, H, n_tasks,
// n_layers, n_pairs, need_dir, need_geo, mode, n_chunks, slots; float32 eps; then student and
// teacher (raw elements), lengths int32[B], meta int32[...], g_dir, g_geo float32[nL*B],
// g_adj float32[nP*B]. OUT: dir, geo float32[nL*B], adj float32[nP*B], grad (raw elements),
// int32 n_chunks used. Outputs start as NaN (poisoned) as in the binding's poison mode; the
// workspace is sized exactly, so AddressSanitizer sees any out-of-bounds access.
#include "cuda_cpu_shim.h"
// clang-format off
#include "flow_backward.cuh"
#include "flow_products.cuh"
#include "flow_finalize.cu"
// clang-format on

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

using namespace phf_flow;

namespace {

struct Reader {
  std::vector<char> data;
  size_t pos = 0;
  template <typename T>
  std::vector<T> take(size_t n) {
    if (pos + n * sizeof(T) > data.size()) phf_emu::fail("input file too short");
    std::vector<T> out(n);
    if (n) std::memcpy(out.data(), data.data() + pos, n * sizeof(T));
    pos += n * sizeof(T);
    return out;
  }
};

template <typename T>
void fill_nan(T* p, size_t n);
template <>
void fill_nan<float>(float* p, size_t n) {
  std::fill(p, p + n, std::numeric_limits<float>::quiet_NaN());
}
template <>
void fill_nan<__half>(__half* p, size_t n) {
  std::fill(p, p + n, __float2half_rn(std::numeric_limits<float>::quiet_NaN()));
}
template <>
void fill_nan<__nv_bfloat16>(__nv_bfloat16* p, size_t n) {
  std::fill(p, p + n, __float2bfloat16_rn(std::numeric_limits<float>::quiet_NaN()));
}

template <typename T, int MODE>
void run(FlowParams p, Reader& in, std::ofstream& out, int slots) {
  const size_t numel = (size_t)p.L * p.B * p.m * p.H;
  auto student = in.take<T>(numel);
  auto teacher = in.take<T>(numel);
  auto lengths = in.take<int>(p.B);
  auto meta = in.take<int>(meta_length(p.n_tasks, p.n_layers, p.n_pairs));
  auto g_dir = in.take<float>((size_t)p.n_layers * p.B);
  auto g_geo = in.take<float>((size_t)p.n_layers * p.B);
  auto g_adj = in.take<float>((size_t)p.n_pairs * p.B);
  p.student = student.data();
  p.teacher = teacher.data();
  p.lengths = lengths.data();
  p.vec_ok = p.H % 4 == 0;  // std::vector storage is 16-byte aligned
  bind_plan(p, meta.data(), p.n_tasks, p.n_layers, p.n_pairs);

  std::vector<float> mats(mats_count(p) * p.B * kMat, 0.f), stats(stats_floats(p), 0.f);
  std::vector<float> vecs(vecs_floats(p)), dir((size_t)p.n_layers * p.B), geo(dir.size()), adj((size_t)p.n_pairs * p.B);
  fill_nan(vecs.data(), vecs.size());
  fill_nan(dir.data(), dir.size());
  fill_nan(geo.data(), geo.size());
  fill_nan(adj.data(), adj.size());
  bind_workspace(p, mats.data(), stats.data(), vecs.data());
  p.out_dir = dir.data();
  p.out_geo = geo.data();
  p.out_adj = adj.data();
  set_chunks(p, slots);

  phf_emu::launch((long long)p.n_tasks * p.B * p.n_chunks, kThreads, products_smem_bytes<MODE>(),
                  [&] { flow_products_kernel<T, MODE>(p); });
  phf_emu::launch((long long)(p.n_layers + p.n_pairs) * p.B, kFinalizeThreads, kFinalizeSmem,
                  [&] { flow_finalize_kernel(p); });

  std::vector<T> grad(numel);
  fill_nan(grad.data(), grad.size());
  std::vector<bool> selected(p.L, false);
  for (int i = 0; i < p.n_layers; ++i) selected[p.layer_ids[i]] = true;
  for (int l = 0; l < p.L; ++l)
    if (!selected[l]) std::memset(grad.data() + (size_t)l * p.B * p.m * p.H, 0, sizeof(T) * p.B * p.m * p.H);
  p.grad = grad.data();
  p.g_dir = g_dir.data();
  p.g_geo = g_geo.data();
  p.g_adj = g_adj.data();
  phf_emu::launch((long long)p.n_layers * p.B * ceil_div(p.H, kHt), kThreads, backward_smem_bytes<MODE>(),
                  [&] { flow_backward_kernel<T, MODE>(p); });

  out.write(reinterpret_cast<const char*>(dir.data()), dir.size() * 4);
  out.write(reinterpret_cast<const char*>(geo.data()), geo.size() * 4);
  out.write(reinterpret_cast<const char*>(adj.data()), adj.size() * 4);
  out.write(reinterpret_cast<const char*>(grad.data()), grad.size() * sizeof(T));
  out.write(reinterpret_cast<const char*>(&p.n_chunks), 4);
}

template <typename T>
void by_mode(int mode, FlowParams p, Reader& in, std::ofstream& out, int slots) {
  switch (mode) {
    case kSimt: return run<T, kSimt>(p, in, out, slots);
    case kBf16: return run<T, kBf16>(p, in, out, slots);
    case kTf32x3: return run<T, kTf32x3>(p, in, out, slots);
    case kBf16x3: return run<T, kBf16x3>(p, in, out, slots);
  }
  phf_emu::fail("unknown mode");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
    return 2;
  }
  std::ifstream f(argv[1], std::ios::binary);
  Reader in{std::vector<char>(std::istreambuf_iterator<char>(f), {})};
  const auto h = in.take<int>(13);
  FlowParams p;
  p.L = h[1], p.B = h[2], p.m = h[3], p.H = h[4];
  p.n_tasks = h[5], p.n_layers = h[6], p.n_pairs = h[7];
  p.need_dir = h[8] != 0, p.need_geo = h[9] != 0;
  p.n_chunks = h[11];
  p.eps = in.take<float>(1)[0];
  std::ofstream out(argv[2], std::ios::binary);
  switch (h[0]) {
    case 0: by_mode<float>(h[10], p, in, out, h[12]); break;
    case 1: by_mode<__half>(h[10], p, in, out, h[12]); break;
    case 2: by_mode<__nv_bfloat16>(h[10], p, in, out, h[12]); break;
    default: phf_emu::fail("unknown dtype");
  }
  return 0;
}
