"""benchmarks/sdpa_plans.py on CPU (``--tiny``): both measurements run, each over lengths no earlier call met (the
plan-build cost it looks for is a first meeting), our attention's backends (models/attention.py) recorded by name;
the per-sequence SDPA vs varlen comparison (a GPU's) skipped with its reason, and the GPU lease's summary shows it."""

import json

import pytest

from benchmarks import sdpa_plans
from benchmarks.sdpa_plans import main


def test_each_measurement_meets_only_new_lengths_and_the_json_is_written(tmp_path):
    out = main(["--tiny", "--lengths", "4", "--out", str(tmp_path / "sdpa.json")])
    all_backends, segment = out["runs"]
    assert all_backends["backends"] == "all"
    assert segment["backends"] == ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]   # no cuDNN (models/attention.py)
    first, second = set(all_backends["lengths"]), set(segment["lengths"])
    assert len(first) == len(second) == 4 and not first & second
    assert all(r["new_s"] > 0 and r["again_s"] > 0 for r in out["runs"])
    assert json.loads((tmp_path / "sdpa.json").read_text())["runs"][1]["lengths"] == segment["lengths"]


@pytest.mark.parametrize("lengths", ["0", "-3"])
def test_no_lengths_is_refused_in_one_line_naming_the_argument(lengths, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--tiny", "--lengths", lengths])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"--lengths: at least 1 (got {lengths}; each "
                                                                     "measurement times that many new lengths)")


def test_on_cpu_every_sequence_built_is_timed(monkeypatch):
    """The backend probe is a GPU question: on CPU only the timed calls build sequences (a warm-up, then the new
    lengths and the same again, per measurement)."""
    built, real = [], sdpa_plans.segment

    def counted(*args, grad=False):
        built.append(grad)
        return real(*args, grad=grad)

    monkeypatch.setattr(sdpa_plans, "segment", counted)
    main(["--tiny", "--lengths", "2"])
    assert built == [True] * 2 * (1 + 2 * 2)


def test_on_cpu_the_varlen_comparison_is_skipped_with_its_reason_and_summarized(tmp_path):
    from benchmarks.gpu.summarize_main_job import main as summarize

    out = main(["--tiny", "--lengths", "2", "--out", str(tmp_path / "sdpa_plans.json")])
    assert out["varlen"] == {"skipped": "a CPU run (--tiny or no GPU): varlen_attn is CUDA only"}
    (tmp_path / "stages.tsv").write_text("sdpa\t0\t6\n")
    assert summarize([str(tmp_path)]) == 0
    md = (tmp_path / "summary.md").read_text()
    assert "- packed attention, varlen: skipped (a CPU run (--tiny or no GPU): varlen_attn is CUDA only)" in md
    # a GPU's result (the numbers made up here): both per-layer times and their ratio
    gpu = json.loads((tmp_path / "sdpa_plans.json").read_text())
    gpu["varlen"] = dict(microbatches=[[701, 708]], repeats=5, sdpa_per_sequence_ms_per_layer=2.0,
                         varlen_ms_per_layer=0.5, sdpa_over_varlen=4.0)
    (tmp_path / "sdpa_plans.json").write_text(json.dumps(gpu))
    assert summarize([str(tmp_path)]) == 0
    assert ("- packed attention per layer and micro-batch, forward + backward: per-sequence SDPA 2.000 ms, varlen "
            "0.500 ms, ratio 4.00") in (tmp_path / "summary.md").read_text()
