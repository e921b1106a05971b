"""What each rank runs for ``test_nonfinite.py``: the real student (``build_student``: Megatron Qwen3,
LoRA, DDP, Megatron's optimizer, the LR schedule) and EMA teacher, trained with ``update.run_update`` on
a fixed batch (random prompts and rollouts through the trainer's ``build_microbatches``), once with
injected NaN/inf steps and once with those steps simply left out.

Returns, per layout, this rank's final state (trainable weights, the optimizer's state dict, the
schedule's step count and LR, the EMA shadow), every step's ``update_skipped`` / ``nonfinite``,
and the global name of this rank's first trainable parameter (where grad faults land).
"""

from __future__ import annotations

import os

import torch

from phf_megatron.training.nonfinite import Fault

from ..helpers import REPO
from ..helpers.spawn import megatron_layout

VOCAB = 256
#: (student prompt length, extra teacher prompt length, rollout length) of the batch's 8 samples
SAMPLES = [(3, 4, 9), (2, 6, 1), (4, 3, 2), (5, 5, 10), (3, 3, 6), (2, 4, 8), (4, 6, 3), (3, 5, 7)]



def poisoned(world_size: int) -> list[tuple[int, tuple[Fault, ...]]]:
    """(step, faults) of the poisoned run (steps numbered as metrics.jsonl numbers them): a NaN loss
    on the last rank, an inf gradient entry on rank 0, an inf loss on every rank, a NaN gradient
    entry on the last rank."""
    last = world_size - 1
    return [(1, ()), (2, (Fault(2, "loss", float("nan"), rank=last),)), (3, (Fault(3, "grad", float("inf"), rank=0),)),
            (4, (Fault(4, "loss", float("inf")),)), (5, (Fault(5, "grad", float("nan"), rank=last),)), (6, ())]


#: the reference: the same run with the poisoned steps left out
CLEAN = [(1, ()), (6, ())]


def _config(hf_dir: str, tp: int, pp: int, sp: bool, dtype: str, *overrides: str):
    from phf_megatron.training.config_io import load_config

    return load_config(os.path.join(REPO, "configs", "tiny_cpu.yaml"), [
        f"--model.hf_dir={hf_dir}", f"--model.tensor_model_parallel_size={tp}",
        f"--model.pipeline_model_parallel_size={pp}", f"--model.sequence_parallel={str(sp).lower()}",
        f"--model.dtype={dtype}", "--data.max_prompt_length=64", "--rollout.max_tokens=16", "--optimizer.lr=1e-2",
        "--optimizer.lr_decay_iters=8", "--objective.ema_decay=0.5", "--objective.flow_window=5", *overrides])


def _microbatches(tp: int, sp: bool, window: int):
    """This DP rank's two micro-batches of the fixed global batch."""
    from megatron.core import parallel_state as ps

    from phf_megatron.data import PromptPair
    from phf_megatron.training.batches import build_microbatches

    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(0, VOCAB, (n,), generator=g).tolist()  # noqa: E731
    pairs, completions = [], []
    for prompt, extra, rollout in SAMPLES:
        student = ids(prompt)
        pairs.append(PromptPair(student, student + ids(extra)))
        completions.append(ids(rollout))
    dp = ps.get_data_parallel_world_size()
    return build_microbatches(pairs, completions, pad_id=None, micro_batch_size=len(SAMPLES) // dp // 2,
                              dp_rank=ps.get_data_parallel_rank(), dp_size=dp, pad_multiple=tp if sp else 1,
                              window_budget=window)


def _plain(tree):
    """Tensors to CPU clones, containers rebuilt (for returning and comparing)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu().clone()
    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_plain(v) for v in tree]
    return tree


def _export_poisoned(chunks, cfg, out_dir: str) -> str | None:
    """A NaN in this rank's last adapter tensor, then the PEFT export (a collective): the error
    rank 0 raised (the other ranks write nothing), or None."""
    from phf_megatron.errors import NonFiniteError
    from phf_megatron.lora.export import export_peft_adapter

    with torch.no_grad():
        [p for p in (p for c in chunks for p in c.parameters()) if p.requires_grad][-1].view(-1)[0] = float("nan")
    try:
        export_peft_adapter(chunks, out_dir, cfg.lora)
    except NonFiniteError as err:
        return str(err)
    return None


def _train(hf_dir: str, tp: int, pp: int, sp: bool, steps, dtype: str = "float32", export_to: str | None = None) -> dict:
    from phf_megatron.training.methods.phf import PhfMethod
    from phf_megatron.training.model_setup import build_student
    from phf_megatron.training.nonfinite import _trainable
    from phf_megatron.training.schedule import current_lr
    from phf_megatron.training.update import run_update

    megatron_layout(tp, pp)
    cfg = _config(hf_dir, tp, pp, sp, dtype)
    torch.manual_seed(0)
    student = build_student(cfg, num_rows=64)
    method = PhfMethod(cfg, student)  # the EMA teacher and the capture
    teacher = method.teacher
    mbs = _microbatches(tp, sp, cfg.objective.flow_window)
    log = []
    for step, faults in steps:
        m = run_update(student, method, mbs, faults=faults)
        log.append((step, m["update_skipped"], m["nonfinite"], m["grad_norm"]))
    method.close()
    state = dict(
        weights={name: p for name, p in _trainable(student.chunks)},
        optimizer=student.optimizer.state_dict(),
        scheduler=(student.scheduler.num_steps, current_lr(student.scheduler)),
        shadow=teacher.state_dict()["shadow"],
        log=log,
        first_param=_trainable(student.chunks)[0][0],
    )
    if export_to is not None:  # after the state is taken: the export's own NaN is not the run's
        state = _plain(state)
        state["export_error"] = _export_poisoned(student.chunks, cfg, export_to)
    return state


def poisoned_and_clean(rank: int, world_size: int, hf_dir: str, layouts, dtype: str = "float32",
                       export_root: str | None = None) -> dict:
    """``{layout name: {"poisoned": state, "clean": state}}`` of this rank (``layouts``: name, tp, pp, sp);
    with ``export_root`` the clean run then exports a poisoned adapter to ``<export_root>/<layout>``."""
    out = {}
    for name, tp, pp, sp in layouts:
        export = os.path.join(export_root, name) if export_root else None
        out[name] = {"poisoned": _plain(_train(hf_dir, tp, pp, sp, poisoned(world_size), dtype)),
                     "clean": _plain(_train(hf_dir, tp, pp, sp, CLEAN, dtype, export_to=export))}
    return out
