"""Build a ``TrainConfig`` from a YAML file and command-line overrides; dump and fingerprint it.

Precedence, lowest first: dataclass defaults < YAML < ``--ablation`` < explicit overrides.
Overrides are ``--section.field=value`` / ``--section.field value``, or the bare field name when
it is unique across sections (``--lr 1e-5``, ``--tensor_model_parallel_size 2``). A bool field
given without a value is set to true. Unknown keys raise a ``ValueError`` listing close matches.
Values are converted to the field's type (so YAML's ``5e-6``, a string to PyYAML, is a float).

    cfg = load_config("configs/phf_qwen3_8b.yaml", ["--model.hf_dir=/ckpt/Qwen3-8B", "--lr", "1e-5"])
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import tempfile
import types
import typing
from typing import Any, Sequence

import yaml

from .config import ABLATIONS, TrainConfig

#: Settings that may differ between a checkpoint and the run resuming from it: budgets, paths,
#: logging, and the parallel layout (checkpoint.py checks layouts per part). Everything else
#: changes the math of an update and is part of the resume fingerprint.
RESUME_MUTABLE = (
    "run_dir",
    "training.train_iters",
    "model.hf_dir",
    "model.pretrained_checkpoint",
    "model.tensor_model_parallel_size",
    "model.pipeline_model_parallel_size",
    "model.virtual_pipeline_model_parallel_size",
    "model.sequence_parallel",
    "model.recompute_granularity",
    "model.recompute_method",
    "model.recompute_num_layers",
    "model.transformer_impl",
    "data.path",
    "rollout.gpu_memory_utilization",
    "rollout.enable_sleep_mode",
    "rollout.colocate",
    "rollout.tensor_parallel_size",
    "rollout.verify_sync",
    "rollout.timeout_s",
    "rollout.server_url",
    "rollout.server_weight_transport",
    "rollout.server_nccl_address",
    "rollout.server_nccl_port",
    "rollout.fingerprint_projections",
    "rollout.probe_atol",
    "optimizer.use_distributed_optimizer",
    "checkpoint.",
    "logging.",
)


# ----------------------------------------------------------------------------- schema


def _sections() -> dict[str, type]:
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(TrainConfig) if dataclasses.is_dataclass(hints[f.name])}


def field_types() -> dict[str, Any]:
    """Every settable key (``run_dir``, ``section.field``) and its type annotation."""
    top = typing.get_type_hints(TrainConfig)
    sections = _sections()
    out: dict[str, Any] = {name: tp for name, tp in top.items() if name not in sections}
    for section, cls in sections.items():
        for name, tp in typing.get_type_hints(cls).items():
            out[f"{section}.{name}"] = tp
    return out


def _close(key: str, known: Sequence[str]) -> str:
    leaf_names = sorted({k.rsplit(".", 1)[-1] for k in known})
    matches = difflib.get_close_matches(key, known, n=4, cutoff=0.6)
    matches += [m for m in difflib.get_close_matches(key.rsplit(".", 1)[-1], leaf_names, n=4, cutoff=0.6)
                if m not in matches]
    return f"; did you mean {', '.join(matches)}?" if matches else ""


def resolve_key(key: str, types_: dict[str, Any] | None = None) -> str:
    """The full ``section.field`` for a dotted or unique bare key; ``ValueError`` otherwise."""
    types_ = types_ or field_types()
    if key in types_:
        return key
    owners = [k for k in types_ if k.rsplit(".", 1)[-1] == key]
    if len(owners) == 1:
        return owners[0]
    if len(owners) > 1:
        raise ValueError(f"--{key}: ambiguous, it names {', '.join(owners)}; use the dotted form")
    raise ValueError(f"--{key}: unknown setting{_close(key, list(types_))}")


# ----------------------------------------------------------------------------- values


def _parse_scalar(text: str, tp: type, key: str):
    if tp is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"{key}: expected true/false, got {text!r}")
    try:
        return tp(text)
    except ValueError:
        raise ValueError(f"{key}: expected {tp.__name__}, got {text!r}") from None


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML or command-line value to the annotated type (``X | None``, ``tuple[T, ...]``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "~", "")):
            return None
        return coerce(value, inner[0], key)
    if origin is tuple:
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else value.split(",")
        if not isinstance(value, (list, tuple)):
            value = [value]
        return tuple(coerce(v.strip() if isinstance(v, str) else v, args[0], key) for v in value)
    if isinstance(value, str):
        return _parse_scalar(value, tp, key)
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ValueError(f"{key}: expected {getattr(tp, '__name__', tp)}, got {value!r}")
    return value


# ----------------------------------------------------------------------------- sources


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (tuples and lists are values, not subtrees)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def read_yaml(path: str) -> dict[str, Any]:
    """The YAML file as flat ``section.field`` keys; unknown keys raise naming the file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} does not exist")
    with open(path) as f:
        tree = yaml.safe_load(f) or {}
    if not isinstance(tree, dict):
        raise ValueError(f"{path}: expected a mapping of sections, got {type(tree).__name__}")
    types_ = field_types()
    flat = flatten(tree)
    for key in flat:
        if key not in types_:
            raise ValueError(f"{path}: unknown key {key!r}{_close(key, list(types_))}")
    return flat


def parse_overrides(argv: Sequence[str]) -> dict[str, str | bool]:
    """``["--lr", "1e-5", "--objective.flow_variant=local", "--lora.enabled"]`` -> full keys."""
    types_ = field_types()
    out: dict[str, str | bool] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ValueError(f"unexpected argument {arg!r}: overrides look like --section.field=value")
        body = arg[2:]
        if "=" in body:
            key, value = body.split("=", 1)
        else:
            key, value = body, None
        full = resolve_key(key, types_)
        if value is None:
            nxt = args[i + 1] if i + 1 < len(args) else None
            if types_.get(full) is bool and (nxt is None or nxt.startswith("--")):
                value = True
            elif nxt is None:
                raise ValueError(f"--{key}: missing a value")
            else:
                value, i = nxt, i + 1
        out[full] = value
        i += 1
    return out


def build_config(values: dict[str, Any]) -> TrainConfig:
    """A ``TrainConfig`` from flat ``section.field`` values; errors name the field and flag."""
    types_ = field_types()
    sections = _sections()
    grouped: dict[str, dict[str, Any]] = {name: {} for name in sections}
    top: dict[str, Any] = {}
    for key, raw in values.items():
        full = resolve_key(key, types_)
        value = coerce(raw, types_[full], full)
        section, _, name = full.rpartition(".")
        (grouped[section] if section else top)[name] = value
    built = {}
    for section, cls in sections.items():
        try:
            built[section] = cls(**grouped[section])
        except ValueError as err:
            msg = str(err)
            if not msg.startswith(f"{section}."):  # a section that does not name itself (ObjectiveConfig)
                field_name = msg.split(":", 1)[0]
                msg = f"{section}.{msg} (change it with --{section}.{field_name}=...)"
            raise ValueError(msg) from None
    return TrainConfig(**top, **built)


def load_config(path: str | None = None, argv: Sequence[str] = ()) -> TrainConfig:
    """Defaults < YAML file < ``--ablation`` < command-line overrides."""
    values: dict[str, Any] = read_yaml(path) if path else {}
    overrides = parse_overrides(argv)
    ablation = overrides.get("ablation", values.get("ablation"))
    if ablation not in (None, "none", "null") and ablation not in ABLATIONS:
        raise ValueError(f"ablation: {ablation!r} is not one of {tuple(ABLATIONS)} (change it with --ablation=...)")
    if ablation in ABLATIONS:
        values.update({f"objective.{k}": v for k, v in ABLATIONS[ablation].items()})
    values.update(overrides)
    return build_config(values)


def config_from_argv(argv: Sequence[str]) -> TrainConfig:
    """``[--config FILE] [overrides...]`` -> ``TrainConfig`` (what a trainer's ``main()`` calls)."""
    args = list(argv)
    path = None
    for i, arg in enumerate(args):
        if arg == "--config" or arg.startswith("--config="):
            if arg == "--config":
                if i + 1 >= len(args):
                    raise ValueError("--config: missing a file name")
                path = args[i + 1]
                del args[i:i + 2]
            else:
                path = arg.split("=", 1)[1]
                del args[i]
            break
    return load_config(path, args)


# ----------------------------------------------------------------------------- output

CONFIG_FILE = "config.yaml"


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Nested plain dict (tuples become lists) for YAML/JSON."""
    def plain(x):
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x
    return plain(dataclasses.asdict(cfg))


def _atomic_write_text(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def dump_config(cfg: TrainConfig, path: str) -> None:
    """Write the resolved config as YAML (atomic). ``load_config(path)`` rebuilds it exactly."""
    _atomic_write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def save_run_config(cfg: TrainConfig) -> str | None:
    """Rank 0 writes the resolved config to ``<run_dir>/config.yaml``; returns its path (None elsewhere)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return None
    path = os.path.join(cfg.run_dir, CONFIG_FILE)
    dump_config(cfg, path)
    return path


def resume_fingerprint(cfg: TrainConfig) -> dict[str, Any]:
    """The flat settings a resumed run must share with its checkpoint (all but ``RESUME_MUTABLE``)."""
    flat = flatten(to_dict(cfg))
    return {k: v for k, v in flat.items() if not any(k == m or (m.endswith(".") and k.startswith(m)) for m in RESUME_MUTABLE)}


def fingerprint_hash(fingerprint: dict[str, Any] | None) -> str | None:
    """sha256 (16 hex digits) of a JSON-able settings dict; None for None."""
    if fingerprint is None:
        return None
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_hash(cfg: TrainConfig) -> str:
    """The hash of the resume fingerprint (stored in every checkpoint's meta.json)."""
    return fingerprint_hash(resume_fingerprint(cfg))


def fingerprint_diff(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``"key: saved -> current"`` for every key that differs (missing keys shown as <absent>)."""
    lines = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if a != b:
            lines.append(f"{key}: {a!r} -> {b!r}")
    return lines
