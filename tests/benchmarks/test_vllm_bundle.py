"""The vLLM bundle's strip / pack / assemble (benchmarks/gpu/bundle.py) on a small synthetic wheel.

The real bundle (vllm 0.24.0 + dependencies, ~450 MB unpacked) is built by hand with
``benchmarks/gpu/vllm_bundle.sh``; here a wheel with the same layout (random, incompressible
payloads at the stripped and the kept paths) goes through the same pip install --target, strip,
xz + split and reassembly.
"""

import hashlib
import os
import subprocess
import sys
import zipfile

import pytest

from benchmarks.gpu import bundle

KEPT = ["vllm/__init__.py", "vllm/_C_stable_libtorch.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        "vllm/vllm_flash_attn/flash_attn_interface.py", "vllm/third_party/pynvml.py",
        "vllm/third_party/triton_kernels/__init__.py", "vllm/cumem_allocator.abi3.so",
        "vllm/model_executor/layers/fused_moe/configs/README"]
STRIPPED = ["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm_flash_attn/cute/interface.py",
            "vllm/_moe_C_stable_libtorch.abi3.so", "vllm/vllm-rs", "vllm/third_party/deep_gemm/include/cute/a.hpp",
            "vllm/third_party/fmha_sm100/cutlass/include/b.hpp", "vllm/_flashmla_C.abi3.so",
            "vllm/model_executor/layers/fused_moe/configs/E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json"]


def _wheel(path, size=96 << 10):
    with zipfile.ZipFile(path, "w") as z:
        for i, name in enumerate(KEPT + STRIPPED):
            z.writestr(name, os.urandom(size if name.endswith((".so", "vllm-rs")) else 512 + i))
        info = "vllm-0.0.1.dist-info"
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: vllm\nVersion: 0.0.1\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp38-abi3-linux_x86_64\n")
        z.writestr(f"{info}/RECORD", "")


def _tree(root):
    return {os.path.relpath(os.path.join(d, f), root): hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()
            for d, _, fs in os.walk(root) for f in fs}


@pytest.mark.parametrize("total, part, room", [(120_059_428, 60 << 20, int(1.9 * 2**20)), (100, 60, 0), (100, 60, 29),
                                               (60, 60, 0), (61, 60, 10), (7, 60, 29), (1000, 60, 20)])
def test_part_sizes_leave_the_first_part_room_and_share_the_rest(total, part, room):
    """The lease's call 1 carries the megatron-core wheel beside part 00, call 2 only math-verify: even parts left
    call 1 0.5 MiB under the run tool's 64 MiB and call 2 2.5 MiB; part 00 smaller by the difference evens them."""
    sizes = bundle.part_sizes(total, part, room)
    assert sum(sizes) == total and max(sizes) <= part and min(sizes) > 0
    assert len(sizes) == max(1, -(-(total + room) // part))   # as few parts as hold the total and the room
    if len(sizes) > 1:
        loads = [sizes[0] + room, *sizes[1:]]   # what each call carries of the bundle and beside it
        assert max(loads) - min(loads) <= len(sizes)
    with pytest.raises(ValueError, match="first_room"):
        bundle.part_sizes(total, part, part // 2)


def test_strip_pack_and_assemble_round_trip_in_parts_under_the_limit(tmp_path):
    whl = tmp_path / "vllm-0.0.1-cp38-abi3-linux_x86_64.whl"
    _wheel(whl)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(whl)], check=True)
    removed = bundle.strip(str(site))
    files = _tree(site)
    assert all(k in files for k in KEPT) and not any(s in files for s in STRIPPED)
    assert {r["pattern"] for r in removed} >= {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/third_party/deep_gemm",
                                                "vllm/model_executor/layers/fused_moe/configs/*.json"}
    assert all(r["bytes"] > 0 and r["reason"] for r in removed)

    limit = 100 << 10
    out = tmp_path / "parts"
    manifest = bundle.pack(str(site), str(out), part_bytes=limit, level=1, extra={"removed": removed})
    sizes = [os.path.getsize(out / p["name"]) for p in manifest["parts"]]
    assert len(sizes) >= 3 and max(sizes) <= limit and sizes == [p["bytes"] for p in manifest["parts"]]
    assert manifest["files"] == len(files) and manifest["removed"] == removed

    bundle.assemble(str(out), str(tmp_path / "target"))
    assert _tree(tmp_path / "target") == files
    room = 20 << 10   # part 00 smaller by this: the same tree again
    roomy = bundle.pack(str(site), str(tmp_path / "roomy"), part_bytes=limit, level=1, first_room=room)
    sizes = [p["bytes"] for p in roomy["parts"]]
    assert sum(sizes) == roomy["archive_bytes"] == manifest["archive_bytes"] and max(sizes) <= limit
    assert abs(sizes[0] + room - sizes[1]) <= len(sizes) and max(sizes[1:]) - min(sizes[1:]) <= 1
    bundle.assemble(str(tmp_path / "roomy"), str(tmp_path / "roomy_target"))
    assert _tree(tmp_path / "roomy_target") == files

    part = out / manifest["parts"][1]["name"]
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(ValueError, match=f"{part.name}: size or sha256 differs"):
        bundle.assemble(str(out), str(tmp_path / "again"))
    part.unlink()
    with pytest.raises(FileNotFoundError, match="part missing"):
        bundle.assemble(str(out), str(tmp_path / "again"))
