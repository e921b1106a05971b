"""The engine's weight spec (HF names and shapes) and the bucketing of a pushed tensor stream.

A sync pushes HF-named tensors (``model.layers.3.self_attn.q_proj.weight``, ...). Before any
tensor reaches an engine it is checked against the engine's :class:`WeightSpec`: an unknown
name, a wrong shape, a repeated name or a non-floating dtype raises
:class:`~phf_megatron.rollout.errors.WeightMismatchError` naming the tensor.

Fused groups. vLLM stores q/k/v as one ``qkv_proj`` and gate/up as one ``gate_up_proj`` and
reloads a fused parameter only as a whole: pushing ``q_proj`` without ``k_proj``/``v_proj``
would leave the k and v rows uninitialised. :func:`iter_buckets` therefore holds the members
of a fused group until the group is complete and never splits a group across buckets; a
stream that ends with an incomplete group raises, naming the missing members.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import torch

from .errors import EngineStartError, WeightMismatchError

#: Qwen3's fused parameters in vLLM (``Qwen3ForCausalLM.packed_modules_mapping``).
QWEN3_PACKED_MODULES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
#: Tied models: the name a trainer may push that aliases the embedding (accepted, dropped).
TIED_ALIASES = {"lm_head.weight": "model.embed_tokens.weight"}

_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                       "BF16": torch.bfloat16}


@dataclass
class WeightSpec:
    """Names → shapes the engine holds, in HF (checkpoint) naming, plus dropped tied aliases."""

    shapes: dict[str, tuple[int, ...]]
    dtype: torch.dtype | None = None
    tied_aliases: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.shapes:
            raise ValueError("shapes: a weight spec needs at least one tensor")
        for alias, target in self.tied_aliases.items():
            if target not in self.shapes:
                raise ValueError(f"tied_aliases: {alias!r} aliases {target!r}, which is not in the spec")

    @classmethod
    def from_module(cls, module: torch.nn.Module, *, tied: bool = False) -> "WeightSpec":
        """From a live HF model (its state dict, without the tied alias when ``tied``)."""
        sd = module.state_dict()
        aliases = {a: t for a, t in TIED_ALIASES.items() if tied and t in sd}
        shapes = {n: tuple(t.shape) for n, t in sd.items() if n not in aliases}
        dtype = next(iter(sd.values())).dtype
        return cls(shapes=shapes, dtype=dtype, tied_aliases=aliases)

    @classmethod
    def from_hf_dir(cls, model_dir: str) -> "WeightSpec":
        """From the safetensors headers of a HF model directory (reads no tensor data)."""
        files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
        shapes, dtypes = {}, set()
        for f in files:
            for name, (shape, dtype) in _safetensors_header(os.path.join(model_dir, f)).items():
                shapes[name] = shape
                dtypes.add(dtype)
        tied = _config_ties_embeddings(model_dir)   # a head stored beside a tied embedding is an alias too: vLLM
        aliases = {a: t for a, t in TIED_ALIASES.items() if tied and t in shapes}   # ties it (its copy re-derived)
        shapes = {n: s for n, s in shapes.items() if n not in aliases}
        return cls(shapes=shapes, dtype=dtypes.pop() if len(dtypes) == 1 else None, tied_aliases=aliases)

    @classmethod
    def for_engine(cls, model_dir: str, engine: str) -> "WeightSpec":
        """``from_hf_dir`` for an engine starting on ``model_dir``: an unreadable directory is an
        ``EngineStartError`` naming the engine (``engine``) and the directory."""
        try:
            return cls.from_hf_dir(model_dir)
        except (OSError, ValueError) as exc:
            raise EngineStartError(f"{engine}: cannot read the weights of {model_dir!r}: {exc}") from exc

    def check(self, name: str, tensor: torch.Tensor) -> None:
        """Raise WeightMismatchError unless ``tensor`` may be pushed as ``name``."""
        target = self.tied_aliases.get(name, name)
        if target not in self.shapes:
            near = difflib.get_close_matches(name, list(self.shapes), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise WeightMismatchError(name, f"no such tensor in the engine's model{hint}")
        if tuple(tensor.shape) != self.shapes[target]:
            raise WeightMismatchError(
                name, f"shape {tuple(tensor.shape)} does not match the engine's {self.shapes[target]}")
        if not tensor.is_floating_point():
            raise WeightMismatchError(name, f"dtype {tensor.dtype} is not a floating type")


def _safetensors_header(path: str) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: (tuple(v["shape"]), _SAFETENSORS_DTYPES.get(v["dtype"]))
            for k, v in header.items() if k != "__metadata__"}


def _config_ties_embeddings(model_dir: str) -> bool:
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        return bool(json.load(f).get("tie_word_embeddings", False))


def fused_groups(names: Iterable[str], packed: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Map each member name to the full tuple of names of its fused group.

    ``model.layers.0.self_attn.q_proj.weight`` → (…q_proj.weight, …k_proj.weight, …v_proj.weight)
    when all three are in ``names``; names outside any group are absent from the result.
    """
    names = set(names)
    part_to_fused = {part: fused for fused, parts in packed.items() for part in parts}
    pattern = re.compile(r"^(.*)\.(" + "|".join(map(re.escape, part_to_fused)) + r")\.([^.]+)$") if packed else None
    groups: dict[str, tuple[str, ...]] = {}
    for name in names:
        m = pattern.match(name) if pattern else None
        if m is None:
            continue
        prefix, part, suffix = m.groups()
        members = tuple(f"{prefix}.{p}.{suffix}" for p in packed[part_to_fused[part]])
        if all(mm in names for mm in members):
            groups[name] = members
    return groups


def iter_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], spec: WeightSpec, *,
                 bucket_bytes: int, packed: Mapping[str, tuple[str, ...]] | None = None,
                 ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Validate a stream of HF-named tensors and cut it into buckets of about ``bucket_bytes``.

    Order is preserved except that members of a fused group are released together when the
    last one arrives (the producer should emit them consecutively to bound memory). Tied
    aliases (``lm_head.weight`` of a tied model) are checked and dropped. A bucket can exceed
    ``bucket_bytes`` by one tensor or group; a tensor larger than it is a bucket of its own.

    Raises:
        WeightMismatchError: unknown name / wrong shape / repeated name (at that tensor), or an
            incomplete fused group (at the end of the stream, naming the missing members).
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes: must be > 0, got {bucket_bytes}")
    groups = fused_groups(spec.shapes, packed or {})
    pending: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}
    seen: set[str] = set()
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        if name in seen:
            raise WeightMismatchError(name, "pushed twice in one sync")
        seen.add(name)
        spec.check(name, tensor)
        if name in spec.tied_aliases:
            continue
        ready = [(name, tensor)]
        members = groups.get(name)
        if members is not None:
            held = pending.setdefault(members, {})
            held[name] = tensor
            if len(held) < len(members):
                continue
            ready = [(m, held[m]) for m in members]
            del pending[members]
        bucket.extend(ready)
        size += sum(t.numel() * t.element_size() for _, t in ready)
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if pending:
        members, held = next(iter(pending.items()))
        missing = [m for m in members if m not in held]
        raise WeightMismatchError(
            sorted(held)[0], f"fused group incomplete: the engine loads {members} together, "
            f"but {missing} were not pushed in this sync")
    if bucket:
        yield bucket
