"""The GRPO trainer (``--method=grpo``) on two gloo ranks equals the single-process run, on the tiny
CPU preset with the HF engine.

One rollout batch of G = 2 completions of 2 prompts trains 2 optimizer steps (``grpo.num_iterations``
2) at: data parallel 2 with one engine (rank 0 samples for both ranks), data parallel 2 with two
engine groups (``rollout.num_engines=2``: each rank's engine samples its group's prompt, the rewards
are gathered), and TP = 2 with sequence parallelism. Every layout gives the single process's
rollouts (``rollout_digest``), rewards and advantage metrics (exactly: the same completions, the
same float64 arithmetic) and its loss and gradient norm at both steps (float32 trainer: rel 1e-5, and
abs 1e-7 for the loss: at a batch's first step the ratio is 1 and each group's advantages sum to 0, so
that loss is 0 up to float32 rounding; the second step's is not).
Every rank holds the whole step's rewards and advantages (``GrpoMethod.round``, recorded by
``grpo_ranks_run``) equal to the single process's, and its micro-batches carry its data-parallel
slice of them. The reward is ``test_grpo_trainer``'s deterministic function of the text, so the
advantages are not all 0 (asserted).
"""

import glob
import os

import pytest
import torch

from ..helpers import run_python
from ..helpers.tiny_run import assert_ok, read_metrics, train_command
from .grpo_ranks_run import RECORD_DIR
from .test_grpo_trainer import GRPO, REWARD_KEYS

pytestmark = pytest.mark.slow  # four trainer runs, three of them torchrun worlds of 2 ranks

# adam_eps well above |g|: Adam's first step is linear in the gradient (not lr * sign(g)), so step 2's
# loss cannot jump on a float32 rounding of a near-zero gradient element
COMMON = (*GRPO, "--training.train_iters=2", "--checkpoint.save_interval=0", "--optimizer.adam_eps=1e-4")
EXACT = ("rollout_digest", "num_tokens", *REWARD_KEYS, "grpo_advantage")
CLOSE = ("loss", "grad_norm")
LAYOUTS = {
    "dp2_one_engine": ("--rollout.num_engines=1",),
    "dp2_two_engines": ("--rollout.num_engines=2",),
    "tp2_sp": ("--model.tensor_model_parallel_size=2", "--model.sequence_parallel=true"),
}


def _run(tiny_inputs, root, nproc: int, *overrides) -> tuple[list[dict], list[dict], str]:
    """``(metrics, records, stdout)``: the run's metrics.jsonl, every rank's record of its one rollout
    batch, and what the run printed."""
    hf, data = tiny_inputs
    run_dir, record_dir = os.path.join(root, "run"), os.path.join(root, "records")
    os.makedirs(record_dir)
    argv, _ = train_command(hf, data, run_dir, *COMMON, *overrides, nproc=nproc)
    module = argv.index("phf_megatron.train")
    argv[module] = "tests.training.grpo_ranks_run"
    proc = run_python(argv[1:], timeout=900, **{RECORD_DIR: record_dir})
    assert_ok(proc)
    records = [torch.load(os.path.join(record_dir, f"rank{r}_round0.pt")) for r in range(nproc)]
    assert len(glob.glob(os.path.join(record_dir, "*.pt"))) == nproc  # one rollout batch for the 2 steps
    return read_metrics(run_dir), records, proc.stdout


@pytest.fixture(scope="module")
def single(tiny_inputs, tmp_path_factory):
    return _run(tiny_inputs, str(tmp_path_factory.mktemp("grpo_single")), 1)


def test_single_process_advantages_are_the_groups_normalized_rewards(single):
    from phf_megatron.objectives.grpo import group_advantages

    metrics, [record], _ = single
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[0]["rollout_digest"] == metrics[1]["rollout_digest"]
    torch.testing.assert_close(record["advantages"], group_advantages(record["rewards"], 2, "group"), rtol=0, atol=0)
    assert record["advantages"].abs().max() > 0  # rewards differ within a group: there is a gradient
    torch.testing.assert_close(record["local"], record["advantages"], rtol=0, atol=0)
    assert all(m["grad_norm"] > 0 for m in metrics)
    assert abs(metrics[0]["loss"]) < 1e-7 and abs(metrics[1]["loss"]) > 1e-4  # ratio 1, then the updated policy


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_two_ranks_equal_the_single_process(tiny_inputs, tmp_path, single, layout):
    want, [whole], _ = single
    got, records, out = _run(tiny_inputs, str(tmp_path), 2, *LAYOUTS[layout])
    if layout == "dp2_two_engines":  # each rank hosts its group's engine
        assert "2 engines (host ranks 0, 1;" in out, out[-2000:]
    assert [m["step"] for m in got] == [1, 2]
    for g, w in zip(got, want):
        for key in EXACT:
            assert g[key] == w[key], (layout, g["step"], key)
        for key in CLOSE:
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-7 if key == "loss" else 0), (layout, g["step"], key)
    dp_size = 1 if layout == "tp2_sp" else 2
    per = whole["advantages"].numel() // dp_size
    for rank, rec in enumerate(records):
        assert rec["dp_size"] == dp_size and rec["dp_rank"] == rank % dp_size
        torch.testing.assert_close(rec["rewards"], whole["rewards"], rtol=0, atol=0)
        torch.testing.assert_close(rec["advantages"], whole["advantages"], rtol=0, atol=0)
        lo = rec["dp_rank"] * per
        torch.testing.assert_close(rec["local"], whole["advantages"][lo: lo + per], rtol=0, atol=0)
