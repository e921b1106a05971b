"""benchmarks/packing_step.py on a small subset of the real mix (lengths / 16, the tiny shape): every variant
runs the real PHF step, the step's global loss does not depend on the layout, packing computes only the
useful tokens."""

import pytest

from benchmarks.packing_step import VARIANTS, main


def test_every_variant_gives_the_same_step_loss_and_packing_computes_the_useful_tokens(tmp_path):
    out = main(["--rows", "32", "--steps", "1", "--shape", "tiny", "--scale", "16", "--warmup", "0", "--again",
                "--out", str(tmp_path / "step.json")])
    (step,) = out["steps"]
    got = step["variants"]
    assert set(got) == set(VARIANTS) and (tmp_path / "step.json").exists()
    for name, v in got.items():
        assert v["loss_rel_diff"] < 1e-5 and v["loss_flow"] > 0 and v["slowest_rank_s"] > 0, name
        assert v["sum_ranks_s"] >= v["slowest_rank_s"]
        assert len(v["rank_s"]) == len(v["rank_shapes"]) == 8 and min(v["rank_s"]) > 0, name   # a time per DP rank
        assert sum(s[0] * s[1] + t[0] * t[1] for r in v["rank_shapes"] for s, t in r) == v["tokens"], name
        # --again: each rank's second run, timed apart from the first
        assert len(v["again_rank_s"]) == 8 and min(v["again_rank_s"]) > 0 and v["again_rank_s"] != v["rank_s"], name
        assert (v["again_slowest_rank_s"], v["again_sum_ranks_s"]) == (max(v["again_rank_s"]), sum(v["again_rank_s"]))
        assert out["summary"][name]["again_speedup_slowest"] == pytest.approx(
            got["padded"]["again_slowest_rank_s"] / v["again_slowest_rank_s"])
    assert out["attention_kernel"] == "flash kernel on CPU"   # PyTorch's choice for the tiny shape, float32
    assert got["packed"]["tokens"] == got["packed+budget"]["tokens"] < got["padded"]["tokens"]
    assert got["packed"]["microbatches"] == got["padded"]["microbatches"] == 8  # DP 8 x one micro-batch of 4
    assert out["summary"]["padded"]["speedup_slowest"] == 1.0
    # the GPU lease's summary reads the stage's JSON (benchmarks/gpu/summarize_main_job.py)
    from benchmarks.gpu.summarize_main_job import main as summarize

    (tmp_path / "step.json").rename(tmp_path / "packing_step.json")
    (tmp_path / "stages.tsv").write_text("packing\t0\t9\n")
    assert summarize([str(tmp_path)]) == 0
    md = (tmp_path / "summary.md").read_text()
    assert "| packing | 0 | 9 |" in md
    assert "## PHF step padded / packed / packed + budget on the real mix (cpu; attention flash kernel on CPU)" in md
    packed = out["summary"]["packed"]
    assert (f"| packed | {packed['slowest_rank_s']:.3f} | {packed['speedup_slowest']:.2f}x | "
            f"{packed['again_slowest_rank_s']:.3f} | {packed['again_speedup_slowest']:.2f}x |") in md and "| None |" in md


def test_lengths_from_a_mix_file_give_the_same_step_as_tokenizing_here(tmp_path):
    """``--mix`` (the GPU lease's way: the image has no tokenizer before the bundle) reads the lengths
    ``benchmarks.packing --out`` wrote: the same micro-batches and tokens as tokenizing in place."""
    from benchmarks import packing

    args = ["--rows", "32", "--steps", "1", "--shape", "tiny", "--scale", "16", "--warmup", "0"]
    packing.main(["--configs", packing.PRESETS[0], "--rows", "32", "--steps", "2", "--out", str(tmp_path / "mix.json")])
    here, from_file = main(args), main(args + ["--mix", str(tmp_path / "mix.json")])
    assert len(from_file["steps"]) == 1   # --steps still bounds a longer file
    for v in VARIANTS:
        a, b = here["steps"][0]["variants"][v], from_file["steps"][0]["variants"][v]
        assert (a["tokens"], a["microbatches"]) == (b["tokens"], b["microbatches"]), v


def test_a_bad_mix_file_is_one_line_naming_it(tmp_path):
    for name, text in (("missing.json", None), ("empty.json", "{}"), ("bad.json", "not json")):
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(SystemExit) as err:
            main(["--mix", str(path), "--shape", "tiny", "--steps", "1"])
        line = str(err.value)
        assert line.startswith(f"error: --mix: {path}: not a length mix") and "\n" not in line, line
