"""Carry an installed Python tree to a machine without network in parts: strip, pack, assemble.

    python benchmarks/gpu/bundle.py strip SITE                      # drop what a dense Qwen3 on Hopper never loads
    python benchmarks/gpu/bundle.py pack SITE OUT [--part-mib 60] [--first-part-room-mib 2.5]   # tar | xz, parts
    python benchmarks/gpu/bundle.py assemble OUT TARGET             # check the parts, unpack into TARGET

``vllm_bundle.sh`` (CPU machine) and ``vllm_bundle_install.sh`` (GPU machine) call these. The
GPU test machine takes at most 64 MiB of files per command, so the bundle travels as parts of
at most 60 MiB, one ``run`` call each (``benchmarks/gpu/README.md``).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

#: (glob relative to the site directory, why a dense Qwen3 on one H100 does without it)
STRIP: list[tuple[str, str]] = [
    ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
     "FlashAttention 2: on SM 9.x vLLM picks FA3 (fa_utils.get_flash_attn_version); needed only on Ampere/Ada "
     "or for ALiBi / batch-invariant mode"),
    ("vllm/vllm_flash_attn/cute",
     "FlashAttention 4 (CuTe DSL, needs nvidia-cutlass-dsl): on SM 9.x only for head_size > 256 or diffusion "
     "models; its presence alone marks FA4 available"),
    ("vllm/_moe_C_stable_libtorch.abi3.so", "mixture-of-experts kernels (fused MoE, top-k routing); "
     "CudaPlatform.import_kernels logs one warning"),
    ("vllm/_qutlass_C.abi3.so", "FP4 quantization kernels (platforms/cuda.py logs one warning at import)"),
    ("vllm/_flashmla_C.abi3.so", "FlashMLA: DeepSeek-style multi-head latent attention"),
    ("vllm/_flashmla_extension_C.abi3.so", "FlashMLA (sparse/FP8 variants)"),
    ("vllm/third_party/flashmla", "FlashMLA's Python interface"),
    ("vllm/third_party/deep_gemm", "DeepGEMM: FP8 block-scaled GEMMs and its CUTLASS headers"),
    ("vllm/third_party/fmha_sm100", "Blackwell (SM 10.x) attention kernels and their CUTLASS headers"),
    ("vllm/vllm-rs", "the Rust API-server front end (VLLM_RUST_FRONTEND_PATH); offline LLM never starts it"),
    ("vllm/_rust_tool_parser.abi3.so", "the server's tool-call parser"),
    ("vllm/model_executor/layers/fused_moe/configs/*.json", "tuned MoE kernel configurations"),
    ("bin", "console scripts (the vllm CLI)"),
    ("xgrammar/lib", "xgrammar's static library (libxgrammar.a, 67 MiB, 29 MiB of xz): for linking against "
     "xgrammar at build time; nothing loads a .a at run time (the bindings .so stays)"),
]


def _size(path: str) -> int:
    if os.path.isfile(path) or os.path.islink(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def strip(site: str, rules: list[tuple[str, str]] = STRIP) -> list[dict]:
    """Delete what ``rules`` match under ``site``; one record (pattern, paths, bytes, reason) per rule that matched."""
    removed = []
    for pattern, reason in rules:
        parent, leaf = os.path.split(pattern)
        base = os.path.join(site, parent)
        names = sorted(fnmatch.filter(os.listdir(base), leaf)) if os.path.isdir(base) else []
        size = 0
        for name in names:
            path = os.path.join(base, name)
            size += _size(path)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
        if names:
            removed.append({"pattern": pattern, "paths": len(names), "bytes": size, "reason": reason})
    return removed


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _compress(src: str, dst: str, level: int) -> None:
    """xz (all cores) when the tool exists, else Python's lzma (same format)."""
    if shutil.which("xz"):
        with open(src, "rb") as fi, open(dst, "wb") as fo:
            subprocess.run(["xz", "-T0", f"-{level}", "-c"], stdin=fi, stdout=fo, check=True)
        return
    import lzma
    with open(src, "rb") as fi, lzma.open(dst, "wb", preset=level) as fo:
        shutil.copyfileobj(fi, fo, 1 << 20)


def part_sizes(total: int, part_bytes: int, first_room: int = 0) -> list[int]:
    """The sizes ``total`` bytes are cut into: as few parts of at most ``part_bytes`` as hold them, the first
    ``first_room`` bytes smaller than the rest (room for what lease call 1 carries beside part 00, the megatron-core
    wheel) and the rest even, so that every call carries about the same."""
    if not 0 <= 2 * first_room < part_bytes:
        raise ValueError(f"first_room: {first_room} bytes must lie in [0, half of a part, {part_bytes} bytes)")
    count = max(1, -(-(total + first_room) // part_bytes))
    if count == 1:
        return [total]
    first = -(-(total + first_room) // count) - first_room   # > 0: the load per call is over half a part
    rest = total - first
    share, extra = divmod(rest, count - 1)
    return [first] + [share + (i < extra) for i in range(count - 1)]


def pack(site: str, out_dir: str, *, part_bytes: int = 60 << 20, name: str = "vllm-bundle", level: int = 9,
         extra: dict | None = None, first_room: int = 0) -> dict:
    """Tar ``site`` (sorted, owner-free), xz it, cut it into parts of at most ``part_bytes`` (``part_sizes``: the
    first ``first_room`` bytes smaller).

    Writes ``out_dir/{name}.tar.xz.partNN`` and ``out_dir/manifest.json`` (part sizes and
    sha256, the whole archive's sha256, unpacked size and file count, plus ``extra``).
    """
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.startswith(f"{name}.tar.xz.part") or f == "manifest.json":
            os.remove(os.path.join(out_dir, f))
    files, unpacked = 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        tar_path, xz_path = os.path.join(tmp, "b.tar"), os.path.join(tmp, "b.tar.xz")
        with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
            for root, dirs, names in os.walk(site):
                dirs.sort()
                for n in sorted(names):
                    path = os.path.join(root, n)
                    info = tar.gettarinfo(path, os.path.relpath(path, site))
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                    files += 1
                    unpacked += info.size
        _compress(tar_path, xz_path, level)
        parts = []
        with open(xz_path, "rb") as f:
            for i, size in enumerate(part_sizes(os.path.getsize(xz_path), part_bytes, first_room)):
                chunk = f.read(size)
                part = f"{name}.tar.xz.part{i:02d}"
                with open(os.path.join(out_dir, part), "wb") as p:
                    p.write(chunk)
                parts.append({"name": part, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
        manifest = {"name": name, "parts": parts, "archive_sha256": _sha256(xz_path),
                    "archive_bytes": os.path.getsize(xz_path), "unpacked_bytes": unpacked, "files": files,
                    "part_limit_bytes": part_bytes, "first_part_room_bytes": first_room, **(extra or {})}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


class _Concat(io.RawIOBase):
    """The parts, read back to back as one stream."""

    def __init__(self, paths: list[str]):
        self._paths, self._f = list(paths), None

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while True:
            if self._f is None:
                if not self._paths:
                    return 0
                self._f = open(self._paths.pop(0), "rb")
            n = self._f.readinto(buf)
            if n:
                return n
            self._f.close()
            self._f = None


def assemble(parts_dir: str, target: str) -> dict:
    """Check every part against the manifest (size, sha256, the whole archive's sha256), then unpack."""
    with open(os.path.join(parts_dir, "manifest.json")) as f:
        manifest = json.load(f)
    whole = hashlib.sha256()
    paths = []
    for part in manifest["parts"]:
        path = os.path.join(parts_dir, part["name"])
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: part missing (copy all {len(manifest['parts'])} parts first)")
        with open(path, "rb") as f:
            data = f.read()
        if len(data) != part["bytes"] or hashlib.sha256(data).hexdigest() != part["sha256"]:
            raise ValueError(f"{path}: size or sha256 differs from manifest.json (a truncated copy?)")
        whole.update(data)
        paths.append(path)
    if whole.hexdigest() != manifest["archive_sha256"]:
        raise ValueError(f"{parts_dir}: the parts do not join into the archive manifest.json names")
    os.makedirs(target, exist_ok=True)
    with tarfile.open(fileobj=io.BufferedReader(_Concat(paths), 1 << 20), mode="r|xz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(target, filter="data")
        else:
            tar.extractall(target)
    return manifest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("strip")
    s.add_argument("site")
    s.add_argument("--record", help="write the removals (path, bytes, reason) to this JSON file")
    k = sub.add_parser("pack")
    k.add_argument("site")
    k.add_argument("out_dir")
    k.add_argument("--part-mib", type=float, default=60.0)
    k.add_argument("--first-part-room-mib", type=float, default=0.0,
                   help="make the first part this much smaller than the rest (what call 1 carries beside it)")
    k.add_argument("--level", type=int, default=9)
    k.add_argument("--extra", help="a JSON file merged into manifest.json (e.g. the strip record)")
    a = sub.add_parser("assemble")
    a.add_argument("parts_dir")
    a.add_argument("target")
    args = p.parse_args(argv)
    if args.cmd == "strip":
        removed = strip(args.site)
        if args.record:
            with open(args.record, "w") as f:
                json.dump({"removed": removed}, f, indent=1)
        for r in removed:
            print(f"removed {r['bytes'] / 2**20:8.1f} MiB  {r['pattern']} ({r['paths']} paths)")
        print(f"removed {sum(r['bytes'] for r in removed) / 2**20:.1f} MiB in all")
    elif args.cmd == "pack":
        extra = json.load(open(args.extra)) if args.extra else None
        m = pack(args.site, args.out_dir, part_bytes=int(args.part_mib * 2**20), level=args.level, extra=extra,
                 first_room=int(args.first_part_room_mib * 2**20))
        for part in m["parts"]:
            print(f"{part['name']}  {part['bytes'] / 2**20:.2f} MiB")
        print(f"{len(m['parts'])} parts, {m['archive_bytes'] / 2**20:.1f} MiB xz, "
              f"{m['unpacked_bytes'] / 2**20:.1f} MiB unpacked, {m['files']} files")
    else:
        m = assemble(args.parts_dir, args.target)
        print(f"unpacked {m['files']} files ({m['unpacked_bytes'] / 2**20:.1f} MiB) into {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
