"""fp16 loss scaling: the ``optimizer.*loss_scale*`` / ``hysteresis`` settings reach Megatron's grad scaler
(the real student, ``build_student``, on one gloo rank), a static scale's overflow is a non-finite step (as
Megatron keeps its NaN check on for a static scale) while a dynamic scale's is its search, and bad values are
one line naming the flag."""

from __future__ import annotations

import pytest

from phf_megatron.errors import ConfigError
from phf_megatron.training.config_io import fingerprint_diff, load_config, resume_fingerprint

from ..helpers.spawn import megatron_layout, run_ranks
from .test_nonfinite import small_hf  # noqa: F401 - the fixture: a 4-layer Qwen3, 256-token vocabulary

SETTINGS = ("loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis")


def _scaler(student) -> dict:
    """The grad scaler's settings (the same in every optimizer of Megatron's chain)."""
    found = []
    for o in getattr(student.optimizer, "chained_optimizers", [student.optimizer]):
        s = o.grad_scaler
        found.append(dict(kind=type(s).__name__, scale=float(s.scale), min_scale=float(getattr(s, "min_scale", 0.0)),
                          window=getattr(s, "growth_interval", None), hysteresis=getattr(s, "hysteresis", None)))
    assert found and all(f == found[0] for f in found), found
    return found[0]


def _student(hf_dir: str, overrides: tuple[str, ...], dtype: str = "float16"):
    import torch

    from phf_megatron.training.model_setup import build_student

    from .nonfinite_ranks import _config

    megatron_layout(1, 1)
    cfg = _config(hf_dir, 1, 1, False, dtype, *overrides)
    torch.manual_seed(0)
    return cfg, build_student(cfg, num_rows=64)


def _steps(hf_dir: str, overrides: tuple[str, ...], steps: int, dtype: str = "float16",
           inf_grad_at: tuple[int, ...] = (), nan_loss_at: tuple[int, ...] = ()) -> tuple[dict | None, list]:
    """The student's grad scaler as built, and ``steps`` updates' (update_skipped, nonfinite, loss_scale metric);
    ``inf_grad_at``: the steps (from 1) given an inf gradient."""
    from phf_megatron.training.methods.phf import PhfMethod
    from phf_megatron.training.nonfinite import Fault
    from phf_megatron.training.update import run_update

    from .nonfinite_ranks import _microbatches

    cfg, student = _student(hf_dir, overrides, dtype)
    built = _scaler(student) if dtype == "float16" else None
    method = PhfMethod(cfg, student)
    mbs = _microbatches(1, False, cfg.objective.flow_window)
    updates = (run_update(student, method, mbs, faults=(Fault(i, "grad", float("inf")),) * (i in inf_grad_at)
                          + (Fault(i, "loss", float("nan")),) * (i in nan_loss_at)) for i in range(1, steps + 1))
    log = [(m["update_skipped"], m["nonfinite"], m.get("loss_scale")) for m in updates]
    method.close()
    return built, log


def _static_resumed(hf_dir: str, overrides: tuple[str, ...], dtype: str = "float16") -> tuple[dict | None, list[str]]:
    """A static scale's optimizer state (checkpoint part), loaded by a student built with ``overrides``: its
    scaler (None without one: bfloat16 without optimizer.loss_scale), and what Megatron's optimizer logged
    (INFO and above) on the way."""
    import logging

    from phf_megatron.training.checkpoint_parts import optimizer_part
    from phf_megatron.training.nonfinite import grad_scaler

    saved = optimizer_part(_student(hf_dir, ("--optimizer.loss_scale=8",), dtype)[1].optimizer).state()
    _, resumed = _student(hf_dir, overrides, dtype)
    logged: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: logged.append(record.getMessage())
    logger = logging.getLogger("megatron.core.optimizer")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        optimizer_part(resumed.optimizer).load(saved)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return (_scaler(resumed) if grad_scaler(resumed.optimizer) is not None else None), logged


def _runs(rank: int, world_size: int, hf_dir: str) -> dict:
    return {
        "static_resumed_dynamic": _static_resumed(hf_dir, ("--optimizer.initial_loss_scale=1024",)),
        "static_resumed_static": _static_resumed(hf_dir, ("--optimizer.loss_scale=16",)),
        "default": _steps(hf_dir, (), 0),
        "set": _steps(hf_dir, ("--optimizer.initial_loss_scale=1024", "--optimizer.min_loss_scale=4",
                               "--optimizer.loss_scale_window=7", "--optimizer.hysteresis=3"), 0),
        "dynamic_2^32": _steps(hf_dir, ("--optimizer.initial_loss_scale=4294967296",), 2),
        "static_2^32": _steps(hf_dir, ("--optimizer.loss_scale=4294967296",), 2),
        "dynamic_at_floor": _steps(hf_dir, ("--optimizer.initial_loss_scale=4294967296",
                                            "--optimizer.min_loss_scale=4294967296"), 2),
        "static_1": _steps(hf_dir, ("--optimizer.loss_scale=1",), 1),
        "floor_window_2": _steps(hf_dir, ("--optimizer.initial_loss_scale=1", "--optimizer.min_loss_scale=1",
                                          "--optimizer.loss_scale_window=2"), 3, inf_grad_at=(2,)),
        "nan_loss_hysteresis_1": _steps(hf_dir, ("--optimizer.initial_loss_scale=1024", "--optimizer.hysteresis=1"),
                                        2, nan_loss_at=(1,)),
        "float32": _steps(hf_dir, (), 1, "float32"),
    }


def test_loss_scale_settings_reach_megatrons_grad_scaler_and_a_static_overflow_is_nonfinite(small_hf):  # noqa: F811
    runs = run_ranks(_runs, 1, small_hf)[0]
    assert runs["default"][0] == dict(kind="DynamicGradScaler", scale=2.0**16, min_scale=1.0, window=1000, hysteresis=2)
    assert runs["set"][0] == dict(kind="DynamicGradScaler", scale=1024.0, min_scale=4.0, window=7, hysteresis=3)
    assert runs["static_2^32"][0]["kind"] == "ConstantGradScaler" and runs["static_2^32"][0]["scale"] == 2.0**32
    # a dynamic scale's overflow is its search (skipped, not non-finite); a static one never moves: non-finite
    # (the loss_scale metric: hysteresis 2 halves the scale at the second overflow, a static one never moves)
    assert runs["dynamic_2^32"][1] == [(True, None, 2.0**32), (True, None, 2.0**31)]
    assert [(skipped, scale) for skipped, _, scale in runs["static_2^32"][1]] == [(True, 2.0**32)] * 2
    assert all(what and what.startswith("gradient ") and "on rank 0" in what for _, what, _ in runs["static_2^32"][1])
    # at min_loss_scale the search is over: an overflow there is non-finite (counted; max_nonfinite_steps stops)
    assert [(skipped, scale) for skipped, _, scale in runs["dynamic_at_floor"][1]] == [(True, 2.0**32)] * 2
    assert all(what and what.startswith("gradient ") for _, what, _ in runs["dynamic_at_floor"][1])
    assert runs["static_1"][1] == [(False, None, 1.0)]  # the same step, unscaled: it trains
    # an overflow found at the floor still restarts the scaler's growth count, as in Megatron: clean, inf, clean
    # with loss_scale_window 2 does not double the scale (it did when the scaler never saw the skipped step)
    assert [(skipped, scale) for skipped, _, scale in runs["floor_window_2"][1]] == [(False, 1.0), (True, 1.0), (False, 1.0)]
    # a non-finite loss (found by the check, above the floor too) is an overflow to the scaler, as its NaN
    # gradients are to Megatron: hysteresis 1 halves the scale, then a clean step trains
    [(skipped, what, scale), clean] = runs["nan_loss_hysteresis_1"][1]
    assert skipped and what.startswith("loss (nan)") and scale == 512.0 and clean == (False, None, 512.0)
    assert runs["float32"][1] == [(False, None, None)]  # no scaler, no loss_scale metric
    # a run saved with a static scale resumes with a dynamic one (Megatron's loader raised KeyError 'scale')
    assert runs["static_resumed_dynamic"][0]["kind"] == "DynamicGradScaler"
    assert runs["static_resumed_dynamic"][0]["scale"] == 1024.0
    # and with a static one, quietly (no "found an old checkpoint, will not load grad scaler" from Megatron)
    assert runs["static_resumed_static"] == ({**runs["static_resumed_static"][0], "kind": "ConstantGradScaler",
                                              "scale": 16.0}, [])


def _bf16_static_resumed(rank: int, world_size: int, hf_dir: str) -> dict:
    return {"none": _static_resumed(hf_dir, (), "bfloat16"),
            "static": _static_resumed(hf_dir, ("--optimizer.loss_scale=16",), "bfloat16")}


def test_a_bfloat16_run_saved_with_a_static_scale_resumes_quietly_with_or_without_one(small_hf):  # noqa: F811
    """bfloat16 has a scaler only with optimizer.loss_scale (Megatron's rule), and a resume may drop it: the
    saved (empty) grad-scaler state is then not loaded, and Megatron says nothing ("fould the grad scaler in
    the checkpoint but it is None in the class" was logged when the state was kept for any non-dynamic scaler)."""
    runs = run_ranks(_bf16_static_resumed, 1, small_hf)[0]
    assert runs["none"] == (None, [])
    assert runs["static"] == ({**runs["static"][0], "kind": "ConstantGradScaler", "scale": 16.0}, [])


@pytest.mark.parametrize("override, key", [
    ("--optimizer.loss_scale=0", "optimizer.loss_scale"),
    ("--optimizer.initial_loss_scale=-1", "optimizer.initial_loss_scale"),
    ("--optimizer.min_loss_scale=0", "optimizer.min_loss_scale"),
    ("--optimizer.min_loss_scale=1e6", "optimizer.min_loss_scale"),   # above the initial 2^16
    ("--optimizer.loss_scale_window=0", "optimizer.loss_scale_window"),
    ("--optimizer.hysteresis=0", "optimizer.hysteresis"),
])
def test_bad_loss_scale_settings_are_one_line_naming_the_flag(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value).startswith(f"{key}:") and f"--{key}=" in str(err.value) and "\n" not in str(err.value)


def test_a_checkpoint_saved_before_the_settings_existed_still_resumes():
    """Megatron lets a resumed run change its loss scaling (the dynamic scale continues from the checkpoint's):
    the settings are not in the resume fingerprint, so an older checkpoint's fingerprint, without them, agrees."""
    cfg = load_config(None, ["--optimizer.initial_loss_scale=1024", "--optimizer.hysteresis=5"])
    older = {k: v for k, v in resume_fingerprint(load_config(None, [])).items()
             if k.split(".")[-1] not in SETTINGS}
    assert fingerprint_diff(older, resume_fingerprint(cfg)) == []
