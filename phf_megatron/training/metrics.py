"""Per-step metrics on rank 0: a JSONL file, optional TensorBoard events and Weights & Biases
run, and a tqdm progress bar.

``metrics.jsonl`` holds one JSON object per logged step, ``{"step": 7, "loss": ..., ...}``,
flushed as it is written. Steps count optimizer updates from 1. Values may be numbers, None
(NaN and infinities are written as null, which strict JSON readers accept) or lists of numbers
(e.g. the per-layer flow energy). On resume from step ``s`` the file keeps only lines with
``step <= s`` (and drops a half-written last line), so the file always describes one run;
TensorBoard gets ``purge_step = s + 1`` for the same effect (also at ``s = 0``: a run killed before
its first checkpoint starts again). TensorBoard and W&B get the same
scalars (``scalars``): every number, and each element of a list as ``key/NN`` (``flow_energy/03``).

    with MetricsLogger(run_dir, total_steps=100, start_step=resumed_step, tensorboard=True) as m:
        m.log(step, {"loss": 0.41, "lr": 5e-6, "step_time": 3.2})

``loss_tokens.jsonl`` (``log_loss_tokens``, every ``logging.loss_tokens_interval`` steps) holds
``{"step": 10, "tokens": [{"id": 13824, "token": " wait", "share": 0.081, "count": 57}, ...]}``:
the rollout tokens with the largest share of the step's summed OPSD loss; truncated on resume
like the metrics.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.distributed as dist

from ..config_errors import fail
from ..errors import InputFileError
from ..input_files import METRICS_FILE, read_lines
from ..output_files import write_jsonl
from ..parallel import loss as _loss
from .config_io import to_dict

LOSS_TOKENS_FILE = "loss_tokens.jsonl"
WANDB_ID_FILE = "wandb_run_id.txt"  # the W&B run's id, so that a resume continues the same run

#: Record keys the trainer writes and ``tools/plot_run.py`` reads (the step's own, as ``parallel.loss``
#: names them, and the trainer's).
LOSS = _loss.LOSS            # L_PHF = L_OPSD + alpha * L_flow, the optimized total
LOSS_OPSD = _loss.LOSS_OPSD  # L_OPSD, the clipped JSD term
LOSS_FLOW = _loss.LOSS_FLOW  # L_flow (before alpha)
GRAD_NORM = "grad_norm"  # global gradient norm before clipping
LR = "lr"
FLOW_ENERGY = "flow_energy"  # [L] per-layer energy (diagnostics.layer_energy_metrics)
OPSD_UNCLIPPED = _loss.OPSD_UNCLIPPED        # mean divergence per token before the clip
CLIP_FRAC_TOKENS = _loss.CLIP_FRAC_TOKENS    # fraction of tokens the clip changed
CLIP_FRAC_ENTRIES = _loss.CLIP_FRAC_ENTRIES  # fraction of vocabulary summands above the cap (element clip)
LOSS_TOKENS = _loss.LOSS_TOKENS              # [[id, share, count], ...] on loss_tokens steps (not in metrics.jsonl)
ON_POLICY_FRACTION = "on_policy_fraction"    # share of the step's samples that are rollouts (rollout.lmbda)


def _is_rank0() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def to_json_value(value: Any) -> Any:
    """Tensors/NumPy values to Python numbers or lists (dicts and lists recursively); NaN and +-inf to None."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().tolist()
    elif hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json_value(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The records of a metrics file; a half-written last line is ignored, other bad lines raise."""
    lines = read_lines(path)   # loss_tokens.jsonl is not ASCII: a crash may cut a line inside a character
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # a crash mid-write leaves the last line without its newline
                break
            raise InputFileError(f"{path}:{number}", f"not a JSON line: {line[:80]!r}") from None
        if not isinstance(record, dict):
            raise InputFileError(f"{path}:{number}", f"expected a JSON object, got {type(record).__name__}")
        records.append(record)
    return records


def _step(record: dict[str, Any], path: str) -> int:
    """A record's step (0 without one); one that is not a whole number is named (was int()'s traceback)."""
    step = record.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int):
        raise InputFileError(path, f"a record whose step is {step!r}, not a step number")
    return step


def truncate_jsonl(path: str, last_step: int) -> int:
    """Keep the records with ``step <= last_step`` (atomic rewrite); returns how many remain."""
    if not os.path.isfile(path):
        return 0
    kept = [r for r in read_jsonl(path) if _step(r, path) <= last_step]
    write_jsonl(path, kept)
    return len(kept)


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The scalar series of a JSON record, as TensorBoard and W&B get them: each number under its
    key, each number of a list under ``key/NN``; ``step``, None, bools and text are left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "step":
            continue
        if isinstance(value, list):
            for i, v in enumerate(value):
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[f"{key}/{i:02d}"] = v
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    return out


def _open_tensorboard(log_dir: str, purge_step: int | None):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise fail("logging.tensorboard", "the tensorboard package is not installed (pip install tensorboard), "
                   "or set it to false") from err
    return SummaryWriter(log_dir=log_dir, purge_step=purge_step)


@dataclass(frozen=True)
class WandbRun:
    """Where a W&B run goes (``logging.wandb_*``); ``config`` is logged as the run's config."""

    project: str
    name: str
    entity: str | None = None
    offline: bool = False
    save_dir: str = "."
    config: dict | None = None

    @classmethod
    def of(cls, cfg) -> "WandbRun | None":
        """Where a run's W&B mirror goes (``logging.wandb``), or None."""
        lg = cfg.logging
        if not lg.wandb:
            return None
        return cls(project=lg.wandb_project, name=lg.wandb_exp_name or os.path.basename(os.path.abspath(cfg.run_dir)),
                   entity=lg.wandb_entity, offline=lg.wandb_offline, save_dir=lg.wandb_save_dir or cfg.run_dir,
                   config=to_dict(cfg))


def _kept_wandb_id(path: str) -> str | None:
    """The W&B run id a killed run kept in ``path``; None when there is none (no file, or an empty one: the
    resume starts a new W&B run, as a fresh run does). Garbage (a damaged disk) raises ``InputFileError``."""
    if not os.path.isfile(path):
        return None
    text = "\n".join(read_lines(path)).strip()   # bytes that are not UTF-8 are named, or shown as U+FFFD
    if text and not re.fullmatch(r"[A-Za-z0-9_-]+", text):
        raise InputFileError(path, f"expected a W&B run id (letters, digits, - and _), found {ascii(text[:40])}; "
                                   "fix it, or delete the file to log the resume to a new W&B run")
    return text or None


def _open_wandb(run: WandbRun, id_path: str, run_id: str | None):
    """The W&B run: ``run_id`` (a resume's, ``_kept_wandb_id``) continues that run (``resume="allow"``)
    instead of opening a second one; None: a fresh run gets a new id, kept in ``id_path``."""
    try:
        import wandb
    except ImportError as err:
        raise fail("logging.wandb", "the wandb package is not installed (pip install wandb), or set it to "
                   "false") from err
    os.makedirs(run.save_dir, exist_ok=True)
    # A parent's W&B service (wandb sets WANDB_SERVICE in a process that used it: a notebook, a test session)
    # still holds a killed run's id, so the resume's init fails "run ID ... is in use": start our own.
    os.environ.pop("WANDB_SERVICE", None)
    if run_id is None:
        run_id = secrets.token_hex(8)  # 16 hex digits: W&B accepts any id of letters and digits
        with open(id_path, "w", encoding="utf-8") as f:
            f.write(run_id + "\n")
    # console off: W&B does not wrap this process's stdout/stderr (the progress bar stays ours).
    settings = wandb.Settings(silent=True, console="off", x_disable_stats=True)
    return wandb.init(project=run.project, name=run.name, entity=run.entity, dir=run.save_dir,
                      mode="offline" if run.offline else "online", config=run.config, settings=settings,
                      id=run_id, resume="allow")


def _last_step(path: str) -> int:
    """The last step of a metrics file (0 if none)."""
    if not os.path.isfile(path):
        return 0
    return max((_step(r, path) for r in read_jsonl(path)), default=0)


class MetricsLogger:
    """Rank 0 writes; every other rank gets a logger whose methods do nothing."""

    def __init__(
        self,
        run_dir: str,
        total_steps: int,
        start_step: int = 0,
        jsonl: bool = True,
        tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        progress_bar: bool = True,
        enabled: bool | None = None,
        wandb: WandbRun | None = None,
    ) -> None:
        self.enabled = _is_rank0() if enabled is None else enabled
        self.path = os.path.join(run_dir, METRICS_FILE)
        self.loss_tokens_path = os.path.join(run_dir, LOSS_TOKENS_FILE)
        self._file = None
        self._tb = None
        self._wandb = None
        self._bar = None
        if not self.enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        # A resume continues the killed run's W&B run, which keeps its steps start_step+1..k and drops a
        # step below its last one: log from k+1 (k: the last step of the killed run's metrics.jsonl, or W&B's).
        wandb_id = os.path.join(run_dir, WANDB_ID_FILE)
        kept_id = _kept_wandb_id(wandb_id) if wandb is not None and start_step > 0 else None   # before any write
        continuing = kept_id is not None
        self._wandb_from = _last_step(self.path) + 1 if continuing else 0
        if jsonl:
            truncate_jsonl(self.path, start_step)
            self._file = open(self.path, "a")
        truncate_jsonl(self.loss_tokens_path, start_step)
        if tensorboard:  # purged from step 1 too: a run killed before its first checkpoint starts again
            self._tb = _open_tensorboard(tensorboard_dir or os.path.join(run_dir, "tensorboard"),
                                         purge_step=start_step + 1)
        if wandb is not None:
            self._wandb = _open_wandb(wandb, wandb_id, kept_id)
            if continuing:
                self._wandb_from = max(self._wandb_from, int(self._wandb.step))
        if progress_bar:
            from ..startup import progress_bar

            self._bar = progress_bar(total=total_steps, initial=start_step, unit="step", desc="train", mininterval=1.0)

    def progress(self, step: int, **postfix: float) -> None:
        """Move the bar to ``step`` and show ``postfix`` (e.g. loss=..., step_time=...)."""
        if self._bar is None:
            return
        shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items() if v is not None}
        self._bar.set_postfix(shown, refresh=False)
        self._bar.update(step - self._bar.n)   # (the last step: end_progress draws the full bar, once)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Write one record for ``step`` and advance the bar (shows ``loss`` and ``step_time``)."""
        if not self.enabled:
            return
        record = {"step": int(step)}
        record.update({k: to_json_value(v) for k, v in metrics.items()})
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self._tb is not None:
            for key, value in scalars(record).items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None and step >= self._wandb_from:
            self._wandb.log(scalars(record), step=int(step))
        self.progress(step, loss=record.get("loss"), step_time=record.get("step_time"))

    def log_loss_tokens(self, step: int, tokens: list[dict[str, Any]]) -> None:
        """Append one ``loss_tokens.jsonl`` record (``tokens``: id, decoded token, share, count)."""
        if not self.enabled:
            return
        with open(self.loss_tokens_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": int(step), "tokens": to_json_value(tokens)}, ensure_ascii=False) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        self.end_progress()

    def end_progress(self) -> None:
        """Close the bar (before a final message, so that it starts a line of its own)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
