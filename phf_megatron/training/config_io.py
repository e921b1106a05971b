"""Build a ``TrainConfig`` from a YAML file and command-line overrides; dump and fingerprint it.

Precedence, lowest first: dataclass defaults < YAML < ``--ablation`` < explicit overrides.
Overrides are ``--section.field=value`` / ``--section.field value``, or the bare field name when
it is unique across sections (``--lr 1e-5``, ``--tensor_model_parallel_size 2``); the flags, their
conversion to the field types and ``--help`` are ``phf_megatron.cli``'s, generated from the
dataclasses. Unknown keys raise a ``UsageError`` listing close matches, bad values a
``ConfigError`` naming the field (YAML's ``5e-6``, a string to PyYAML, is a float).

    cfg = load_config("configs/phf_qwen3_8b.yaml", ["--model.hf_dir=/ckpt/Qwen3-8B", "--lr", "1e-5"])
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import textwrap
from typing import Any, Sequence

import yaml

from ..cli import HELP_FLAGS, Settings, coerce, did_you_mean, resolve_key  # noqa: F401 - resolve_key: this module's API
from ..errors import ConfigError, InputFileError, UsageError
from ..input_files import (
    META_FILE, RUN_CONFIG_FILE, checkpoint_saved, iter_dir_name, load_yaml, read_json, read_latest,
)
from ..output_files import write_text
from .config import ABLATIONS, LoraConfig, TrainConfig, written_model_format
from .moved_run import PATH_SETTINGS, is_run_config, moved_run

#: Settings that may differ between a checkpoint and the run resuming from it: budgets, paths,
#: logging, and the parallel layout (checkpoint.py checks layouts per part). Everything else
#: changes the math of an update and is part of the resume fingerprint.
RESUME_MUTABLE = (
    "run_dir",
    "training.train_iters",
    "training.max_nonfinite_steps",
    "training.packing",
    "training.max_tokens_per_microbatch",
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
    "model.packed_attention",
    "data.path",
    "rollout.gpu_memory_utilization",
    "rollout.enable_sleep_mode",
    "rollout.colocate",
    "rollout.tensor_parallel_size",
    "rollout.vllm_kwargs",
    "rollout.num_engines",
    "rollout.verify_sync",
    "rollout.timeout_s",
    "rollout.server_url",
    "rollout.server_weight_transport",
    "rollout.server_nccl_address",
    "rollout.server_nccl_port",
    "rollout.fingerprint_projections",
    "rollout.probe_atol",
    "optimizer.use_distributed_optimizer",
    "optimizer.loss_scale",   # Megatron lets a resumed run change its loss scaling; the dynamic scale
    "optimizer.initial_loss_scale",   # continues from the checkpoint's
    "optimizer.min_loss_scale",
    "optimizer.loss_scale_window",
    "optimizer.hysteresis",
    "checkpoint.",
    "logging.",
)

#: The trainer's own options besides the settings (``--help`` lists them first).
OPTIONS = (("--config FILE", "a YAML preset (configs/*.yaml); the flags override it; --help shows its values"),
           ("--print-config", "print the resolved config as YAML and exit"))

#: The trainer's flags, generated from ``TrainConfig`` (a misspelt option named as the close match too).
SETTINGS = Settings(TrainConfig, options=[flag.split()[0] for flag, _ in OPTIONS])


def field_types() -> dict[str, Any]:
    """Every settable key (``run_dir``, ``section.field``) and its type annotation."""
    return dict(SETTINGS.types)


def help_text(description: str, argv: Sequence[str] = ()) -> str:
    """``--help``: ``description``, the options, then every setting by section (type, default, docstring); with
    ``--config FILE`` in ``argv``, the defaults shown are the preset's (``--print-config``: with the overrides)."""
    path, _, args = split_argv(argv)
    if path is None:
        return SETTINGS.help(description, OPTIONS)
    try:   # another --run_dir: a run's config.yaml starts a new run there (moved_run), whose defaults these are
        run_dir = parse_overrides([a for a in args if a not in HELP_FLAGS]).get("run_dir")   # (--help: no setting)
    except (UsageError, ConfigError):   # a bad flag: the help still shows
        run_dir = None
    # as the trainer starts it (a run's config.yaml copied alone, or with another --run_dir: a new run)
    preset = config_and_note(path, [f"--run_dir={run_dir}"] if run_dir else [])[0]
    note = textwrap.fill(f"The defaults shown are {path}'s, marked 'from {path}' where they differ from the code's; "
                         "--print-config prints the resolved config with the flags given.", 100,
                         break_on_hyphens=False, break_long_words=False)   # the path whole: copied from here
    return SETTINGS.help(f"{description.strip()}\n\n{note}", OPTIONS,
                         defaults={key: setting(preset, key) for key in SETTINGS.types}, source=path)


def setting(cfg: TrainConfig, key: str) -> Any:
    """The value of ``key`` (``run_dir``, ``section.field``) in ``cfg``."""
    section, _, name = key.rpartition(".")
    return getattr(getattr(cfg, section) if section else cfg, name)


# ----------------------------------------------------------------------------- sources


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (tuples and lists are values, not subtrees; so is the mapping
    of a setting, ``rollout.vllm_kwargs``)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name not in SETTINGS.types:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def read_yaml(path: str) -> dict[str, Any]:
    """The YAML file as flat ``section.field`` keys; unknown keys raise naming the file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} {'is not a file' if os.path.exists(path) else 'does not exist'}")
    tree = load_yaml(path) or {}
    if not isinstance(tree, dict):
        raise InputFileError(path, f"expected a mapping of sections, got {type(tree).__name__}")
    sections = {name for name, _, _ in SETTINGS.sections if name}
    for name, value in tree.items():
        if name in sections and not isinstance(value, dict):
            raise InputFileError(path, f"section {name!r}: expected a mapping of its fields, got {value!r}")
    flat = flatten(tree)
    for key in flat:
        if key not in SETTINGS.types:
            raise InputFileError(path, f"unknown key {key!r}{did_you_mean(key, list(SETTINGS.types), bare=False)}")
        try:   # a bad value is the file's: "--optimizer.lr: expected float" named a flag nobody gave
            coerce(flat[key], SETTINGS.types[key], key)
        except ConfigError as err:
            raise InputFileError(path, f"{key}: {err.detail}") from None
    return flat


def parse_overrides(argv: Sequence[str]) -> dict[str, Any]:
    """``["--lr", "1e-5", "--objective.flow_variant=local", "--lora.enabled"]`` -> full keys."""
    return SETTINGS.parse(argv)


def build_config(values: dict[str, Any]) -> TrainConfig:
    """A ``TrainConfig`` from flat ``section.field`` values; errors name the field and flag."""
    return SETTINGS.build(values)


def load_config(path: str | None = None, argv: Sequence[str] = ()) -> TrainConfig:
    """Defaults < YAML file < ``--ablation`` < command-line overrides; a run's own ``config.yaml`` whose run
    directory is elsewhere now, with its paths there (``moved_run``), and with the format its trainer ignored read
    as auto (``unhonoured_format``): the run it records, as mcore_to_hf and the eval read it."""
    return config_and_note(path, argv, start=False)[0]


def config_and_note(path: str | None, argv: Sequence[str] = (), start: bool = True) -> tuple[TrainConfig, str | None]:
    """``load_config``'s config; to ``start`` a run (the trainer's), one that is not the run a run's own config.yaml
    records writes none of its outputs where that run's were (``MovedRun.settings``), and the line that says so
    (``MovedRun.note``; None when the file is no run's config.yaml read in another run directory)."""
    values: dict[str, Any] = read_yaml(path) if path else {}
    overrides = parse_overrides(argv)
    moved = moved_run(path, values, overrides) if path else None
    values.update({**(moved.settings(start) if moved else {}), **unhonoured_format(path, values, overrides)}
                  if path else {})
    ablation = overrides.get("ablation", values.get("ablation"))
    if ablation not in (None, "none", "null") and ablation not in ABLATIONS:
        raise ConfigError("ablation", f"{ablation!r} is not one of {tuple(ABLATIONS)}")
    if ablation in ABLATIONS:
        values.update({f"objective.{k}": v for k, v in ABLATIONS[ablation].items()})
    values.update(overrides)
    return build_config(values), moved.note() if moved and start else None


def unhonoured_format(path: str, values: dict[str, Any], overrides: dict[str, Any]) -> dict[str, str]:
    """``{"checkpoint.model_format": "auto"}`` for a run's own ``config.yaml`` that records a format its trainer
    never wrote (one saved before 509d1c6: a LoRA run with torch_dist, as an older layout error told users to set,
    or a full fine-tuning with per_rank): the trainer ignored it and wrote ``written_model_format``, so the run's
    resume, export and conversion read it as auto. ``{}`` otherwise: a preset's value (``is_run_config``: whatever its
    file's name), or the flag, is refused."""
    key, saved = "checkpoint.model_format", values.get("checkpoint.model_format")
    if not is_run_config(path, values) or key in overrides or saved in (None, "auto"):
        return {}
    try:
        lora = coerce(overrides.get("lora.enabled", values.get("lora.enabled", LoraConfig.enabled)),
                      SETTINGS.types["lora.enabled"], "lora.enabled")
    except ConfigError:   # the build names it
        return {}
    return {} if saved == written_model_format(lora) else {key: "auto"}


def split_argv(argv: Sequence[str]) -> tuple[str | None, bool, list[str]]:
    """``[--config FILE] [--print-config] overrides...`` -> (config file, print-config?, overrides);
    ``--print_config`` too, as ``_`` and ``-`` are one in every flag."""
    args = list(argv)
    path, print_config = None, False
    for spelling in ("--print-config", "--print_config"):   # the second was "unknown setting; did you mean
        if spelling in args:                                 # checkpoint.strict_config"
            args.remove(spelling)
            print_config = True
    for i, arg in enumerate(args):
        if arg == "--config" or arg.startswith("--config="):
            if arg == "--config":
                if i + 1 >= len(args):
                    raise UsageError("--config: missing a file name")
                path = args[i + 1]
                del args[i:i + 2]
            else:
                path = arg.split("=", 1)[1]
                del args[i]
            break
    for i, arg in enumerate(args):
        if arg == "--config" or arg.startswith("--config="):
            second = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            raise UsageError(f"--config: given twice ({path}, then {second}): one preset per run; override its "
                             "settings with --section.field=value")
    return path, print_config, args


def config_from_argv(argv: Sequence[str]) -> TrainConfig:
    """``[--config FILE] [overrides...]`` -> ``TrainConfig`` (what a trainer's ``main()`` calls)."""
    path, _, args = split_argv(argv)
    return load_config(path, args)


# ----------------------------------------------------------------------------- output

def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Nested plain dict (tuples become lists) for YAML/JSON."""
    def plain(x):
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x
    return plain(dataclasses.asdict(cfg))


def to_yaml(cfg: TrainConfig) -> str:
    """The resolved config as YAML (what ``--print-config`` prints; a run's ``config.yaml`` holds it with its paths
    absolute: ``save_run_config``)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def dump_config(cfg: TrainConfig, path: str) -> None:
    """Write the resolved config as YAML (atomic). ``load_config(path)`` rebuilds it exactly."""
    write_text(path, to_yaml(cfg))


def with_absolute_paths(cfg: TrainConfig) -> tuple[TrainConfig, dict[str, str]]:
    """``cfg`` with its relative ``PATH_SETTINGS`` resolved against the current directory (``data.path`` only
    when it is a file or directory here, not a Hub dataset name), and ``{key: the path as given}`` of those."""
    given = {}
    for key in PATH_SETTINGS:
        value = setting(cfg, key)
        if value and not os.path.isabs(value) and (key != "data.path" or os.path.exists(value)):
            given[key] = value
    for key, value in given.items():
        section, _, name = key.rpartition(".")
        if section:
            cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section),
                                                                           **{name: os.path.abspath(value)})})
        else:
            cfg = dataclasses.replace(cfg, **{name: os.path.abspath(value)})
    return cfg, given


def save_run_config(cfg: TrainConfig) -> str | None:
    """Rank 0 writes the resolved config to ``<run_dir>/config.yaml``, its paths absolute (``PATH_SETTINGS``; a
    comment names the launch directory and the relative paths as given); returns its path (None elsewhere)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return None
    path = os.path.join(cfg.run_dir, RUN_CONFIG_FILE)
    resolved, given = with_absolute_paths(cfg)
    head = "".join(f"# {key}: {value!r} as given in {os.getcwd()}, the launch directory\n"
                   for key, value in given.items())
    write_text(path, head + to_yaml(resolved))
    return path


def resume_fingerprint(cfg: TrainConfig) -> dict[str, Any]:
    """The flat settings a resumed run must share with its checkpoint (all but ``RESUME_MUTABLE``).
    ``model.disable_dropout`` enters as what the run does (``TrainConfig.dropout_disabled``), not as set: a
    checkpoint saved when it defaulted to true resumes a phf run at today's default (None, the method's)."""
    flat = flatten(to_dict(cfg))
    flat["model.disable_dropout"] = cfg.dropout_disabled
    flat["data.holdout_fraction"] = cfg.holdout_fraction
    return without_unused_seed({k: v for k, v in flat.items()
                                if not any(k == m or (m.endswith(".") and k.startswith(m)) for m in RESUME_MUTABLE)})


def without_unused_seed(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """``fingerprint`` less ``data.holdout_seed`` where ``data.holdout_fraction`` is 0: nothing is held out, so the
    seed changes nothing (a checkpoint saved with it still matches a run with another)."""
    if fingerprint.get("data.holdout_fraction") == 0:
        return {k: v for k, v in fingerprint.items() if k != "data.holdout_seed"}
    return fingerprint


def saved_as_run(saved: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's fingerprint with ``model.disable_dropout`` as what its run did: one saved between 731af8c and
    96a718c holds it as set, None (the method's default: true for phf only), which today's fingerprint
    (``TrainConfig.dropout_disabled``, never None) would call another setting on every resume; and without a
    ``data.holdout_seed`` it was saved with while holding out 0 (``without_unused_seed``)."""
    if "method" in saved and "data.holdout_fraction" not in saved:  # a run's, saved before the holdout: every row
        saved = {**saved, "data.holdout_fraction": 0.0, "data.holdout_seed": 42}
    if "model.disable_dropout" in saved and saved["model.disable_dropout"] is None:
        saved = {**saved, "model.disable_dropout": saved.get("method", "phf") == "phf"}
    return without_unused_seed(saved)


def with_checkpoint_holdout(cfg: TrainConfig) -> tuple[TrainConfig, str | None]:
    """``cfg`` with ``data.holdout_fraction`` unset (the method's default) resuming a checkpoint of the method whose
    run held out another share of the rows (one saved before the holdout: none): the checkpoint's, and one note line
    that says so. ``(cfg, None)`` otherwise; a value given that differs is refused by the resume (its fingerprint)."""
    step = read_latest(cfg.load_dir) if cfg.data.holdout_fraction is None else None
    if step is None or not checkpoint_saved(cfg.load_dir, step):   # none, or a deleted one the resume names
        return cfg, None
    ckpt = os.path.join(cfg.load_dir, iter_dir_name(step))
    meta = read_json(os.path.join(ckpt, META_FILE))
    saved = meta.get("fingerprint") if isinstance(meta, dict) else None
    run = saved_as_run(saved) if isinstance(saved, dict) else {}   # not a dict: the resume names it
    fraction = run.get("data.holdout_fraction")
    if run.get("method") != cfg.method or not isinstance(fraction, (int, float)) or fraction == cfg.holdout_fraction:
        return cfg, None
    older = "; saved before the holdout, its run trained on every row" if "data.holdout_fraction" not in saved else ""
    return (dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, holdout_fraction=float(fraction))),
            f"note: data.holdout_fraction unset: {float(fraction)}, the checkpoint's ({ckpt}{older}), not "
            f"--method={cfg.method}'s default {cfg.holdout_fraction}: the resumed run trains on the same rows")


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
