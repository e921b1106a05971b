"""The pure HF <-> Megatron mapping and TP/PP sharding functions (no process group)."""

import pytest
import torch

from phf_megatron.models.qwen3_arch import Qwen3Arch
from phf_megatron.convert.qwen3_mapping import (canonical_name, hf_shapes, hf_sources, hf_to_mcore,
                                                iter_mcore_from_hf, mcore_names, mcore_to_hf, spec_name)
from phf_megatron.convert.sharding import pp_layer_range, stage_holds, tp_merge, tp_shard

from ..helpers.tiny_qwen3 import tiny_config


def _arch(name="gqa", **extra):
    return Qwen3Arch.from_hf(tiny_config(name, **extra))


def _random_hf(arch):
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(s, generator=g) for n, s in hf_shapes(arch).items()}


@pytest.mark.parametrize("name", ["gqa", "tied"])
def test_hf_to_mcore_to_hf_is_exact_and_complete(name):
    arch = _arch(name)
    hf = _random_hf(arch)
    back = {}
    for mname, tensor in iter_mcore_from_hf(hf.__getitem__, arch):
        for hname, t in mcore_to_hf(mname, tensor, arch):
            assert hname not in back
            back[hname] = t
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[k], hf[k]) for k in hf)


def test_qkv_is_interleaved_per_query_group():
    arch = _arch("gqa", num_attention_heads=6, num_key_value_heads=2)  # 3 query heads per group
    d, h = arch.head_dim, arch.hidden_size
    # Row r of head j of projection p holds the value 1000·p + 100·j + r.
    q = torch.cat([torch.full((d, h), 100.0 * j) for j in range(6)]) + torch.arange(d).repeat(6)[:, None]
    k = torch.cat([torch.full((d, h), 1000 + 100.0 * j) for j in range(2)]) + torch.arange(d).repeat(2)[:, None]
    v = k + 1000
    fused = hf_to_mcore("decoder.layers.0.self_attention.linear_qkv.weight", [q, k, v], arch)
    blocks = fused.reshape(2, 5, d, h)  # [group, (3 q heads, k, v), d, H]
    for group in range(2):
        heads = [q[(3 * group + i) * d:(3 * group + i + 1) * d] for i in range(3)]
        expected = heads + [k[group * d:(group + 1) * d], v[group * d:(group + 1) * d]]
        for slot, want in enumerate(expected):
            assert torch.equal(blocks[group, slot], want)


def test_fc1_is_gate_then_up():
    arch = _arch()
    gate, up = torch.randn(96, 64), torch.randn(96, 64)
    fc1 = hf_to_mcore("decoder.layers.2.mlp.linear_fc1.weight", [gate, up], arch)
    assert torch.equal(fc1[:96], gate) and torch.equal(fc1[96:], up)


def test_te_and_local_norm_names_map_to_the_same_hf_tensor():
    arch = _arch()
    te = "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight"
    assert canonical_name(te) == "decoder.layers.1.input_layernorm.weight"
    assert hf_sources(te, arch) == ("model.layers.1.input_layernorm.weight",)
    assert hf_sources("decoder.layers.1.mlp.linear_fc1.layer_norm_weight", arch) == (
        "model.layers.1.post_attention_layernorm.weight",)
    assert spec_name("decoder.layers.1.pre_mlp_layernorm.weight", "te") == "decoder.layers.1.mlp.linear_fc1.layer_norm_weight"


def test_tied_model_has_no_output_layer_and_head_maps_to_embedding():
    tied, untied = _arch("tied"), _arch("gqa")
    assert "output_layer.weight" not in mcore_names(tied) and "lm_head.weight" not in hf_shapes(tied)
    assert hf_sources("output_layer.weight", tied) == ("model.embed_tokens.weight",)
    assert mcore_to_hf("output_layer.weight", torch.zeros(256, 64), tied) == []
    assert "output_layer.weight" in mcore_names(untied)


@pytest.mark.parametrize("tp", [1, 2])
def test_tp_shard_then_merge_is_identity_and_glu_shards_pair_gate_with_up(tp):
    arch = _arch()
    hf = _random_hf(arch)
    for mname, full in iter_mcore_from_hf(hf.__getitem__, arch):
        shards = [tp_shard(mname, full, tp, r) for r in range(tp)]
        assert torch.equal(tp_merge(mname, shards), full), mname
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    fc1 = torch.cat([gate, up])
    shard1 = tp_shard("decoder.layers.0.mlp.linear_fc1.weight", fc1, 2, 1)
    assert torch.equal(shard1, torch.cat([gate[48:], up[48:]]))


def test_pp_ranges_cover_every_layer_once():
    assert [list(pp_layer_range(4, 2, s)) for s in range(2)] == [[0, 1], [2, 3]]
    assert stage_holds("embedding.word_embeddings.weight", 4, 2, 0, tied=True)
    assert stage_holds("output_layer.weight", 4, 2, 1, tied=True)  # tied copy on the last stage
    assert not stage_holds("output_layer.weight", 4, 1, 0, tied=True)
    with pytest.raises(ValueError, match="pp"):
        pp_layer_range(4, 3, 0)


def test_rope_theta_from_either_config_generation():
    raw = tiny_config("gqa").to_dict()
    raw.pop("rope_parameters", None)
    raw["rope_theta"] = 5e5
    assert Qwen3Arch.from_hf(raw).rope_theta == 5e5
    assert _arch().rope_theta == 1e4
