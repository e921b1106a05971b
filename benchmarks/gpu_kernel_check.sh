#!/usr/bin/env bash
# Unattended GPU check of the fused flow-loss kernels: JIT build, GPU tests, benchmark.
#
#   bash benchmarks/gpu_kernel_check.sh OUTDIR
#
# Run from the repository root on a CUDA machine (Python with a CUDA torch, nvcc, triton;
# no internet and no pip install needed: PYTHONPATH=$PWD and a JIT build). Expected time on an
# H100: build ~45 s, tests ~20 s, benchmark ~80 s (torch.compile's first calls dominate); the
# step timeouts (140 + 90 + 110 s) keep the worst case under 6 minutes, and every step leaves
# its log (the benchmark writes its JSON after each measurement). Writes at most 7 files into OUTDIR (flat):
#   env.txt  build.log  pytest_gpu.log  bench.log  flow_kernel.json  flow_kernel.md  summary.txt
set -uo pipefail
OUT=${1:?usage: bash benchmarks/gpu_kernel_check.sh OUTDIR}
mkdir -p "$OUT"
PY=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}   # sm_90 only: H100/H200
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PHF_FLOW_BUILD_DIR=${PHF_FLOW_BUILD_DIR:-/tmp/phf_flow_build}
export PHF_FLOW_PTXAS_VERBOSE=1                           # registers / spills in build.log
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }

{
  date
  nvidia-smi || true
  "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  nvcc --version || true
  "$PY" -c "import triton; print('triton', triton.__version__)" || true
  command -v ninja || "$PY" -c "import ninja; print('ninja (pip)', ninja.__version__)" || echo "no ninja"
  git log --oneline -1 || true
} > "$OUT/env.txt" 2>&1

# 1. Build: the JIT path (needs ninja); without ninja, setup.py builds phf_megatron/_flow_cuda in place.
if command -v ninja >/dev/null 2>&1 || "$PY" -c "import ninja" >/dev/null 2>&1; then
  timeout 140 "$PY" - > "$OUT/build.log" 2>&1 <<'PYEOF'
import time
t = time.time()
from phf_megatron.kernels import loader
module = loader.load_extension(verbose=True)
print("extension:", module, "| reason:", loader.unavailable_reason(), "| %.1f s" % (time.time() - t))
raise SystemExit(0 if module is not None else 1)
PYEOF
else
  PHF_BUILD_CUDA=1 timeout 140 "$PY" setup.py build_ext --inplace > "$OUT/build.log" 2>&1
fi
BUILD_RC=$?
echo "build rc=$BUILD_RC after $(elapsed) s" >> "$OUT/build.log"

# 2. GPU tests (fresh random inputs each run; the seed is in any failure message).
timeout 90 "$PY" -m pytest -m gpu tests/kernels -q -rfE -p no:cacheprovider --durations=5 > "$OUT/pytest_gpu.log" 2>&1
TEST_RC=$?
echo "pytest rc=$TEST_RC after $(elapsed) s" >> "$OUT/pytest_gpu.log"

# 3. Benchmark (writes flow_kernel.json / flow_kernel.md as it goes).
timeout 110 "$PY" -m benchmarks.flow_kernel --out "$OUT" --budget-s 80 > "$OUT/bench.log" 2>&1
BENCH_RC=$?
echo "bench rc=$BENCH_RC after $(elapsed) s" >> "$OUT/bench.log"

{
  echo "build rc=$BUILD_RC  tests rc=$TEST_RC  bench rc=$BENCH_RC  total $(elapsed) s"
  grep -E "registers|spill" "$OUT/build.log" | sort | uniq -c | head -40
  tail -n 15 "$OUT/pytest_gpu.log"
  cat "$OUT/flow_kernel.md" 2>/dev/null || tail -n 30 "$OUT/bench.log"
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
[ "$BUILD_RC" = 0 ] && [ "$TEST_RC" = 0 ] && [ "$BENCH_RC" = 0 ]
