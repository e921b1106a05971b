"""The trained student out of a run, for HF tools: a PEFT adapter, or HF safetensors with LoRA merged.

One code path, two callers: the trainer at the end of a run (``Trainer.export``: the PEFT adapter
with LoRA, the HF model for full fine-tuning) and ``tools/convert/mcore_to_hf.py`` given a run
directory or one of its checkpoints (``export_run_checkpoint``: the student rebuilt as the trainer
built it, the checkpoint's adapters or weights loaded, then the merged model or the adapter
written). HF names and layouts come from ``convert.live_model.iter_hf_weights`` (LoRA merged by
``lora.merged_weight_selector``), the adapter from ``lora.export.export_peft_adapter``.

What a path may be (``find_run_checkpoint``): a run directory (``config.yaml``; its latest
checkpoint), a checkpoint directory (``<save>/iter_0000100``: ``meta.json``) or the checkpoints
directory (``latest_checkpointed_iteration.txt``). The run's ``config.yaml`` is looked for in the run
directory above the checkpoints (or given).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from dataclasses import dataclass

from ..convert.mcore_checkpoint import training_checkpoint_error
from ..errors import ConfigError, InputFileError
from ..input_files import (
    RUN_CONFIG_FILE, checkpoint_names, checkpoint_saved, list_checkpoints, missing_base_model, missing_checkpoint_dir,
    missing_dir, read_json, run_checkpoints_dir, saved_path)
from .checkpoint import META_FILE, check_fingerprint, iter_dir_name, read_latest
from .config import LATEST_FILE, TrainConfig
from .config_io import load_config, resume_fingerprint
from .metrics import LOSS_TOKENS_FILE, METRICS_FILE

#: Where ``Trainer.export`` writes, below the run directory.
ADAPTER_DIR = os.path.join("export", "peft_adapter")
HF_DIR = os.path.join("export", "hf")


def export_dir(cfg: TrainConfig) -> str:
    """Where the run's export goes: the PEFT adapter with LoRA, else the HF model."""
    return os.path.join(cfg.run_dir, ADAPTER_DIR if cfg.lora.enabled else HF_DIR)


def finished_step(cfg: TrainConfig) -> int | None:
    """The step of a finished run (its latest checkpoint has reached ``training.train_iters`` and
    its export is written), else None: a rerun then has nothing to do. A run whose settings differ
    from the checkpoint's (``checkpoint.strict_config``) is refused, as its resume would be."""
    step = read_latest(cfg.load_dir)
    if step is None or step < cfg.training.train_iters or not os.path.isdir(export_dir(cfg)):
        return None
    if not checkpoint_saved(cfg.load_dir, step):   # the latest file names a deleted checkpoint: the resume names it
        return None
    meta = os.path.join(cfg.load_dir, iter_dir_name(step), META_FILE)
    if cfg.checkpoint.strict_config:   # another run's directory: refused as a resume is
        saved = read_json(meta)
        if not isinstance(saved, dict):
            raise InputFileError(meta, "expected a JSON object")
        check_fingerprint(saved, resume_fingerprint(cfg), os.path.dirname(meta))
    return step


def outputs_message(cfg: TrainConfig, step: int) -> str:
    """Where the run's outputs are, and the commands that make the rest (the end of a run, a rerun
    of a finished one)."""
    run = cfg.run_dir
    latest = os.path.join(cfg.save_dir, iter_dir_name(step))
    lines = [f"  checkpoints   {cfg.save_dir} (latest: {latest})"]
    if os.path.isfile(config := os.path.join(run, RUN_CONFIG_FILE)):
        lines.append(f"  config        {config}")
    if cfg.logging.jsonl:
        lines.append(f"  metrics       {os.path.join(run, METRICS_FILE)} (keys: docs/metrics.md)")
    if os.path.isfile(loss_tokens := os.path.join(run, LOSS_TOKENS_FILE)):
        lines.append(f"  loss tokens   {loss_tokens}")
    if cfg.logging.tensorboard:
        lines.append(f"  tensorboard   {cfg.logging.tensorboard_dir or os.path.join(run, 'tensorboard')}")
    if cfg.lora.enabled:
        lines.append(f"  PEFT adapter  {export_dir(cfg)} (base model: {cfg.model.hf_dir})")
        lines.append(f"  merged model  {merge_command(cfg)}")
    else:
        lines.append(f"  HF model      {export_dir(cfg)}")
    lines.append(f"  plots         python tools/plot_run.py {shlex.quote(run)}  (writes {os.path.join(run, 'plots')}/)")
    return "\n".join(lines)


def merge_command(cfg: TrainConfig) -> str:
    """The command (its paths shell-quoted) that writes the run's merged model into ``<run_dir>/merged``; once that
    exists (the converter refuses an existing --out_dir), says so and names the first free ``<run_dir>/merged_N``."""
    mp = cfg.model.tensor_model_parallel_size * cfg.model.pipeline_model_parallel_size
    launcher = "python" if mp == 1 else f"torchrun --nproc-per-node {mp}"  # the checkpoint's TP x PP layout
    merged = out = os.path.join(cfg.run_dir, "merged")
    n = 2
    while os.path.lexists(out):
        out, n = f"{merged}_{n}", n + 1
    command = f"{launcher} tools/convert/mcore_to_hf.py --mcore_dir {shlex.quote(cfg.run_dir)} --out_dir " \
              f"{shlex.quote(out)}"
    return command if out == merged else f"{merged} exists; another: {command}"


# ----------------------------------------------------------------------------- writing


def _tokenizer_files(hf_dir: str) -> list[str]:
    from ..convert.hf_checkpoint import TOKENIZER_FILES

    return [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(hf_dir, f))]


def write_student(chunks, arch, hf_config: dict, cfg: TrainConfig, out_dir: str, *, adapter: bool,
                  dtype=None, max_shard_bytes: int = 2 << 30) -> str:
    """Write this run's student (``chunks``: this rank's model chunks) to ``out_dir`` (a collective;
    rank 0 writes, atomically, replacing an earlier export there): the PEFT adapter (``adapter``), else
    HF safetensors + config + tokenizer with every LoRA adapter merged into its base weight. ``dtype``: of
    the written weights
    (default: the parameters'). Returns ``out_dir``."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from ..convert.hf_writer import write_hf_checkpoint
    from ..convert.live_model import iter_hf_weights
    from ..convert.qwen3_mapping import hf_shapes
    from ..lora import merged_weight_selector
    from ..startup import progress_bar

    hf_dir = cfg.model.hf_dir
    if adapter:
        from ..lora.export import export_peft_adapter

        export_peft_adapter(chunks, out_dir, cfg.lora, base_model_name_or_path=os.path.abspath(hf_dir), dtype=dtype)
        return out_dir
    select = merged_weight_selector(chunks) if cfg.lora.enabled else None
    items = (item for chunk in chunks
             for item in iter_hf_weights(chunk, arch, pp_group=ps.get_pipeline_model_parallel_group(), select=select))
    if ps.get_data_parallel_rank() == 0:
        if dist.get_rank() == 0:
            names = list(hf_shapes(arch))
            with progress_bar(items, total=len(names), desc="export", unit="tensor") as bar:   # minutes at 8B
                write_hf_checkpoint(bar, out_dir, hf_config=hf_config, dtype=dtype or chunks[0].config.params_dtype,
                                    tokenizer_src=hf_dir, tokenizer_files=_tokenizer_files(hf_dir),
                                    max_shard_bytes=max_shard_bytes, expected_names=names, replace=True)
        else:
            for _ in items:  # the gathers and broadcasts are collective
                pass
    return out_dir


# ----------------------------------------------------------------------------- a run's checkpoint


@dataclass
class RunCheckpoint:
    """A checkpoint of ``phf_megatron.train`` and the run it belongs to."""

    cfg: TrainConfig
    save_dir: str
    iteration: int
    meta: dict

    @property
    def path(self) -> str:
        return os.path.join(self.save_dir, iter_dir_name(self.iteration))


def _run_config(candidates: list[str], where: str) -> tuple[TrainConfig, str]:
    """The run's config and the file it was read from: the first of ``candidates`` there is. A setting it refuses
    is the file's (``mcore_to_hf`` and the eval have no such flag)."""
    for path in candidates:
        if os.path.isfile(path):
            try:
                return load_config(path), path
            except ConfigError as err:
                raise InputFileError(path, f"{err.key}: {err.detail}") from None
    raise FileNotFoundError(f"{where}: no {RUN_CONFIG_FILE} of the training run found (looked at "
                            f"{', '.join(candidates)}); give it with --run_config")


def _no_latest(save_dir: str) -> FileNotFoundError:
    """``save_dir`` has no ``latest_checkpointed_iteration.txt``: the checkpoints it holds, to pick one."""
    if list_checkpoints(save_dir):
        return FileNotFoundError(f"mcore_dir: {save_dir} has no {LATEST_FILE}: give one of its checkpoints "
                                 f"({checkpoint_names(save_dir)})")
    return FileNotFoundError(f"{save_dir}: no checkpoint of the run yet ({LATEST_FILE} missing)")


def find_run_checkpoint(path: str, run_config: str | None = None) -> RunCheckpoint | None:
    """The training checkpoint ``path`` names (see the module docstring), or None when ``path`` is
    not one of the trainer's (a model checkpoint of ``hf_to_mcore``, say)."""
    typed, path = path, os.path.abspath(path)
    given = [run_config] if run_config else []
    if missing_dir(path) and list_checkpoints(os.path.dirname(path)):   # a mistyped or pruned iteration
        raise FileNotFoundError(f"mcore_dir: {missing_checkpoint_dir(typed)}")
    if training_checkpoint_error(path) is not None:   # iter_N: meta.json, not a model checkpoint
        save_dir = os.path.dirname(path)
        cfg, _ = _run_config(given or [os.path.join(os.path.dirname(save_dir), RUN_CONFIG_FILE),
                                       os.path.join(save_dir, RUN_CONFIG_FILE)], path)
        meta = read_json(os.path.join(path, META_FILE))
        if not isinstance(meta, dict) or not isinstance(meta.get("iteration"), int):
            raise InputFileError(os.path.join(path, META_FILE), "no iteration: not a checkpoint of phf_megatron.train")
        return RunCheckpoint(cfg, save_dir, meta["iteration"], meta)
    if os.path.isfile(os.path.join(path, LATEST_FILE)):
        save_dir = path
        cfg, _ = _run_config(given or [os.path.join(os.path.dirname(path), RUN_CONFIG_FILE),
                                       os.path.join(path, RUN_CONFIG_FILE)], path)
    elif os.path.isfile(os.path.join(path, RUN_CONFIG_FILE)) or run_config:
        cfg, read = _run_config(given or [os.path.join(path, RUN_CONFIG_FILE)], path)
        # the eval's rule too (saved_checkpoints_dir)
        save = saved_path(read, "checkpoint.save", cfg.checkpoint.save, path, cfg.run_dir)
        save_dir = run_checkpoints_dir(path, save)
    elif list_checkpoints(path):   # iter_N directories, but no latest file to name one
        raise _no_latest(path)
    else:
        return None
    iteration = read_latest(save_dir)
    if iteration is None:
        raise _no_latest(save_dir)
    ckpt = os.path.join(save_dir, iter_dir_name(iteration))
    if missing_dir(ckpt):
        raise InputFileError(os.path.join(save_dir, LATEST_FILE),
                             f"names iteration {iteration}, but {missing_dir(ckpt)} (checkpoints there: "
                             f"{checkpoint_names(save_dir)})")
    return RunCheckpoint(cfg, save_dir, iteration, read_json(os.path.join(ckpt, META_FILE)))


def _with_base_model(cfg: TrainConfig, base_model: str | None) -> TrainConfig:
    """The run's config with its base model where it can be read here: ``base_model`` (its HF
    weights), else the run's own ``model.pretrained_checkpoint`` or ``model.hf_dir``."""
    model = cfg.model
    if base_model is not None:
        model = dataclasses.replace(model, hf_dir=base_model, pretrained_checkpoint=None)
    relative = ", relative to the directory the run was launched from" if model.hf_dir and not os.path.isabs(
        model.hf_dir) else ""   # a config.yaml written before the trainer recorded absolute paths
    named = base_model if base_model is not None else f"the run's base model (model.hf_dir = {model.hf_dir!r}{relative})"
    if why := missing_base_model(model.hf_dir, named):
        raise ConfigError("base_model", why)
    if model.pretrained_checkpoint and not os.path.isdir(model.pretrained_checkpoint):
        model = dataclasses.replace(model, pretrained_checkpoint=None)  # the same base weights, from hf_dir
    if not model.pretrained_checkpoint:   # its weights are read from hf_dir: named here, not as "hf_dir: ..."
        from ..convert.hf_checkpoint import HFCheckpoint

        try:
            HFCheckpoint(model.hf_dir)
        except FileNotFoundError as err:
            detail = str(err).removeprefix("hf_dir: ")
            raise ConfigError("base_model", detail if base_model is not None else f"{named}: {detail}") from None
    return dataclasses.replace(cfg, model=model)


def export_model_config(cfg: TrainConfig, tp: int, pp: int) -> TrainConfig:
    """The run's config as the export builds its model: the checkpoint's TP x PP layout, and the default packed
    attention (``model.packed_attention``: a kernel of packed training micro-batches, which an export never runs;
    'varlen' would need a CUDA torch with ``varlen_attn`` where the export runs)."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, tensor_model_parallel_size=tp,
                                                              pipeline_model_parallel_size=pp,
                                                              packed_attention="sdpa"))


def export_run_checkpoint(ckpt: RunCheckpoint, out_dir: str, *, adapter: bool, base_model: str | None = None,
                          dtype=None, max_shard_bytes: int = 2 << 30) -> str:
    """Write ``ckpt``'s student as a merged HF model or (``adapter``) a PEFT adapter to ``out_dir``.

    Launch with the checkpoint's layout: one process for TP = PP = 1 (any data-parallel size),
    else ``torchrun --nproc-per-node TP*PP``; every rank calls this.
    """
    from megatron.core import parallel_state as ps  # noqa: F401 - Megatron before the model is built

    from .checkpoint import load_checkpoint
    from .checkpoint_parts import RankLayout, dist_model_part, tensors_part
    from .distributed import init_distributed, shutdown_distributed
    from .model_setup import build_model_chunks, check_settings_fit_model, read_hf_config
    from ..commands import launch_world_size
    from ..convert.checkpoints import _check_new_dir, say_phase  # the converters' refusal of an existing --out_dir
    from ..lora import adapter_parameters
    from ..models.qwen3_arch import Qwen3Arch
    from ..tokenizer import TOKENIZER_RULE, has_tokenizer_files

    layout = ckpt.meta.get("layout", {})
    tp, pp = int(layout.get("tp_size", 1)), int(layout.get("pp_size", 1))
    world = launch_world_size()
    if world % (tp * pp):
        raise InputFileError(ckpt.path, f"saved by a run at TP={tp} x PP={pp}: convert it under "
                                        f"torchrun --nproc-per-node {tp * pp} tools/convert/mcore_to_hf.py ...")
    if adapter and not ckpt.cfg.lora.enabled:
        raise ConfigError("adapter_only", "the run trained every weight (lora.enabled=false): it has no adapter; "
                                          "leave the flag out for the HF model")
    cfg = _with_base_model(ckpt.cfg, base_model)
    if not adapter and not has_tokenizer_files(cfg.model.hf_dir):  # vLLM needs it
        raise ConfigError("base_model", f"{cfg.model.hf_dir} holds no tokenizer files ({TOKENIZER_RULE}): "
                                        "give the base model directory with its tokenizer")
    cfg = export_model_config(cfg, tp, pp)
    _check_new_dir(out_dir)
    init_distributed(cfg)
    try:
        hf_config = read_hf_config(cfg)
        check_settings_fit_model(cfg, hf_config)
        arch = Qwen3Arch.from_hf(hf_config)
        weights = "its LoRA adapters" if cfg.lora.enabled else "its weights"   # no bar, as long as the export at 8B
        say_phase(True, f"export load: the base model {cfg.model.pretrained_checkpoint or cfg.model.hf_dir}, then "
                        f"{weights} from {ckpt.path} (step {ckpt.iteration})")
        chunks = build_model_chunks(cfg, hf_config, arch)
        if cfg.lora.enabled:
            parts = {"adapters": tensors_part(dict(p for c in chunks for p in adapter_parameters(c)))}
        else:
            parts = {f"model{i}": dist_model_part(c) for i, c in enumerate(chunks)}
        load_checkpoint(ckpt.save_dir, parts, RankLayout.from_parallel_state(), strict_config=False,
                        iteration=ckpt.iteration)
        return write_student(chunks, arch, hf_config.to_dict(), cfg, out_dir, adapter=adapter, dtype=dtype,
                             max_shard_bytes=max_shard_bytes)
    finally:
        shutdown_distributed()
