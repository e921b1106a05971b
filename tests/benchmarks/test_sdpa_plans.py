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
                         varlen_ms_per_layer=0.5, sdpa_over_varlen=4.0,
                         gqa_without_repeat=dict(lengths=[701], repeat_ms=0.3, native_ms=0.2, max_rel_diff=0.004))
    (tmp_path / "sdpa_plans.json").write_text(json.dumps(gpu))
    assert summarize([str(tmp_path)]) == 0
    md = (tmp_path / "summary.md").read_text()
    assert ("- packed attention per layer and micro-batch, forward + backward: per-sequence SDPA 2.000 ms, varlen "
            "0.500 ms, ratio 4.00\n- varlen on grouped K/V heads without the repeat: 0.200 ms against 0.300 ms "
            "repeated, largest relative difference 4.00e-03") in md
    gpu["varlen"]["gqa_without_repeat"] = dict(lengths=[701], repeat_ms=0.3, error="RuntimeError: heads differ")
    (tmp_path / "sdpa_plans.json").write_text(json.dumps(gpu))
    assert summarize([str(tmp_path)]) == 0
    assert "- varlen on grouped K/V heads without the repeat: RuntimeError: heads differ" in \
        (tmp_path / "summary.md").read_text()


def _per_sequence_varlen(native_gqa: bool):
    """A stand-in of torch 2.11's ``varlen_attn`` (its signature: no ``enable_gqa``) on CPU: causal SDPA per sequence,
    taking grouped key/value heads as they are (``native_gqa``) or refusing them as a kernel might."""
    import torch
    import torch.nn.functional as F

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1)):
        assert window_size == (-1, 0)
        if key.shape[1] != query.shape[1] and not native_gqa:
            raise RuntimeError("number of heads in key/value must equal the query's")
        bounds = cu_seq_q.tolist()
        return torch.cat([F.scaled_dot_product_attention(*(x[lo:hi].transpose(0, 1) for x in (query, key, value)),
                                                         is_causal=True, scale=scale, enable_gqa=True).transpose(0, 1)
                          for lo, hi in zip(bounds, bounds[1:])])
    return varlen_attn


@pytest.mark.parametrize("native_gqa", [True, False])
def test_gqa_without_repeat_on_a_torch_without_enable_gqa_finds_whether_the_kernel_takes_grouped_heads(
        monkeypatch, native_gqa):
    """torch 2.11 (the GPU image's) has no ``enable_gqa``: the model repeats each K/V head. The lease calls the
    kernel once without the repeat: equal output and gradients when it takes grouped heads, its error otherwise."""
    import inspect

    import torch

    from phf_megatron.models import varlen

    stand_in = _per_sequence_varlen(native_gqa)
    monkeypatch.setattr(varlen, "_varlen_attn", lambda: stand_in)
    monkeypatch.setattr(varlen, "varlen_parameters", lambda: frozenset(inspect.signature(stand_in).parameters))
    out = sdpa_plans.gqa_without_repeat([5, 1, 9], sdpa_plans.SHAPES["tiny"], "cpu", torch.bfloat16)
    assert out["lengths"] == [5, 1, 9] and out["repeat_ms"] > 0
    if native_gqa:
        assert out["native_ms"] > 0 and out["max_rel_diff"] < 0.02 and "error" not in out
    else:
        assert out["error"] == "RuntimeError: number of heads in key/value must equal the query's"


def test_gqa_without_repeat_is_skipped_where_torch_takes_enable_gqa():
    import torch

    from phf_megatron.models import varlen

    if varlen._varlen_attn() is None or "enable_gqa" not in varlen.varlen_parameters():
        pytest.skip(f"torch {torch.__version__}'s varlen_attn has no enable_gqa")
    assert sdpa_plans.gqa_without_repeat([5], sdpa_plans.SHAPES["tiny"], "cpu", torch.bfloat16) == {
        "skipped": "this torch's varlen_attn takes enable_gqa: the model repeats no heads"}


def test_a_part_that_raises_leaves_the_others_numbers_in_the_json_and_the_summary(tmp_path, monkeypatch):
    """On a GPU lease the varlen comparison (never run there yet) or one backend set may raise: the other parts'
    numbers are still written and summarized, the error said."""
    from benchmarks.gpu.summarize_main_job import main as summarize

    def broken(*args):
        raise RuntimeError("cuDNN Frontend error: no plan")

    monkeypatch.setattr(sdpa_plans, "compare_varlen", broken)
    real = sdpa_plans.measure
    monkeypatch.setattr(sdpa_plans, "measure", lambda backends, *a: broken() if backends is None else real(backends, *a))
    out = main(["--tiny", "--lengths", "2", "--out", str(tmp_path / "sdpa_plans.json")])
    assert out["runs"][0] == {"backends": "all", "error": "RuntimeError: cuDNN Frontend error: no plan"}
    assert out["runs"][1]["backends"] == ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]
    assert out["runs"][1]["again_s"] > 0
    assert out["varlen"] == {"error": "RuntimeError: cuDNN Frontend error: no plan"}
    assert json.loads((tmp_path / "sdpa_plans.json").read_text()) == json.loads(json.dumps(out))
    (tmp_path / "stages.tsv").write_text("sdpa\t0\t6\n")
    assert summarize([str(tmp_path)]) == 0
    md = (tmp_path / "summary.md").read_text()
    assert "- backends all: error (RuntimeError: cuDNN Frontend error: no plan)" in md
    assert "- packed attention, varlen: error (RuntimeError: cuDNN Frontend error: no plan)" in md
    assert "- backends ['FLASH_ATTENTION', 'EFFICIENT_ATTENTION', 'MATH']: new lengths" in md


def test_the_summary_lists_every_pytest_stage_and_its_failed_tests(tmp_path):
    """The gputests and vllmtests stages write pytest_gpu.xml / pytest_vllm.xml: the summary (what a lease call
    shows) counts each and names the failed tests."""
    from benchmarks.gpu.summarize_main_job import main as summarize

    (tmp_path / "stages.tsv").write_text("gputests\t1\t90\n")
    (tmp_path / "pytest_gpu.xml").write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="3" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.models.test_varlen" name="test_a"/>'
        '<testcase classname="tests.models.test_varlen" name="test_b"><failure message="x">x</failure></testcase>'
        '<testcase classname="tests.kernels.test_flow_cuda" name="test_c"><skipped message="s"/></testcase>'
        '</testsuite></testsuites>')
    assert summarize([str(tmp_path)]) == 0
    md = (tmp_path / "summary.md").read_text()
    assert "pytest_gpu.xml: 3 tests, 1 failures, 0 errors, 1 skipped\n- failed: tests.models.test_varlen::test_b" in md
