"""A quiet start (``startup.quiet_start``, every command's default) starts vLLM without its own bars: its
"Loading safetensors checkpoint shards" bar was a ``\\r`` redraw in the trainer's and the eval's logs
(Slurm, ``2> log``), between our lines; with ``--verbose`` it is back."""

from __future__ import annotations

import pytest

from phf_megatron import startup

from .conftest import HAS_VLLM, start_engine

BAR = "Loading safetensors checkpoint shards"


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="no vllm")
@pytest.mark.parametrize("quiet", [True, False], ids=["quiet", "verbose"])
def test_a_quiet_start_starts_vllm_without_its_loading_bar(tiny_dir, capfd, monkeypatch, quiet):
    monkeypatch.setattr(startup, "_QUIET", quiet)
    capfd.readouterr()
    engine = start_engine("vllm", tiny_dir)
    try:
        err = capfd.readouterr().err
    finally:
        engine.close()
    assert (BAR in err) is not quiet, err[-2000:]
