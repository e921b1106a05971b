"""Atomic, resumable checkpoints in Megatron's directory convention.

    <save>/iter_0000050/                       a complete checkpoint, never a partial one
        meta.json                              iteration, parts and scopes, layout, config fingerprint
        global.pt                              GLOBAL parts (rank 0)
        model_parallel_tp00_pp000.pt           MODEL_PARALLEL parts (dp rank 0 of each tp, pp)
        rank_tp00_pp000_dp000.pt ...           RANK parts (every rank)
        dist/                                  DIST parts (megatron.core.dist_checkpointing)
    <save>/latest_checkpointed_iteration.txt   "50"

Saving writes everything into ``<save>/tmp-iter_0000050``; every rank fsyncs, the ranks agree
that all writes succeeded (an all-reduce), then rank 0 writes ``meta.json``, renames the
directory to ``iter_0000050``, fsyncs the parent and replaces ``latest_checkpointed_iteration.txt``
through a temp file + rename. A failure anywhere before the rename leaves the previous
checkpoint and ``latest`` untouched and raises ``CheckpointSaveError`` on every rank. Leftover
``tmp-*`` entries (a killed process) are removed by the next save and never read.
Before anything is written, every tensor of the save (and every shard of a DIST part) is checked
to be finite: a NaN or inf anywhere raises ``NonFiniteError`` on every rank, naming the part, the
tensor and the rank, and nothing is written.
Pruning (``keep_last``) renames an old checkpoint to ``tmp-delete-...`` before deleting it.

Caveats: a rank that raises inside Megatron's collective dist-checkpoint write can leave the
other ranks waiting in that collective until the process-group timeout. Rank 0 fsyncs every
file before the rename, which makes the checkpoint durable on one node; across nodes it relies
on the shared file system's close-to-open consistency (each rank also fsyncs its own files).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..config_errors import fail
from ..convert.dist_files import load_dist_checkpoint
from ..errors import InputFileError, NonFiniteError, OutputFileError, SettingsDiffer, write_failure
from ..input_files import (  # noqa: F401 - META_FILE, iter_dir_name, list_checkpoints, read_latest: re-exported
    ITER_RE, META_FILE, checkpoint_names, iter_dir_name, list_checkpoints, load_torch_file, missing_dir, read_json,
    read_latest, refuse_unnamed_checkpoints,
)
from ..output_files import atomic_file, first_nonfinite, fsync_tree, remove, replace_dir, write_json, write_text
from .checkpoint_parts import SCOPE_LAYOUT_KEYS, Part, PartMismatch, RankLayout, Scope
from .config import LATEST_FILE, TrainConfig
from .config_io import fingerprint_diff, fingerprint_hash, saved_as_run

FORMAT_VERSION = 1
DIST_DIR = "dist"


class CheckpointSaveError(RuntimeError):
    """A save failed on some rank; the previous checkpoint (if any) is intact. A failure the user can
    fix (a full disk, a read-only directory) is an ``OutputFileError`` instead: one line."""


@dataclass
class CheckpointInfo:
    iteration: int
    path: str
    meta: dict[str, Any]


# ----------------------------------------------------------------------------- file system


def _write_torch(obj: Any, path: str) -> None:
    """torch.save, fsynced (``output_files.atomic_file``)."""
    with atomic_file(path, "wb") as f:
        torch.save(obj, f)


def require_checkpoint(cfg: TrainConfig) -> None:
    """Raise (one line naming ``--checkpoint.load``) when the run is to start from a ``checkpoint.load``
    apart from its save directory and that holds no checkpoint.

    A mistyped path would otherwise train from scratch unnoticed. The hint names the directory meant
    where it can tell (an ``iter_XXXXXXX`` directory's parent, a run directory's ``checkpoints``).
    Checkpoints without a latest file, in the save or the load directory, are refused
    (``refuse_unnamed_checkpoints``).
    """
    refuse_unnamed_checkpoints(cfg.save_dir)
    load_dir = cfg.load_dir
    refuse_unnamed_checkpoints(load_dir)
    if not cfg.checkpoint.load or os.path.abspath(load_dir) == os.path.abspath(cfg.save_dir):
        return
    if read_latest(load_dir) is not None:
        return
    if not os.path.exists(load_dir):   # as every other path setting says it (input_files.missing_dir)
        raise fail("checkpoint.load", missing_dir(load_dir))
    nested = os.path.join(load_dir, "checkpoints")
    if ITER_RE.match(os.path.basename(os.path.normpath(load_dir))) and os.path.isdir(load_dir):
        hint = f"pass the directory above it, {os.path.dirname(os.path.normpath(load_dir))} (a run resumes from its latest)"
    elif read_latest(nested) is not None:
        hint = f"did you mean {nested}?"
    elif os.path.isfile(load_dir):
        hint = "it is a file: pass the checkpoints directory that holds it"
    else:
        hint = "leave checkpoint.load unset to start afresh"
    raise fail("checkpoint.load", f"{load_dir} holds no checkpoint (no {LATEST_FILE}): {hint}")


# ----------------------------------------------------------------------------- collectives


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _failed_ranks(ok: bool, group=None) -> list[int]:
    """All-gather of success flags: the global ranks that failed (empty: all succeeded)."""
    if not _distributed():
        return [] if ok else [0]
    world = dist.get_world_size(group)
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    flags = torch.zeros(world, dtype=torch.int32, device=device)
    flags[dist.get_rank(group)] = 0 if ok else 1
    dist.all_reduce(flags, group=group)
    ranks = torch.nonzero(flags.cpu()).flatten().tolist()
    return [dist.get_global_rank(group, r) if group is not None else r for r in ranks]


@contextlib.contextmanager
def _all_ranks_agree(phase: str, name: str, group, cleanup: str | None, is_rank0: bool):
    """Run a phase of the save on every rank, then agree (a collective) that it succeeded everywhere.

    An exception on this rank is caught and reported to the others; if any rank failed, rank 0
    removes ``cleanup`` (the temp directory) and every rank raises ``CheckpointSaveError`` naming
    the phase and the failed ranks (chained to this rank's own error, if it had one).
    """
    error: Exception | None = None
    try:
        yield
    except Exception as err:  # noqa: BLE001 - reported to every rank below
        error = err
    failed = _failed_ranks(error is None, group)
    if not failed:
        return
    failure = write_failure(error, cleanup) if error is not None else None  # a full disk: before the removal
    if is_rank0 and cleanup is not None:
        remove(cleanup)
    done = list_checkpoints(os.path.dirname(cleanup)) if cleanup is not None else []
    kept = f"the previous checkpoint {iter_dir_name(done[-1])} is intact" if done else "there is no earlier checkpoint"
    message = f"checkpoint {name} not saved: {phase} failed on rank(s) {failed}; {kept}"
    if failure is not None:   # one line: what the user can fix, then what it cost
        inside = cleanup and os.path.abspath(failure.path).startswith(os.path.abspath(cleanup))
        path = os.path.dirname(cleanup) if inside else failure.path   # not the removed temp file's name
        raise OutputFileError(path, f"{failure.detail}; {message}") from error
    if error is not None:
        raise CheckpointSaveError(f"{message}: {type(error).__name__}: {error}") from error
    raise CheckpointSaveError(message)


def _named_tensors(tree: Any, path: str):
    """``(path, tensor)`` for every tensor of a saved state, a DIST part's shards (``.data``) included."""
    if isinstance(tree, torch.Tensor):
        yield path, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _named_tensors(value, f"{path}[{key!r}]")
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _named_tensors(value, f"{path}[{i}]")
    elif isinstance(getattr(tree, "data", None), torch.Tensor):  # megatron.core's ShardedTensor
        yield path, tree.data


def _refuse_nonfinite(name: str, states: dict[str, Any], group) -> None:
    """Raise ``NonFiniteError`` on every rank if any rank's ``states`` (part name -> state) hold a
    NaN or inf (a collective: one all-reduce, and an object all-gather when something is found)."""
    found = first_nonfinite(t for part, state in states.items() for t in _named_tensors(state, part))
    if found is not None and _distributed():
        found = f"{found} on rank {dist.get_rank()}"
    if not _failed_ranks(found is None, group):
        return
    if _distributed():
        findings = [None] * dist.get_world_size(group)
        dist.all_gather_object(findings, found, group=group)
        found = next(f for f in findings if f is not None)
    raise NonFiniteError(f"checkpoint {name} not saved: {found}; the previous checkpoint is intact")


def _barrier(group) -> None:
    if _distributed():
        dist.barrier(group=group)


# ----------------------------------------------------------------------------- save


def _collect_local(parts: dict[str, Part], layout: RankLayout) -> dict[str, dict[str, Any]]:
    """This rank's files: file name -> {part name: state}."""
    files: dict[str, dict[str, Any]] = {}
    for name, part in parts.items():
        if part.scope is Scope.DIST or not layout.writes(part.scope):
            continue
        files.setdefault(layout.file_name(part.scope), {})[name] = part.state()
    return files


def _publish(save_dir: str, tmp: str, final: str, iteration: int, meta: dict) -> None:
    """Rank 0: meta, fsync, rename, latest."""
    write_json(os.path.join(tmp, META_FILE), meta, indent=1, sort_keys=True)
    fsync_tree(tmp)
    # A stale copy of this iteration (saved, then never marked latest) is swapped out, then deleted;
    # re-saving the iteration ``latest`` names leaves a moment where it is missing.
    replace_dir(tmp, final, trash=os.path.join(save_dir, f"tmp-delete-{os.path.basename(final)}"))
    write_text(os.path.join(save_dir, LATEST_FILE), str(iteration))


def prune_checkpoints(save_dir: str, keep_last: int, keep: int) -> list[int]:
    """Delete all but the newest ``keep_last`` checkpoints (never ``keep``); returns the deleted.

    Each is renamed to ``tmp-delete-...`` first, so no half-deleted ``iter_`` directory is seen.
    """
    doomed = [it for it in list_checkpoints(save_dir)[:-keep_last] if it != keep]
    for it in doomed:
        trash = os.path.join(save_dir, f"tmp-delete-{iter_dir_name(it)}")
        os.rename(os.path.join(save_dir, iter_dir_name(it)), trash)
        remove(trash)
    return doomed


def save_checkpoint(
    save_dir: str,
    iteration: int,
    parts: dict[str, Part],
    layout: RankLayout,
    fingerprint: dict[str, Any] | None = None,
    keep_last: int | None = None,
    extra: dict[str, Any] | None = None,
    group=None,
) -> str:
    """Write ``parts`` as ``<save_dir>/iter_XXXXXXX`` on every rank (a collective); returns the path.

    ``fingerprint``: the run's resume-relevant settings (``config_io.resume_fingerprint``);
    ``extra``: JSON-able values for ``meta.json`` (e.g. consumed samples). ``group``: the
    process group all ranks agree over (default: the world).
    """
    if iteration < 0:
        raise ValueError(f"iteration: must be >= 0, got {iteration}")
    name = iter_dir_name(iteration)
    final = os.path.join(save_dir, name)
    tmp = os.path.join(save_dir, f"tmp-{name}")
    is_rank0 = layout.rank == 0
    dist_parts = {k: p for k, p in parts.items() if p.scope is Scope.DIST}

    agree = functools.partial(_all_ranks_agree, name=name, group=group, cleanup=tmp, is_rank0=is_rank0)

    with agree("collecting the state"):
        local = _collect_local(parts, layout)  # file name -> {part name: state}
        dist_states = {k: p.state() for k, p in dist_parts.items()}
    _refuse_nonfinite(name, {**{k: v for states in local.values() for k, v in states.items()}, **dist_states}, group)

    with agree("preparing the directory"):
        if is_rank0:
            os.makedirs(save_dir, exist_ok=True)
            for entry in os.listdir(save_dir):
                if entry.startswith("tmp-"):
                    remove(os.path.join(save_dir, entry))
            os.makedirs(os.path.join(tmp, DIST_DIR) if dist_parts else tmp)

    with agree("writing per-rank files"):
        for file_name, states in local.items():
            _write_torch(states, os.path.join(tmp, file_name))

    if dist_parts:
        from megatron.core import dist_checkpointing

        with agree("the dist-checkpointing write"):
            dist_checkpointing.save(dist_states, os.path.join(tmp, DIST_DIR))

    meta = {
        "format_version": FORMAT_VERSION,
        "iteration": iteration,
        "parts": {k: p.scope.value for k, p in parts.items()},
        "layout": layout.sizes(),
        "config_hash": fingerprint_hash(fingerprint),
        "fingerprint": fingerprint,
        "extra": extra or {},
    }
    with agree("publishing"):
        if is_rank0:
            _publish(save_dir, tmp, final, iteration, meta)
    if is_rank0 and keep_last:
        try:
            prune_checkpoints(save_dir, keep_last, keep=iteration)
        except OSError as err:  # the new checkpoint is safe; an old one merely survives
            warnings.warn(f"checkpoint pruning in {save_dir} failed: {err}")
    _barrier(group)
    return final


# ----------------------------------------------------------------------------- load


def _check_compatible(meta: dict, parts: dict[str, Part], layout: RankLayout, path: str) -> None:
    saved_parts = meta["parts"]
    for name, part in parts.items():
        if name not in saved_parts:
            raise InputFileError(path, f"has no part {name!r} (it holds {sorted(saved_parts)})")
        if saved_parts[name] != part.scope.value:   # only the optimizer's has a setting (the others: one scope)
            why = (f": resume with --optimizer.use_distributed_optimizer={str(saved_parts[name] == 'rank').lower()} "
                   "(the checkpoint's), or skip it (--checkpoint.no_load_optim)" if name == "optimizer" else "")
            raise InputFileError(path, f"part {name!r} was saved with scope {saved_parts[name]!r}, "
                                       f"the run asks for {part.scope.value!r}{why}")
        saved, now = meta["layout"], layout.sizes()
        diffs = [f"{k} {saved[k]} -> {now[k]}" for k in SCOPE_LAYOUT_KEYS[part.scope] if saved[k] != now[k]]
        if diffs:   # LoRA adapters and the teacher have no other format: no way round
            skip = {"rng": ", or skip it (--checkpoint.no_load_rng)",
                    "optimizer": ", or skip it (--checkpoint.no_load_optim)"}
            raise InputFileError(
                path, f"part {name!r} is stored per {'rank' if part.scope is Scope.RANK else 'model-parallel rank'} and cannot be "
                f"resharded "
                f"({', '.join(diffs)}). Resume with the checkpoint's layout (--model.tensor_model_parallel_size="
                f"{saved['tp_size']} --model.pipeline_model_parallel_size={saved['pp_size']}, "
                f"{saved['world_size']} ranks){skip.get(name, '')}")


def check_fingerprint(meta: dict, fingerprint: dict[str, Any] | None, path: str) -> None:
    saved = meta.get("fingerprint")
    if fingerprint is None or saved is None:
        return
    diffs = fingerprint_diff(saved_as_run(saved), json.loads(json.dumps(fingerprint, default=str)))  # tuples -> lists, as saved
    if diffs:
        raise SettingsDiffer(path, f"the run's settings differ from the checkpoint's: {'; '.join(diffs)}. Use a new "
                                   "--checkpoint.save directory, or --checkpoint.strict_config=false to resume anyway")


def load_checkpoint(
    load_dir: str,
    parts: dict[str, Part],
    layout: RankLayout,
    fingerprint: dict[str, Any] | None = None,
    strict_config: bool = True,
    iteration: int | None = None,
) -> CheckpointInfo | None:
    """Restore ``parts`` from the latest (or the given) checkpoint; None when there is none.

    Checks before touching any state: every requested part exists with the same scope, non-DIST
    parts were saved with this layout, and (``strict_config``) the fingerprints agree. Parts are
    restored in the dict's order (put the RNG part last). DIST parts load collectively.
    """
    named = iteration is None   # by the latest file: a user can write another iteration in it
    if iteration is None:
        iteration = read_latest(load_dir)
        if iteration is None:
            return None
    path = os.path.join(load_dir, iter_dir_name(iteration))
    meta_path = os.path.join(path, META_FILE)
    if not os.path.isfile(meta_path):
        latest = os.path.join(load_dir, LATEST_FILE)
        hint = (f"; {latest} names it, the checkpoints there: {checkpoint_names(load_dir)} (write the iteration of "
                "one into it, or use a new --checkpoint.save directory to start afresh)" if named else "")
        raise FileNotFoundError(f"{path}: no complete checkpoint here ({META_FILE} missing){hint}")
    meta = read_json(meta_path)
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        raise InputFileError(meta_path, f"format_version {meta.get('format_version') if isinstance(meta, dict) else meta!r}, "
                                        f"expected {FORMAT_VERSION}")
    _check_compatible(meta, parts, layout, path)
    if strict_config:
        check_fingerprint(meta, fingerprint, path)

    states: dict[str, Any] = {}
    files: dict[str, dict[str, Any]] = {}
    for name, part in parts.items():
        if part.scope is Scope.DIST:
            continue
        file_name = layout.file_name(part.scope)
        if file_name not in files:
            file_path = os.path.join(path, file_name)
            if not os.path.isfile(file_path):
                raise FileNotFoundError(f"{file_path}: missing (part {name!r}, scope {part.scope.value})")
            files[file_name] = load_torch_file(file_path, map_location="cpu", weights_only=True)
        if name not in files[file_name]:
            raise InputFileError(os.path.join(path, file_name), f"has no entry for part {name!r}")
        states[name] = files[file_name][name]
    dist_parts = {k: p for k, p in parts.items() if p.scope is Scope.DIST}
    if dist_parts:
        templates = {k: (p.template or p.state)() for k, p in dist_parts.items()}
        states.update(load_dist_checkpoint(templates, os.path.join(path, DIST_DIR)))
    for name, part in parts.items():
        try:
            part.load(states[name])
        except PartMismatch as err:   # another model, LoRA rank or target set (model.hf_dir may change)
            where = os.path.join(path, layout.file_name(part.scope) or DIST_DIR)
            raise InputFileError(where, f"part {name!r} does not fit this run: {err}") from err
    return CheckpointInfo(iteration, path, meta)
