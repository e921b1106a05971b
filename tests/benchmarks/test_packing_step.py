"""benchmarks/packing_step.py on a small subset of the real mix (lengths / 16, the tiny shape): every variant
runs the real PHF step, the step's global loss does not depend on the layout, packing computes only the
useful tokens."""

from benchmarks.packing_step import VARIANTS, main


def test_every_variant_gives_the_same_step_loss_and_packing_computes_the_useful_tokens(tmp_path):
    out = main(["--rows", "32", "--steps", "1", "--shape", "tiny", "--scale", "16", "--warmup", "0",
                "--out", str(tmp_path / "step.json")])
    (step,) = out["steps"]
    got = step["variants"]
    assert set(got) == set(VARIANTS) and (tmp_path / "step.json").exists()
    for name, v in got.items():
        assert v["loss_rel_diff"] < 1e-5 and v["loss_flow"] > 0 and v["slowest_rank_s"] > 0, name
        assert v["sum_ranks_s"] >= v["slowest_rank_s"]
    assert got["packed"]["tokens"] == got["packed+budget"]["tokens"] < got["padded"]["tokens"]
    assert got["packed"]["microbatches"] == got["padded"]["microbatches"] == 8  # DP 8 x one micro-batch of 4
    assert out["summary"]["padded"]["speedup_slowest"] == 1.0
