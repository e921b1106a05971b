"""The evaluator's progress bar (phf_megatron/eval/progress.py)."""

from __future__ import annotations

import json

import pytest

from phf_megatron.eval import EvalConfig, run_eval
from phf_megatron.eval.progress import SampleProgress, ShardProgress, SharedTally
from phf_megatron.eval.records import SampleWriter, load_records, shard_path


def test_the_full_bar_is_drawn_once(capsys):
    """tqdm draws an update that comes past its ``mininterval``, and ``close()`` draws the bar again:
    the last update's 100% and close's were two lines in a log file, where ``\\r`` overwrites nothing."""
    bar = SampleProgress(4, desc="eval")
    bar._bar.mininterval = 0          # every update draws, as each one past the interval does
    bar.update(2, 10)
    bar.update(2, 10)
    bar.close()
    lines = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.strip()]
    assert [line.split("|")[0] for line in lines] == ["eval:   0%", "eval:  50%", "eval: 100%"]
    assert lines[-1].split("|")[2].startswith(" 4/4 ")


def test_the_parents_bar_reads_a_resumed_shard_whose_torn_line_its_worker_cut(tmp_path, capsys):
    """A data-parallel eval killed mid-write leaves a shard ending in a torn line; on the resume the parent's bar
    starts reading the shard at its size, then the worker cuts the torn line (``SampleWriter``) and appends: the
    parent read from inside the worker's first new record and failed on it (JSONDecodeError, the eval stopped)."""
    path = shard_path(str(tmp_path), 0)
    record = json.dumps({"benchmark": "b", "problem_id": "p", "sample_index": 0, "completion_tokens": 7}) + "\n"
    with open(path, "w") as f:
        f.write(record + record[:30])                  # one sample, then the kill
    watch = ShardProgress(str(tmp_path), total=3, ranks=[0], done=1)
    with SampleWriter(path) as writer:                 # the worker's start: the torn line cut, two samples written
        writer.write([json.loads(record)] * 2)
    watch.poll()
    watch.close()
    assert watch._bar.n == 3 and watch._tokens == 14, capsys.readouterr().err


def test_the_parents_bar_moves_with_what_its_workers_told_before_they_write(tmp_path):
    """With --data_parallel the parent read only the shards, written once per --batch_size call (8 GPUs, an AIME
    set at k=12: 45 samples a replica, one call each, the bar moved only at the end); it now also reads what each
    worker's engine told (``SharedTally``), and a sample told and then written counts once."""
    import multiprocessing as mp

    tally = mp.get_context("spawn").Array("q", 4)
    watch = ShardProgress(str(tmp_path), total=4, ranks=[0, 1], tally=tally)
    SharedTally(tally, 1).update(1, 5)
    watch.poll()
    assert (watch._bar.n, watch._tokens) == (1, 5)                      # told, not written yet
    SharedTally(tally, 1).update(1, 7)
    with SampleWriter(shard_path(str(tmp_path), 1)) as writer:           # both written
        writer.write([{"benchmark": "b", "problem_id": "p", "sample_index": i, "completion_tokens": t}
                      for i, t in enumerate((5, 7))])
    watch.poll()
    assert (watch._bar.n, watch._tokens) == (2, 12)
    with SampleWriter(shard_path(str(tmp_path), 0)) as writer:           # a shard ahead of its tally still counts
        writer.write([{"benchmark": "b", "problem_id": "q", "sample_index": 0, "completion_tokens": 3}])
    watch.poll()
    watch.close()
    assert (watch._bar.n, watch._tokens) == (3, 15)

@pytest.mark.vllm
def test_the_bar_moves_as_samples_finish_within_one_engine_call(tmp_path, tiny_dir, eval_sets, monkeypatch):
    """The bar moved once per engine call (``--batch_size`` samples: an AIME set at k=12 in one step after tens
    of minutes, no ETA meanwhile); now per finished sample, and it ends at the samples and tokens written."""
    pytest.importorskip("vllm")
    from phf_megatron.rollout.engine import RolloutEngine

    updates, engine_calls = [], []
    update, generate = SampleProgress.update, RolloutEngine.generate
    monkeypatch.setattr(SampleProgress, "update", lambda self, *a: (updates.append(a), update(self, *a)))
    monkeypatch.setattr(RolloutEngine, "generate", lambda self, *a, **kw: (engine_calls.append(1),
                                                                             generate(self, *a, **kw))[1])
    config = EvalConfig(out_dir=str(tmp_path / "run"), model=tiny_dir, benchmarks=("aime24",), data_dir=eval_sets,
                        n=2, limit=3, max_new_tokens=16, backend="vllm", dtype="float32", batch_size=512,
                        pass_ks=(1,))
    run_eval(config)
    records = list(load_records(config.out_dir)[0].values())
    assert len(engine_calls) == 1 and len(updates) > 1
    assert tuple(map(sum, zip(*updates))) == (len(records), sum(r["completion_tokens"] for r in records))
    assert len(records) == 6
