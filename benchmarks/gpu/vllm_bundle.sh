#!/usr/bin/env bash
# Build the vLLM bundle for the GPU test machine (no network, <= 64 MiB of files per command).
# Run on a CPU machine with pip and network, from the repository root:
#
#   bash benchmarks/gpu/vllm_bundle.sh [OUT=.vllm_bundle]
#
# 1. downloads vllm==0.24.0 (built for torch 2.11, the GPU image's) and the packages an offline
#    vllm.LLM imports that the image lacks (benchmarks/gpu/vllm_bundle_requirements.txt), as
#    CPython 3.12 manylinux x86_64 wheels, without dependencies;
# 2. installs them into a staging tree (pip --target) and strips what a dense Qwen3 on Hopper
#    never loads (bundle.py STRIP: FA2, FA4, MoE, FlashMLA, DeepGEMM, SM100 attention, the Rust
#    server front end, their headers), recording each removal's size and why;
# 3. tars + xz's the tree and cuts it into parts of at most 60 MiB under OUT (git-ignored),
#    with OUT/manifest.json (sha256 of every part);
# 4. downloads the project's own wheels the image lacks (project_wheels.txt) into OUT;
# 5. writes OUT/packing_mix.json: the real length mix of the 1.7B preset (Qwen3 tokenizer, 6 steps) for
#    main_job.sh's `packing` stage, which runs before the bundle (and its tokenizer) is installed.
# On the GPU machine: benchmarks/gpu/vllm_bundle_install.sh (the run-tool call sequence is in
# benchmarks/gpu/README.md). Takes ~3 min here (download ~300 MB, xz -9 of ~450 MB).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${1:-.vllm_bundle}
WORK=${WORK:-${TMPDIR:-/tmp}/phf_vllm_bundle}
PY=${PYTHON:-python3}
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any; do PLATFORM+=(--platform "$p"); done
rm -rf "$WORK/site" && mkdir -p "$WORK/wheels" "$WORK/site"
"$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$WORK/wheels" -r benchmarks/gpu/vllm_bundle_requirements.txt
"$PY" -m pip install -q --no-deps --no-compile --ignore-requires-python "${PLATFORM[@]}" --target "$WORK/site" "$WORK"/wheels/*.whl
"$PY" benchmarks/gpu/bundle.py strip "$WORK/site" --record "$WORK/strip.json"
# part 00 1.9 MiB smaller: call 1 carries the megatron-core wheel (2.3 MiB) beside it, call 2 math-verify (0.4 MiB)
"$PY" benchmarks/gpu/bundle.py pack "$WORK/site" "$OUT" --part-mib 60 --first-part-room-mib 1.9 --extra "$WORK/strip.json"
# the project's own wheels travel beside the parts (call 1 installs them): benchmarks/gpu/project_wheels.txt
rm -f "$OUT"/*.whl
"$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$OUT" -r benchmarks/gpu/project_wheels.txt
"$PY" -m benchmarks.packing --configs configs/phf_qwen3_1p7b.yaml --steps 6 --out "$OUT/packing_mix.json" >/dev/null
ls -l "$OUT"
