"""The step-time model of docs/scaling.md: its equations against step-by-step sums, the orderings
the document's conclusions rest on, and the document's tables against the model."""

import json
import math
import os
import socket
import subprocess
import sys
from dataclasses import replace

import pytest

from benchmarks.scaling_inputs import (CPU_DECODE, PAPER, TOY, cpu_costs, cpu_toy, doc_blocks, paper_costs,
                                       render_doc, sections, toy_setting)
from benchmarks.scaling_model import (MODES, Costs, DecodeCost, IdsCost, decode_step_s, fit_line, prefill_s, rollout_s,
                                      step_time, wave_s)
from phf_megatron.runtime.process_group import standalone_environ

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
NODES = (1, 2, 3, 4, 8, 16)


def presets() -> list[Costs]:
    return [c for pair in paper_costs().values() for c in pair] + cpu_costs()


def loop_wave(c: DecodeCost, batch: int, prompt_len: int, rollout_len: int) -> float:
    """Eq. W the slow way: the prefill, then one decode step per further token."""
    return prefill_s(c, batch, prompt_len) + sum(decode_step_s(c, batch, prompt_len + i) for i in range(1, rollout_len))


@pytest.mark.parametrize("cost", [
    DecodeCost(fixed_s=1e-3, per_seq_s=2e-5, per_ctx_token_s=3e-7, compute_per_seq_s=1e-4, prefill_fixed_s=2e-3,
               prefill_per_token_s=1e-6, per_request_s=5e-5),                       # floor wins first, then KV growth
    DecodeCost(fixed_s=1e-3, per_seq_s=2e-5, per_ctx_token_s=3e-8, compute_per_seq_s=1e-6),   # floor never wins
    DecodeCost(fixed_s=1e-4, per_seq_s=0.0, per_ctx_token_s=0.0, compute_per_seq_s=1e-4),     # floor always wins
    DecodeCost(fixed_s=2e-3, per_seq_s=1e-4),                                                  # no KV term
], ids=["crossing", "latency", "saturated", "flat"])
@pytest.mark.parametrize("batch,prompt_len,rollout_len", [(1, 10, 1), (4, 256, 1024), (64, 30, 777), (300, 5, 2000)])
def test_wave_closed_form_equals_the_step_by_step_sum(cost, batch, prompt_len, rollout_len):
    assert wave_s(cost, batch, prompt_len, rollout_len) == pytest.approx(
        loop_wave(cost, batch, prompt_len, rollout_len), rel=1e-11)


def test_the_crossing_case_does_cross():
    c = DecodeCost(fixed_s=1e-3, per_seq_s=2e-5, per_ctx_token_s=3e-7, compute_per_seq_s=1e-4)
    steps = [decode_step_s(c, 64, 10 + i) for i in range(1, 2000)]
    floor = 64 * c.compute_per_seq_s
    assert steps[0] == floor and steps[-1] > floor * 1.5


def test_sequences_beyond_the_kv_cache_run_in_waves():
    c = DecodeCost(fixed_s=1e-3, per_seq_s=1e-5, per_ctx_token_s=1e-8, kv_capacity_tokens=3 * (100 + 50) + 10)
    seconds, waves = rollout_s(c, 7, 100, 50)      # 3 fit at a time: 3 + 3 + 1
    assert waves == 3
    assert seconds == pytest.approx(2 * wave_s(c, 3, 100, 50) + wave_s(c, 1, 100, 50), rel=1e-12)
    with pytest.raises(ValueError, match="rollout_len"):
        rollout_s(c, 1, 100, 400)


@pytest.mark.parametrize("costs", presets(), ids=lambda c: c.name)
def test_engine_groups_are_never_slower_than_one_engine_with_local_sync(costs):
    for nodes in NODES:
        for prompts in (32, 96, 512):
            for length in (64, 1024, 4096):
                s = replace(PAPER, nodes=nodes, prompts=prompts, rollout_len=length, devices_per_node=8)
                one, groups = step_time(s, costs, "one"), step_time(s, costs, "groups")
                assert groups.total_s <= one.total_s + 1e-12, (nodes, prompts, length)
                if nodes > 1:   # every preset has a per-sequence term: splitting the batch helps
                    assert groups.rollout_s < one.rollout_s


def test_latency_bound_decode_gains_nothing_from_more_engines():
    flat = DecodeCost(fixed_s=2e-3, per_seq_s=0.0)
    c = replace(paper_costs()["H100 1.7b"][0], decode=flat, ids=IdsCost(0.0, 4.0, 1e9))
    for nodes in NODES:
        s = replace(PAPER, nodes=nodes, prompts=32 * nodes)
        assert step_time(s, c, "groups").rollout_s == pytest.approx(step_time(s, c, "one").rollout_s, rel=1e-12)


def test_funnelled_sync_can_make_engine_groups_slower_than_one_engine():
    flat = DecodeCost(fixed_s=2e-3, per_seq_s=1e-6)
    c = replace(paper_costs()["H100 8b"][0], decode=flat)
    s = replace(PAPER, nodes=16, prompts=32, sync_topology="funnel")
    assert step_time(s, c, "groups").total_s > step_time(s, c, "one").total_s
    assert step_time(replace(s, sync_topology="local"), c, "groups").total_s <= step_time(s, c, "one").total_s


@pytest.mark.parametrize("costs", presets(), ids=lambda c: c.name)
def test_overlap_is_bounded_by_the_longer_side_and_hides_the_shorter(costs):
    for nodes in NODES:
        s = replace(PAPER, nodes=nodes, prompts=32 * nodes)
        c_ = step_time(s, costs, "overlap")
        assert c_.total_s >= max(c_.rollout_s + c_.ids_s, c_.train_s) + c_.sync_s - 1e-12
        assert c_.total_s >= max(c_.rollout_s, c_.train_s)
        # engines that take no trainer devices: (c) = (b) less the shorter side and the wake-up
        own = replace(s, engines_take_trainer_devices=False)
        b, c2 = step_time(own, costs, "groups"), step_time(own, costs, "overlap")
        assert c2.train_devices == b.train_devices
        assert b.total_s - c2.total_s == pytest.approx(min(b.rollout_s + b.ids_s, b.train_s) + b.wake_s, rel=1e-9)


@pytest.mark.parametrize("costs", presets(), ids=lambda c: c.name)
@pytest.mark.parametrize("mode", MODES)
def test_step_time_grows_with_rollout_length_and_prompts(costs, mode):
    s = replace(PAPER, nodes=2)
    lengths = [step_time(replace(s, rollout_len=n), costs, mode).total_s for n in (1, 2, 16, 256, 1024, 3000, 8192)]
    assert lengths == sorted(lengths) and lengths[-1] > lengths[0]
    prompts = [step_time(replace(s, prompts=p), costs, mode).total_s for p in (1, 2, 8, 32, 100, 512)]
    assert prompts == sorted(prompts) and prompts[-1] > prompts[0]


def test_layouts_that_do_not_fit_are_refused_by_name():
    c = paper_costs()["H100 8b"][0]          # TP-2 engines
    with pytest.raises(ValueError, match="engines"):
        step_time(replace(PAPER, engines=5), c, "groups")
    with pytest.raises(ValueError, match="devices"):
        step_time(replace(PAPER, engines=4), c, "overlap")   # 4 x 2 GPUs leave the trainer none
    with pytest.raises(ValueError, match="mode"):
        step_time(PAPER, c, "async")
    with pytest.raises(ValueError, match="sync_topology"):
        step_time(replace(PAPER, nodes=2, sync_topology="ring"), c, "groups")


def test_fit_line_recovers_a_line_and_weights_relative_errors():
    x = [1, 2, 4, 8, 16, 32, 64]
    assert fit_line(x, [0.5 + 0.25 * v for v in x]) == pytest.approx((0.5, 0.25))
    assert fit_line(x, [0.5 + 0.25 * v for v in x], relative=True) == pytest.approx((0.5, 0.25))
    y = [1.0 + 0.1 * v for v in x[:-1]] + [20.0]               # one slow outlier at the largest batch
    assert abs(fit_line(x, y, relative=True)[0] - 1.0) < abs(fit_line(x, y)[0] - 1.0)
    with pytest.raises(ValueError, match="fit_line"):
        fit_line([1, 2], [1.0])


def test_the_model_reproduces_the_measured_toy_step():
    """Inputs measured apart (decode sweep, sync benchmark, the run's own pass times) add up to the
    run's measured step within 10 %."""
    a = step_time(toy_setting(), cpu_toy("in_process"), "one")
    assert a.total_s == pytest.approx(TOY["step_s"], rel=0.10)
    assert a.rollout_s == pytest.approx(TOY["engine_generate_s"], rel=0.25)


def test_cpu_decode_inputs_show_the_two_regimes():
    """The toy (compact vocabulary) is latency-bound, the 100m shape (151,936-row head) is not."""
    toy, big = CPU_DECODE[("toy", "in_process")], CPU_DECODE[("100m", "in_process")]
    assert decode_step_s(toy, 64, 100) < 3 * decode_step_s(toy, 1, 100)
    assert decode_step_s(big, 64, 100) > 10 * decode_step_s(big, 1, 100)


def test_docs_tables_are_the_models():
    path = os.path.join(ROOT, "docs", "scaling.md")
    with open(path) as f:
        text = f.read()
    generated = sections()
    assert sorted(doc_blocks(text)) == sorted(generated)
    assert render_doc(text, generated) == text, "run: python benchmarks/scaling.py --update-doc docs/scaling.md"


def test_cli_prints_the_tables_and_plots(tmp_path):
    env = {**standalone_environ(), "PYTHONPATH": os.path.abspath(ROOT), "MPLBACKEND": "Agg"}
    png = tmp_path / "nodes.png"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "scaling.py"), "--plot", str(png)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "## paper" in proc.stdout and "(c) overlap" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ids_broadcast_benchmark_round_trips_the_ids(tmp_path):
    env = {**standalone_environ(), "PYTHONPATH": os.path.abspath(ROOT), "OMP_NUM_THREADS": "1"}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "ids_broadcast.py"), "--shapes", "4x16",
                           "8x64", "--repeats", "1", "--port", str(port), "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "ids_broadcast.json").read_text())
    assert [row["ids"] for row in r["rows"]] == [64, 512]
    assert all(2 <= row["pickled_bytes"] / row["ids"] <= 6 for row in r["rows"])   # small ints pickle to ~4 bytes


@pytest.mark.vllm
@pytest.mark.slow
def test_decode_benchmark_runs_on_vllm_cpu(tmp_path):
    pytest.importorskip("vllm")
    env = {**standalone_environ(), "PYTHONPATH": os.path.abspath(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "rollout_decode.py"), "--sizes", "toy",
                           "--batches", "1", "4", "--decode-tokens", "4", "--repeats", "1", "--prefill-lens", "8", "32",
                           "--context-len", "40", "--context-batch", "4", "--prompt-len", "8", "--kv-cache-mb", "16",
                           "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads((tmp_path / "rollout_decode.json").read_text())["rows"][0]
    assert [d["batch"] for d in row["decode"]] == [1, 4] and row["vocab"] == 512
    # a step is a difference of two timings (clamped at 0): on a loaded machine it may come out 0
    assert all(d["step_s"] >= 0 and d["first_token_s"] > 0 for d in row["decode"])
    assert math.isfinite(row["decode_fit"]["fixed_s"]) and math.isfinite(row["prefill_fit"]["per_request_s"])
