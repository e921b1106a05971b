"""The evaluator's progress bar (phf_megatron/eval/progress.py)."""

from __future__ import annotations

import json

from phf_megatron.eval.progress import SampleProgress, ShardProgress
from phf_megatron.eval.records import SampleWriter, shard_path


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
