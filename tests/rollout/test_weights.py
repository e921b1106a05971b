"""WeightSpec and iter_buckets: validation naming the tensor, fused groups kept whole, bucket sizes."""

import pytest
import torch

from phf_megatron.rollout.errors import EngineStartError, WeightMismatchError
from phf_megatron.rollout.weights import QWEN3_PACKED_MODULES, WeightSpec, fused_groups, iter_buckets

from ..helpers.tiny_qwen3 import build_tiny_qwen3, save_tiny_qwen3


@pytest.fixture(scope="module")
def model():
    return build_tiny_qwen3()


@pytest.fixture(scope="module")
def spec(model):
    return WeightSpec.from_module(model)


def _bucket_names(buckets):
    return [[n for n, _ in b] for b in buckets]


def test_an_engine_on_a_directory_without_weights_fails_naming_engine_and_directory(tmp_path):
    with pytest.raises(EngineStartError, match=rf"^vLLM: cannot read the weights of '{tmp_path}': .*no \*\.safetensors"):
        WeightSpec.for_engine(str(tmp_path), "vLLM")


def test_spec_from_safetensors_headers_equals_spec_from_module(tmp_path):
    for tied in (False, True):
        d = tmp_path / f"tied{tied}"
        model = save_tiny_qwen3(str(d), tied=tied)
        from_dir, from_module = WeightSpec.from_hf_dir(str(d)), WeightSpec.from_module(model, tied=tied)
        assert from_dir.shapes == from_module.shapes
        assert from_dir.tied_aliases == from_module.tied_aliases == (
            {"lm_head.weight": "model.embed_tokens.weight"} if tied else {})
        assert from_dir.dtype == torch.float32


def test_stream_order_is_kept_and_every_tensor_lands_in_exactly_one_bucket(model, spec):
    sd = model.state_dict()
    buckets = list(iter_buckets(sd.items(), spec, bucket_bytes=1 << 16, packed=QWEN3_PACKED_MODULES))
    flat = [n for b in _bucket_names(buckets) for n in b]
    assert sorted(flat) == sorted(sd)
    # Only fused-group members may move (to the position of their group's last member).
    groups = fused_groups(spec.shapes, QWEN3_PACKED_MODULES)
    loose = [n for n in sd if n not in groups]
    assert [n for n in flat if n not in groups] == loose
    for b in buckets[:-1]:                      # each closed bucket reached the size, and not much more
        size = sum(t.numel() * t.element_size() for _, t in b)
        largest = max(t.numel() * t.element_size() for _, t in b) * 3
        assert 1 << 16 <= size < (1 << 16) + largest


def test_fused_group_is_released_whole_even_when_members_are_far_apart(model, spec):
    sd = model.state_dict()
    q, k, v = (f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv")
    order = [q] + [n for n in sd if n not in (q, k, v)] + [k, v]
    buckets = list(iter_buckets(((n, sd[n]) for n in order), spec, bucket_bytes=1, packed=QWEN3_PACKED_MODULES))
    names = _bucket_names(buckets)
    assert [q, k, v] in names                   # bucket_bytes=1: one bucket per tensor or group


def test_incomplete_fused_group_names_the_missing_members(model, spec):
    sd = model.state_dict()
    name = "model.layers.1.mlp.gate_proj.weight"
    with pytest.raises(WeightMismatchError, match=r"up_proj.weight.*were not pushed") as err:
        list(iter_buckets([(name, sd[name])], spec, bucket_bytes=1 << 30, packed=QWEN3_PACKED_MODULES))
    assert err.value.tensor_name == name


def test_unknown_name_wrong_shape_repeat_and_int_dtype_are_named(spec, model):
    sd = model.state_dict()
    good = "model.norm.weight"
    cases = [
        ([("model.layers.0.self_attn.q_proj.weigth", sd["model.layers.0.self_attn.q_proj.weight"])],
         "no such tensor.*did you mean 'model.layers.0.self_attn.q_proj.weight'"),
        ([(good, torch.zeros(63))], r"shape \(63,\) does not match the engine's \(64,\)"),
        ([(good, sd[good]), (good, sd[good])], "pushed twice"),
        ([(good, torch.zeros(64, dtype=torch.int32))], "not a floating type"),
    ]
    for stream, message in cases:
        with pytest.raises(WeightMismatchError, match=message) as err:
            list(iter_buckets(stream, spec, bucket_bytes=1 << 30))
        assert err.value.tensor_name == stream[-1][0]
        assert isinstance(err.value, ValueError)


def test_tied_alias_is_checked_and_dropped():
    model = build_tiny_qwen3(tied=True)
    spec = WeightSpec.from_module(model, tied=True)
    sd = model.state_dict()
    assert "lm_head.weight" in sd and "lm_head.weight" not in spec.shapes
    pushed = [n for b in iter_buckets(sd.items(), spec, bucket_bytes=1 << 30) for n, _ in b]
    assert "lm_head.weight" not in pushed and "model.embed_tokens.weight" in pushed
    with pytest.raises(WeightMismatchError, match="lm_head.weight: shape"):
        list(iter_buckets([("lm_head.weight", torch.zeros(3, 64))], spec, bucket_bytes=1))
