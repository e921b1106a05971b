"""Checkpoint conversions: HF -> Megatron dist checkpoint -> HF, and resharding on load.

* the command-line tools round-trip a HF checkpoint bit-exactly (fp32 GQA model), and the
  result loads in transformers with the source tokenizer; so do the library conversions
  launched on 2 ranks (bf16 tied model, saved from TP=2, exported from PP=2) and on 4 ranks
  (bf16 untied, saved and exported at TP=2 x PP=2);
* a dist checkpoint written from TP=2 loads at TP=1 and at PP=2, and the tools' unsharded
  checkpoint loads at TP=2 with SP and at PP=2, all with HF's logits (fp32, <= 1e-4).
"""

import glob
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from ..helpers import REPO, run_python
from ..helpers.forward import megatron_logits
from ..helpers.spawn import megatron_layout, run_ranks
from ..helpers.tiny_qwen3 import hf_logits, save_tiny_hf, tiny_hf_model

TOL = 1e-4


def _tool(name, *args):
    proc = run_python([os.path.join(REPO, "tools", "convert", name), *args], CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 0, proc.stderr[-3000:]


def _safetensors(path):
    out = {}
    for f in glob.glob(os.path.join(path, "*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    """The fp32 GQA model, its HF dir, and its dist checkpoint written by the CLI."""
    root = tmp_path_factory.mktemp("gqa")
    model = tiny_hf_model("gqa")
    hf_dir = save_tiny_hf(model, str(root / "hf"))
    _tool("hf_to_mcore.py", "--hf-dir", hf_dir, "--out-dir", str(root / "mcore"), "--tp", "2", "--pp", "2")
    return model, hf_dir, str(root / "mcore")


def test_cli_round_trip_is_bit_exact_and_loads_in_transformers(gqa, tmp_path):
    model, hf_dir, mcore_dir = gqa
    out = str(tmp_path / "hf_back")
    _tool("mcore_to_hf.py", "--mcore-dir", mcore_dir, "--out-dir", out)
    src, back = _safetensors(hf_dir), _safetensors(out)
    assert src.keys() == back.keys()
    assert all(torch.equal(src[k], back[k]) for k in src)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        with open(os.path.join(hf_dir, f), "rb") as a, open(os.path.join(out, f), "rb") as b:
            assert a.read() == b.read(), f
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, 256, (2, 9))
    assert torch.equal(hf_logits(reloaded, ids), hf_logits(model, ids))
    assert AutoTokenizer.from_pretrained(out)("Hello world")["input_ids"] == [9707, 1879]


def _sharded_round_trip(rank, world_size, hf_dir, mcore_dir, out_dir):
    from phf_megatron.convert.checkpoints import convert_hf_to_mcore, convert_mcore_to_hf

    convert_hf_to_mcore(hf_dir, mcore_dir, tp=2, progress=False)  # saved from a TP=2 model
    convert_mcore_to_hf(mcore_dir, out_dir, pp=2, progress=False)  # loaded at PP=2, gathered


def test_bf16_tied_round_trip_through_sharded_launches_is_bit_exact(tmp_path):
    """The library conversions as a 2-rank launch (torchrun-style): save at TP=2, export at PP=2."""
    hf_dir = save_tiny_hf(tiny_hf_model("tied", dtype=torch.bfloat16), str(tmp_path / "hf"))
    out = str(tmp_path / "back")
    run_ranks(_sharded_round_trip, 2, hf_dir, str(tmp_path / "mcore"), out)
    with open(os.path.join(tmp_path, "mcore", "phf_megatron.json")) as f:
        assert json.load(f)["saved_layout"] == {"tp": 2, "pp": 1}
    src, back = _safetensors(hf_dir), _safetensors(out)
    assert src.keys() == back.keys() and "lm_head.weight" not in back
    assert all(back[k].dtype == torch.bfloat16 and torch.equal(src[k], back[k]) for k in src)


def _tp2_pp2_round_trip(rank, world_size, hf_dir, mcore_dir, out_dir):
    from phf_megatron.convert.checkpoints import convert_hf_to_mcore, convert_mcore_to_hf

    convert_hf_to_mcore(hf_dir, mcore_dir, tp=2, pp=2, progress=False)
    convert_mcore_to_hf(mcore_dir, out_dir, tp=2, pp=2, progress=False)  # gathers TP shards, then PP stages


def test_round_trip_launched_at_tp2_pp2_is_bit_exact(tmp_path):
    """Both conversions as 4-rank launches (``torchrun --nproc-per-node 4 ... --tp 2 --pp 2``), on a
    Qwen3-4B-like attention (4 query heads per KV head, head_dim 16 != hidden/heads = 5), bf16, untied.
    The export gathered nothing over TP before (the converters' model, built without initialization,
    lacks Megatron's ``tensor_model_parallel`` marks) and failed on the first q/k/v shard."""
    model = tiny_hf_model("gqa", dtype=torch.bfloat16, hidden_size=40, num_attention_heads=8, head_dim=16)
    hf_dir = save_tiny_hf(model, str(tmp_path / "hf"))
    out = str(tmp_path / "back")
    run_ranks(_tp2_pp2_round_trip, 4, hf_dir, str(tmp_path / "mcore"), out)
    src, back = _safetensors(hf_dir), _safetensors(out)
    assert src.keys() == back.keys() and "lm_head.weight" in back
    assert all(back[k].dtype == torch.bfloat16 and torch.equal(src[k], back[k]) for k in src)


def _reshard(rank, world_size, hf_dir, cli_ckpt, tp2_ckpt):
    from phf_megatron.convert.hf_checkpoint import HFCheckpoint
    from phf_megatron.convert.live_model import load_hf_weights
    from phf_megatron.convert.mcore_checkpoint import load_checkpoint, save_checkpoint
    from phf_megatron.models import build_qwen3_model

    source = HFCheckpoint(hf_dir)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))
    logits = {}

    def run(tag, tp, pp, sp, ckpt=None, save_to=None):
        megatron_layout(tp, pp)
        model = build_qwen3_model(source.arch, sp=sp, dtype=torch.float32)
        if ckpt is None:
            load_hf_weights(model, source.get, source.arch)
        else:
            load_checkpoint(model, ckpt)
        if save_to:
            save_checkpoint(model, save_to)
        out = megatron_logits(model, ids)
        if out is not None:
            logits[tag] = out

    run("written_at_tp2", 2, 1, True, save_to=tp2_ckpt)
    run("tp2_ckpt_at_tp1", 1, 1, False, ckpt=tp2_ckpt)
    run("tp2_ckpt_at_pp2", 1, 2, False, ckpt=tp2_ckpt)
    run("cli_ckpt_at_tp2_sp", 2, 1, True, ckpt=cli_ckpt)
    run("cli_ckpt_at_pp2", 1, 2, False, ckpt=cli_ckpt)
    return logits, ids


def test_checkpoints_load_under_other_layouts(gqa, tmp_path):
    model, hf_dir, cli_ckpt = gqa
    results = run_ranks(_reshard, 2, hf_dir, cli_ckpt, str(tmp_path / "tp2"))
    ids = results[0][1]
    ref = hf_logits(model, ids)
    seen = {}
    for logits, _ in results:
        seen.update(logits)
    assert set(seen) == {"written_at_tp2", "tp2_ckpt_at_tp1", "tp2_ckpt_at_pp2", "cli_ckpt_at_tp2_sp", "cli_ckpt_at_pp2"}
    bad = {k: (v - ref).abs().max().item() for k, v in seen.items() if not (v - ref).abs().max() <= TOL}
    assert not bad, bad
