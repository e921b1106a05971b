"""A quiet start (``startup.quiet_start``, every command's default) starts vLLM without its own bars: its
"Loading safetensors checkpoint shards" bar was a ``\\r`` redraw in the trainer's and the eval's logs
(Slurm, ``2> log``), between our lines; with ``--verbose`` it is back."""

from __future__ import annotations

import pytest

from phf_megatron import startup

from tests.helpers import run_python

from .conftest import HAS_VLLM, start_engine

BAR = "Loading safetensors checkpoint shards"


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="no vllm")
@pytest.mark.parametrize("quiet", [True, False], ids=["quiet", "verbose"])
def test_a_quiet_start_starts_vllm_without_its_loading_bar(tiny_dir, capfd, monkeypatch, quiet):
    if quiet:
        monkeypatch.setenv(startup.QUIET_ENV, "1")
    else:
        monkeypatch.delenv(startup.QUIET_ENV, raising=False)
    capfd.readouterr()
    engine = start_engine("vllm", tiny_dir)
    try:
        err = capfd.readouterr().err
    finally:
        engine.close()
    assert (BAR in err) is not quiet, err[-2000:]


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_a_process_spawned_by_a_quiet_command_starts_quiet_too(verbose):
    """The eval's data-parallel workers (``multiprocessing`` spawn: a fresh interpreter that calls no
    ``quiet_start``) start their vLLM engines as the command did: without its loading bar when quiet (it
    showed one per replica before), with it under ``--verbose``, also when a quiet command started this one."""
    code = ("import multiprocessing as mp\nfrom phf_megatron import startup\n"
            f"startup.quiet_start({verbose})\n"
            "with mp.get_context('spawn').Pool(1) as pool:\n"
            "    print(startup.started_quiet(), pool.apply(startup.started_quiet))\n")
    env = {"PHF_QUIET_START": "1"} if verbose else {}   # --verbose: a paper_table row's eval (the table quiet)
    proc = run_python(["-c", code], timeout=120, **env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(not verbose)] * 2, proc.stdout


HEAVY = "[m for m in ('torch', 'megatron', 'vllm', 'transformers') if m in sys.modules]"


def test_the_trainer_starts_quiet_before_torch_is_imported(tmp_path):
    """torch reads ``TORCH_LOGS`` / ``TORCH_CPP_LOG_LEVEL`` when imported: the trainer's quiet start must come
    first. The start-up checks (``require_inputs``) imported torch before it (the rollout factory, for the
    vllm_kwargs check), and the main job's log showed torch's "Triton not available" and "NUMA binding" warnings;
    a setting error those checks find (a missing --model.hf_dir) took torch's import time too."""
    code = ("import sys\nfrom phf_megatron import startup\n"
            "def spy(verbose=False):\n"
            f"    print('AT_QUIET_START', {HEAVY})\n"
            "    raise SystemExit(0)\n"
            "startup.quiet_start = spy\n"
            "from phf_megatron.train import train\n"
            f"train(['--model.hf_dir=configs', '--run_dir={tmp_path}'])\n")
    proc = run_python(["-c", code], timeout=120)
    assert proc.returncode == 0 and proc.stdout.splitlines() == ["AT_QUIET_START []"], proc.stdout + proc.stderr
    code = ("import sys\nfrom phf_megatron.train import main\n"
            "rc = main(['--model.hf_dir=/nonexistent/hf'])\n"
            f"print('HEAVY', {HEAVY}); sys.exit(rc)\n")
    proc = run_python(["-c", code], timeout=120)
    assert proc.stderr.splitlines() == ["error: --model.hf_dir: /nonexistent/hf does not exist"], proc.stderr
    assert (proc.returncode, proc.stdout.splitlines()) == (2, ["HEAVY []"])
