"""The metrics writer: JSONL lines flushed per step, resume truncation, TensorBoard, rank 0 only."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from phf_megatron.errors import InputFileError
from phf_megatron.training.metrics import METRICS_FILE, MetricsLogger, read_jsonl, to_json_value, truncate_jsonl


def _log_steps(run_dir, steps, start_step=0, **kwargs):
    with MetricsLogger(str(run_dir), total_steps=10, start_step=start_step, progress_bar=False, **kwargs) as m:
        for step in steps:
            m.log(step, {"loss": 1.0 / step, "lr": 5e-6, "flow_energy": torch.tensor([0.5, 0.25])})


def test_one_flushed_line_per_step(tmp_path):
    m = MetricsLogger(str(tmp_path), total_steps=3, progress_bar=False)
    m.log(1, {"loss": torch.tensor(0.5), "grad_norm": np.float32(2.0), "flow_energy": [0.1, 0.2], "note": "x"})
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()  # readable before close: flushed
    assert json.loads(lines[0]) == {"step": 1, "loss": 0.5, "grad_norm": 2.0, "flow_energy": [0.1, 0.2], "note": "x"}
    m.log(2, {"loss": 0.25})
    m.close()
    assert [r["step"] for r in read_jsonl(str(tmp_path / METRICS_FILE))] == [1, 2]


def test_non_finite_values_become_null():
    assert to_json_value(float("nan")) is None and to_json_value([1.0, math.inf]) == [1.0, None]
    assert to_json_value(torch.tensor([1.5, float("-inf")])) == [1.5, None]


def test_resume_drops_steps_after_the_checkpoint(tmp_path):
    _log_steps(tmp_path, range(1, 6))
    with open(tmp_path / METRICS_FILE, "a") as f:
        f.write('{"step": 6, "loss": 0.1')  # a crash in the middle of a line
    _log_steps(tmp_path, range(4, 8), start_step=3)
    assert [r["step"] for r in read_jsonl(str(tmp_path / METRICS_FILE))] == [1, 2, 3, 4, 5, 6, 7]
    _log_steps(tmp_path, [1], start_step=0)  # a fresh run starts a fresh file
    assert [r["step"] for r in read_jsonl(str(tmp_path / METRICS_FILE))] == [1]


def test_corrupt_line_in_the_middle_is_an_error(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(InputFileError, match=r"metrics.jsonl:2: not a JSON line"):   # one line from plot_run
        read_jsonl(str(path))
    path.write_text('{"step": 1}\n[2]\n')
    with pytest.raises(InputFileError, match=r"metrics.jsonl:2: expected a JSON object, got list"):
        read_jsonl(str(path))
    assert truncate_jsonl(str(tmp_path / "absent.jsonl"), 3) == 0
    path.write_text('{"step": "one"}\n{"step": 2}\n')   # a resume truncates: int()'s ValueError traceback before
    with pytest.raises(InputFileError) as err:
        truncate_jsonl(str(path), 1)
    assert err.value.line == f"{path}: a record whose step is 'one', not a step number"


def test_a_loss_tokens_line_cut_inside_a_character_is_a_torn_line(tmp_path):
    """loss_tokens.jsonl is written with ensure_ascii=False: a crash mid-write could cut a token's
    multi-byte character, and the resume (and plot_run) stopped on a UnicodeDecodeError traceback."""
    from phf_megatron.training.metrics import LOSS_TOKENS_FILE

    tokens = [{"id": 1, "token": "≤π", "share": 0.5, "count": 2}]
    with MetricsLogger(str(tmp_path), total_steps=10, progress_bar=False) as m:
        for step in (1, 2, 3):
            m.log_loss_tokens(step, tokens)
    path = tmp_path / LOSS_TOKENS_FILE
    data = path.read_bytes()
    path.write_bytes(data[:data.rindex("≤".encode()) + 1])  # step 3's line, cut inside its first character
    assert [r["step"] for r in read_jsonl(str(path))] == [1, 2]
    with MetricsLogger(str(tmp_path), total_steps=10, start_step=2, progress_bar=False) as m:  # the resume
        m.log_loss_tokens(3, tokens)
    assert [(r["step"], r["tokens"]) for r in read_jsonl(str(path))] == [(s, tokens) for s in (1, 2, 3)]
    path.write_bytes(data.replace("≤".encode(), b"\xe2", 1))  # not UTF-8 in a whole line: named
    with pytest.raises(InputFileError, match=r"loss_tokens.jsonl:1: not UTF-8 text at byte \d+ of the line$"):
        read_jsonl(str(path))


def test_tensorboard_events_and_purge_on_resume(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb_dir = tmp_path / "tb"
    _log_steps(tmp_path, range(1, 5), tensorboard=True, tensorboard_dir=str(tb_dir))
    _log_steps(tmp_path, range(3, 5), start_step=2, tensorboard=True, tensorboard_dir=str(tb_dir))
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    assert {"loss", "lr", "flow_energy/00", "flow_energy/01"} <= set(acc.Tags()["scalars"])
    loss = {e.step: e.value for e in acc.Scalars("loss")}
    assert sorted(loss) == [1, 2, 3, 4] and loss[4] == pytest.approx(0.25)


def test_tensorboard_rerun_from_step_0_replaces_the_killed_runs_points(tmp_path):
    """Killed before its first checkpoint, a run starts again from step 0: metrics.jsonl starts afresh,
    and so does TensorBoard (was: no purge_step, steps 1-4 shown twice, the killed run's and the new)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb_dir = tmp_path / "tb"
    _log_steps(tmp_path, range(1, 5), tensorboard=True, tensorboard_dir=str(tb_dir))
    with MetricsLogger(str(tmp_path), total_steps=10, progress_bar=False, tensorboard=True,
                       tensorboard_dir=str(tb_dir)) as m:
        for step in (1, 2):
            m.log(step, {"loss": 10.0 * step})
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 10.0), (2, 20.0)]
    assert [r["step"] for r in read_jsonl(str(tmp_path / METRICS_FILE))] == [1, 2]


def test_only_rank_zero_writes(tmp_path):
    m = MetricsLogger(str(tmp_path / "r1"), total_steps=3, enabled=False, tensorboard=True)
    m.log(1, {"loss": 1.0})
    m.close()
    assert not (tmp_path / "r1").exists()


def test_progress_bar_tracks_step_and_loss(tmp_path, capsys):
    with MetricsLogger(str(tmp_path), total_steps=4, start_step=1, jsonl=False) as m:
        assert m._bar.n == 1
        m.log(3, {"loss": 0.125, "step_time": 2.5})
        assert m._bar.n == 3
        assert m._bar.postfix == "loss=0.125, step_time=2.5"


def test_the_full_bar_is_drawn_once(tmp_path, capsys):
    """The last step past tqdm's redraw interval: only end_progress draws 100% (in a log file, where \r
    overwrites nothing, the bar was there twice, the second time after the run's final message)."""
    import time

    with MetricsLogger(str(tmp_path), total_steps=2, jsonl=False) as m:
        m.log(1, {"loss": 0.5, "step_time": 1.0})
        time.sleep(1.1)   # past mininterval: tqdm's update would draw
        m.log(2, {"loss": 0.25, "step_time": 1.0})
        m.end_progress()
        print("finished")
    err = capsys.readouterr().err
    assert [line for line in err.replace("\r", "\n").splitlines() if "100%" in line] != []
    assert sum("100%" in line for line in err.replace("\r", "\n").splitlines()) == 1, err


def test_wandb_offline_gets_the_scalars_tensorboard_gets(tmp_path, monkeypatch):
    """W&B (offline: no network, nothing leaves the machine) mirrors TensorBoard: same keys, steps, values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from phf_megatron.training.metrics import WandbRun

    from .wandb_files import wandb_config, wandb_history, wandb_runs

    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # were it to try the network, it would fail
    run = WandbRun(project="phf-test", name="mirror", offline=True, save_dir=str(tmp_path / "wb"),
                   config={"optimizer": {"lr": 5e-6}})
    _log_steps(tmp_path, range(1, 4), tensorboard=True, tensorboard_dir=str(tmp_path / "tb"), wandb=run)
    [path] = wandb_runs(str(tmp_path / "wb"))
    history = wandb_history(path)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tensorboard = {}
    for tag in acc.Tags()["scalars"]:
        for event in acc.Scalars(tag):
            tensorboard.setdefault(event.step, {})[tag] = event.value
    assert sorted(history) == sorted(tensorboard) == [1, 2, 3]
    for step, row in tensorboard.items():
        assert history[step].keys() == row.keys()
        assert history[step] == pytest.approx(row, rel=1e-6)   # TensorBoard stores float32
    assert history[2] == {"loss": 0.5, "lr": 5e-6, "flow_energy/00": 0.5, "flow_energy/01": 0.25}
    assert wandb_config(path)["optimizer"] == {"lr": 5e-6}


def test_wandb_missing_package_names_the_setting(monkeypatch, tmp_path):
    import sys

    from phf_megatron.errors import ConfigError
    from phf_megatron.training.metrics import WandbRun

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ConfigError, match=r"logging.wandb: the wandb package is not installed"):
        MetricsLogger(str(tmp_path), total_steps=1, progress_bar=False, wandb=WandbRun("p", "n", offline=True))


class _FakeWandb:
    """The wandb module at its boundary: records ``init``'s arguments and the logged steps."""

    def __init__(self, next_step=0):
        self.inits, self.logged, self.next_step = [], [], next_step
        self.Settings = lambda **kw: kw

    def init(self, **kwargs):
        import types

        self.inits.append(kwargs)
        return types.SimpleNamespace(step=self.next_step, finish=lambda: None,
                                     log=lambda data, step: self.logged.append(step))


@pytest.mark.parametrize("next_step, jsonl", [(0, True), (6, False)], ids=["offline", "online-no-jsonl"])
def test_wandb_resume_continues_the_same_run_without_going_back(tmp_path, monkeypatch, next_step, jsonl):
    """Killed at step 5 after a checkpoint at 2: the resume opens the same W&B run (its id kept in the
    run directory, resume="allow"; was a second run) and logs from step 6 (W&B drops a step below its
    last: 3..5 keep the killed run's values, which the exact resume repeats). A fresh run gets a new id."""
    import sys

    from phf_megatron.training.metrics import WANDB_ID_FILE, WandbRun

    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run = WandbRun(project="p", name="n", offline=True, save_dir=str(tmp_path / "wb"))
    _log_steps(tmp_path, range(1, 6), wandb=run, jsonl=jsonl)
    fake.next_step = next_step  # online, a resumed W&B run says its next step; offline, metrics.jsonl does
    _log_steps(tmp_path, range(3, 8), start_step=2, wandb=run, jsonl=jsonl)
    _log_steps(tmp_path, [1], wandb=run, jsonl=jsonl)
    ids = [i["id"] for i in fake.inits]
    assert ids[0] == ids[1] != ids[2] and len(set(ids[0])) > 1 and [i["resume"] for i in fake.inits] == ["allow"] * 3
    assert fake.logged == [1, 2, 3, 4, 5, 6, 7, 1]
    assert (tmp_path / WANDB_ID_FILE).read_text() == ids[2] + "\n"


def test_wandb_first_used_on_a_resume_gets_every_step_it_logs(tmp_path, monkeypatch):
    """A run killed without W&B and resumed with it: a new W&B run, every step from the resume on."""
    import sys

    from phf_megatron.training.metrics import WandbRun

    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    _log_steps(tmp_path, range(1, 6))
    _log_steps(tmp_path, range(3, 8), start_step=2, wandb=WandbRun(project="p", name="n", offline=True,
                                                                   save_dir=str(tmp_path / "wb")))
    assert fake.logged == [3, 4, 5, 6, 7]


@pytest.mark.parametrize("kept, detail", [
    (b"\x9c\xf3\x00\x01", r"expected a W&B run id \(letters, digits, - and _\), found '\\ufffd\\ufffd\\x00\\x01'"),
    (b"\xff\xfe\n\x00\x01\n", r":1: not UTF-8 text at byte 0 of the line"),
    (b"3f2a 9c01\n", r"expected a W&B run id \(letters, digits, - and _\), found '3f2a 9c01'; fix it, or delete"),
])
def test_a_damaged_wandb_id_file_is_named(tmp_path, monkeypatch, kept, detail):
    """wandb_run_id.txt holding garbage bytes was a UnicodeDecodeError traceback on the resume: one line naming
    it, before metrics.jsonl is cut to the checkpoint's step (the refused resume leaves the run as it was)."""
    import sys

    from phf_megatron.training.metrics import WANDB_ID_FILE, WandbRun

    monkeypatch.setitem(sys.modules, "wandb", _FakeWandb())
    run = WandbRun(project="p", name="n", offline=True, save_dir=str(tmp_path / "wb"))
    _log_steps(tmp_path, range(1, 6), wandb=run)
    metrics = (tmp_path / METRICS_FILE).read_bytes()
    (tmp_path / WANDB_ID_FILE).write_bytes(kept)
    with pytest.raises(InputFileError) as err:
        _log_steps(tmp_path, range(3, 8), start_step=2, wandb=run)
    assert str(err.value).startswith(str(tmp_path / WANDB_ID_FILE)), err.value
    assert re.search(detail, str(err.value)) and "\n" not in str(err.value), err.value
    assert (tmp_path / METRICS_FILE).read_bytes() == metrics


def test_an_empty_wandb_id_file_is_no_id(tmp_path, monkeypatch):
    """An empty wandb_run_id.txt (a crash as it was written) is as none: the resume opens a new W&B run,
    its id kept, and logs every step from the resume on (as a run that first used W&B on its resume)."""
    import sys

    from phf_megatron.training.metrics import WANDB_ID_FILE, WandbRun

    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    _log_steps(tmp_path, range(1, 6))
    (tmp_path / WANDB_ID_FILE).write_bytes(b" \n")
    _log_steps(tmp_path, range(3, 8), start_step=2, wandb=WandbRun(project="p", name="n", offline=True,
                                                                   save_dir=str(tmp_path / "wb")))
    [init] = fake.inits
    assert fake.logged == [3, 4, 5, 6, 7] and len(init["id"]) == 16
    assert (tmp_path / WANDB_ID_FILE).read_text() == init["id"] + "\n"


def test_wandb_offline_resume_writes_the_same_run_id(tmp_path, monkeypatch):
    """The real package, offline: both parts of a resumed run carry one run id (``wandb sync`` puts them in
    one run), and the resumed part's history starts after the killed run's last step."""
    import time

    from phf_megatron.training.metrics import WandbRun

    from .wandb_files import wandb_history, wandb_run_id, wandb_runs

    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    run = WandbRun(project="phf-test", name="resumed", offline=True, save_dir=str(tmp_path / "wb"))
    _log_steps(tmp_path, range(1, 5), wandb=run)
    time.sleep(1.1)  # W&B names an offline run's directory by the second it started
    _log_steps(tmp_path, range(3, 7), start_step=2, wandb=run)
    first, second = wandb_runs(str(tmp_path / "wb"))
    assert wandb_run_id(first) == wandb_run_id(second)
    assert sorted(wandb_history(first)) == [1, 2, 3, 4] and sorted(wandb_history(second)) == [5, 6]
