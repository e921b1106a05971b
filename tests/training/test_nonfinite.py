"""A NaN or inf in a loss or a gradient, on any rank, skips that update on every rank, and nothing
non-finite is ever written (checkpoints, PEFT and HF exports).

The multi-rank test trains the real student (``build_student``: LoRA, DDP, Megatron's optimizer,
the LR schedule; the EMA teacher) with ``update.run_update`` at TP 2 + SP, PP 2 and DP 2 on two gloo
ranks. Steps 2-5 get a NaN/inf loss or gradient entry (``nonfinite.Fault``: on one rank or on all);
the reference run is the same run with steps 2-5 left out. Skipping must leave exactly the
reference's weights, Adam moments and step count, schedule and EMA shadow: the same operations
in the same order on the same process layout, so equality is bitwise.
"""

from __future__ import annotations

import os

import pytest
import torch

from phf_megatron.errors import NonFiniteError
from phf_megatron.output_files import first_nonfinite
from phf_megatron.training import checkpoint as ckpt
from phf_megatron.training.checkpoint_parts import RankLayout, tensors_part
from phf_megatron.training.nonfinite import parse_faults

from ..helpers import run_python
from ..helpers.spawn import run_ranks
from ..helpers.tiny_run import assert_ok, read_metrics, train_command
from ..helpers.tiny_qwen3 import save_tiny_hf, tiny_hf_model
from . import nonfinite_ranks

LAYOUTS = [("tp2_sp", 2, 1, True), ("pp2", 1, 2, False), ("dp2", 1, 1, False)]


@pytest.fixture(scope="module")
def small_hf(tmp_path_factory):
    """A 4-layer Qwen3 with a 256-token vocabulary (no tokenizer: ``run_update`` takes token ids)."""
    path = str(tmp_path_factory.mktemp("nonfinite") / "hf")
    save_tiny_hf(tiny_hf_model("gqa", seed=0), path, with_tokenizer=False)
    return path


def _assert_same(a, b, where):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _dicts(tree):
    """Every dict in a state tree (Adam's per-parameter states among them)."""
    if isinstance(tree, dict):
        yield tree
        for v in tree.values():
            yield from _dicts(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _dicts(v)


def _all_finite(tree) -> bool:
    if isinstance(tree, torch.Tensor):
        return not tree.is_floating_point() or bool(torch.isfinite(tree).all())
    if isinstance(tree, dict):
        return all(_all_finite(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return all(_all_finite(v) for v in tree)
    return True


def test_nonfinite_steps_are_skipped_on_every_rank_at_tp2_sp_pp2_dp2(small_hf, tmp_path):
    results = run_ranks(nonfinite_ranks.poisoned_and_clean, 2, small_hf, LAYOUTS, "float32", str(tmp_path))
    for name, *_ in LAYOUTS:
        for rank, by_run in enumerate(results):
            poisoned, clean = by_run[name]["poisoned"], by_run[name]["clean"]
            where = f"{name} rank {rank}"
            assert [s for s, skipped, *_ in poisoned["log"] if skipped] == [2, 3, 4, 5], where
            assert not any(skipped for _, skipped, *_ in clean["log"]), where
            for key in ("weights", "optimizer", "scheduler", "shadow"):
                assert _all_finite(poisoned[key]), (where, key)
                _assert_same(poisoned[key], clean[key], f"{where} {key}")
            assert clean["scheduler"][0] == 2
            adam = [v for v in _dicts(poisoned["optimizer"]) if isinstance(v, dict) and "exp_avg" in v]
            assert adam and all(float(v["step"]) == 2 for v in adam), where  # two Adam steps, not six
            # the run moved: the comparison is not between two untouched models
            assert any(not torch.equal(s, w) for s, w in zip(clean["shadow"], clean["weights"].values())), where
        # every rank names the same finding; a fault on one rank is named with that rank
        found = {step: what for step, _, what, _ in results[0][name]["poisoned"]["log"]}
        assert all({s: w for s, _, w, _ in r[name]["poisoned"]["log"]} == found for r in results), name
        first = [r[name]["poisoned"]["first_param"] for r in results]
        assert found[1] is None and found[6] is None
        assert "loss (nan) on rank 1" in found[2] and "loss" not in found[2].replace("loss (nan) on rank 1", ""), found[2]
        assert found[3] == f"gradient {first[0]} (inf) on rank 0", found[3]
        assert "loss (inf) on rank 1" in found[4], found[4]
        assert found[5] == f"gradient {first[1]} (nan) on rank 1", found[5]
        # a NaN adapter entry on one rank (of the gathered ones) stops the PEFT export: one line, nothing written
        error = results[0][name]["clean"]["export_error"]
        assert error is not None and error.startswith(f"{tmp_path / name}: not written: base_model.model."), error
        assert "holds 1 NaN of" in error and results[1][name]["clean"]["export_error"] is None
        assert not os.path.exists(tmp_path / name) and not os.path.exists(f"{tmp_path / name}.tmp")


def _train(hf, data, run, faults, *overrides):
    argv, _ = train_command(hf, data, run, "--checkpoint.save_interval=2", "--optimizer.lr=1e-3", *overrides)
    return run_python(argv[1:], timeout=600, PHF_INJECT_NONFINITE=faults)


def test_the_trainer_counts_skipped_steps_saves_finite_checkpoints_and_stops_after_too_many(tiny_inputs, tmp_path):
    """The trainer as a user runs it, with a NaN loss at step 2 and an inf gradient at step 3:
    both counted, the checkpoint at step 2 finite and resumable; then a run whose steps 1-2 are
    poisoned with ``training.max_nonfinite_steps=2`` stops with one line, exit code 2."""
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    assert_ok(_train(hf, data, run, "2:loss:nan,3:grad:inf", "--training.train_iters=4"))
    metrics = read_metrics(run)
    assert [m["update_skipped"] for m in metrics] == [False, True, True, False]
    assert [m["nonfinite_steps"] for m in metrics] == [0, 1, 2, 2]
    assert metrics[1]["nonfinite"].startswith("loss (nan) on rank 0; gradient ") and metrics[1]["grad_norm"] is None
    assert metrics[2]["nonfinite"].startswith("gradient decoder.layers.0.") and "(inf) on rank 0" in metrics[2]["nonfinite"]
    assert metrics[1]["lr"] == metrics[2]["lr"] == metrics[3]["lr"]  # the schedule did not move on the skipped steps
    # no push of the unchanged weights after a skipped step (the last sync's report stays), a verified one after step 4
    pushes = [m["time_engine_sync_s"] for m in metrics]
    assert pushes[1] == pushes[2] == 0 < min(pushes[0], pushes[3]) and metrics[3]["sync_probe_diff"] <= 1e-4, metrics
    assert metrics[1]["sync_probe_diff"] == metrics[2]["sync_probe_diff"] == metrics[0]["sync_probe_diff"], metrics
    saved = torch.load(os.path.join(run, "checkpoints", "iter_0000002", "model_parallel_tp00_pp000.pt"),
                       weights_only=True)
    assert _all_finite(saved) and saved["adapters"]
    assert_ok(_train(hf, data, run, "", "--training.train_iters=5"))  # resumes from iter 4; counts carried on
    assert [m["nonfinite_steps"] for m in read_metrics(run)] == [0, 1, 2, 2, 2]

    stopped = str(tmp_path / "stopped")
    proc = _train(hf, data, stopped, "1:grad:nan,2:loss:inf", "--training.train_iters=4",
                  "--training.max_nonfinite_steps=2")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert lines == [line for line in proc.stderr.splitlines() if line.strip()][-1:], proc.stderr[-3000:]
    assert lines[0].startswith("error: step 2: 2 consecutive steps with a non-finite loss or gradient "
                               "(training.max_nonfinite_steps), the last: loss (inf) on rank 0"), lines
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(os.path.join(stopped, "checkpoints", "iter_0000002"))


def _gpu_worker(rank: int, port: int, hf_dir: str, out: str) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        torch.save(nonfinite_ranks.poisoned_and_clean(0, 1, hf_dir, [("gpu", 1, 1, False)], "bfloat16"), out)
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.mark.gpu
def test_nonfinite_steps_are_skipped_in_bf16_on_a_gpu(small_hf, tmp_path):
    """One rank on a GPU with NCCL, bf16 weights with fp32 main grads (Megatron's Float16 optimizer,
    no loss scaler, so Megatron itself would not skip): the poisoned run equals the reference run
    (to bf16 rounding: CUDA kernels need not be bitwise repeatable), nothing in it non-finite.

        pytest -m gpu tests/training/test_nonfinite.py
    """
    import torch.multiprocessing as mp

    from ..helpers.spawn import free_port

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out = str(tmp_path / "result.pt")
    mp.spawn(_gpu_worker, args=(free_port(), small_hf, out), nprocs=1, join=True)
    result = torch.load(out, weights_only=False)
    poisoned, clean = result["gpu"]["poisoned"], result["gpu"]["clean"]
    assert [s for s, skipped, *_ in poisoned["log"] if skipped] == [2, 3, 4, 5]
    assert poisoned["scheduler"] == clean["scheduler"]
    for key in ("weights", "shadow"):
        assert _all_finite(poisoned[key]), key
        a = poisoned[key].values() if isinstance(poisoned[key], dict) else poisoned[key]
        b = clean[key].values() if isinstance(clean[key], dict) else clean[key]
        for x, y in zip(a, b):
            torch.testing.assert_close(x.float(), y.float(), rtol=2e-2, atol=1e-3)


def test_fault_settings_parse_and_name_the_variable_when_malformed():
    [a, b] = parse_faults("2:loss:nan, 3:grad:-inf:1")
    assert (a.step, a.target, a.rank) == (2, "loss", None) and a.value != a.value
    assert (b.step, b.target, b.value, b.rank) == (3, "grad", float("-inf"), 1)
    assert parse_faults("") == ()
    for bad in ("2:loss", "2:weights:nan", "2:loss:1.0", "x:loss:nan"):
        with pytest.raises(ValueError, match="PHF_INJECT_NONFINITE"):
            parse_faults(bad)


def test_first_nonfinite_names_the_tensor_and_what_it_holds():
    assert first_nonfinite({"a": torch.ones(3), "ids": torch.arange(3), "empty": torch.ones(0)}.items()) is None
    bad = {"a": torch.ones(3), "b": torch.tensor([1.0, float("nan"), float("inf"), float("-inf")]).bfloat16(),
           "c": torch.tensor([float("nan")])}
    assert first_nonfinite(bad.items()) == "b holds 1 NaN, 2 inf of 4 values"


def test_a_checkpoint_with_a_nonfinite_tensor_is_refused_and_the_previous_one_kept(tmp_path):
    save = str(tmp_path / "ckpt")
    weights = {"w": torch.ones(4), "v": torch.zeros(2)}
    optim = {"exp_avg": torch.zeros(4)}
    parts = {"weights": tensors_part(weights), "optimizer": tensors_part(optim)}
    ckpt.save_checkpoint(save, 1, parts, RankLayout())
    before = sorted(os.listdir(save)), sorted(os.listdir(os.path.join(save, "iter_0000001")))
    optim["exp_avg"][2] = float("inf")
    with pytest.raises(NonFiniteError, match=r"checkpoint iter_0000002 not saved: optimizer\['exp_avg'\] holds "
                                             r"1 inf of 4 values; the previous checkpoint is intact"):
        ckpt.save_checkpoint(save, 2, parts, RankLayout())
    assert (sorted(os.listdir(save)), sorted(os.listdir(os.path.join(save, "iter_0000001")))) == before
    assert ckpt.read_latest(save) == 1
    weights["w"].zero_()
    ckpt.load_checkpoint(save, {"weights": tensors_part(weights)}, RankLayout())
    assert torch.equal(weights["w"], torch.ones(4))


def test_hf_export_with_a_nonfinite_weight_is_not_written(tmp_path):
    from phf_megatron.convert.hf_writer import write_hf_checkpoint

    out = str(tmp_path / "hf")
    # 1e39 is finite in float64, inf once written as bfloat16: checked in the written dtype
    items = [("model.embed_tokens.weight", torch.ones(4, 2, dtype=torch.float64)),
             ("lm_head.weight", torch.full((4, 2), 1e39, dtype=torch.float64))]
    with pytest.raises(NonFiniteError, match=r"hf: not written: lm_head.weight holds 8 inf of 8 values"):
        write_hf_checkpoint(iter(items), out, hf_config={"model_type": "qwen3"}, dtype=torch.bfloat16)
    assert not os.path.exists(out) and not os.path.exists(out + ".tmp")

