"""Tensor-parallel LoRA layers equal a dense single-process computation (float64)."""

import torch

from phf_megatron.lora.layers import qkv_layout

from ..helpers.spawn import megatron_layout, run_ranks

HID, HEADS, GROUPS, D, RANK, ALPHA, S, B = 16, 4, 2, 4, 3, 6.0, 4, 2


def _megatron_qkv_weight(wq, wk, wv, groups):
    """Megatron's fused layout, built row by row: per group [its q heads, its k head, its v head]."""
    hpg = wq.shape[0] // wk.shape[0]
    rows = []
    for g in range(groups):
        d = wk.shape[0] // groups
        rows += [wq[g * hpg * d:(g + 1) * hpg * d], wk[g * d:(g + 1) * d], wv[g * d:(g + 1) * d]]
    return torch.cat(rows)


def test_qkv_layout_matches_megatron_fused_weight():
    g = torch.Generator().manual_seed(0)
    wq, wk, wv = (torch.randn(n, HID, generator=g, dtype=torch.float64) for n in (HEADS * D, GROUPS * D, GROUPS * D))
    x = torch.randn(3, 2, HID, generator=g, dtype=torch.float64)
    fused = x @ _megatron_qkv_weight(wq, wk, wv, GROUPS).T
    torch.testing.assert_close(qkv_layout(GROUPS)([x @ wq.T, x @ wk.T, x @ wv.T]), fused)


def _check_layers(rank, world_size):
    megatron_layout(2, 1)
    for sp in (False, True):
        _check_layers_sp(sp)


def _check_layers_sp(sp):
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.transformer_config import TransformerConfig

    from phf_megatron.lora.layers import LoRAColumnParallelLinear, LoRARowParallelLinear, Segment, qkv_layout

    tp = parallel_state.get_tensor_model_parallel_world_size()
    k = parallel_state.get_tensor_model_parallel_rank()
    cfg = TransformerConfig(num_layers=1, hidden_size=HID, num_attention_heads=HEADS, num_query_groups=GROUPS,
                            kv_channels=D, tensor_model_parallel_size=tp, sequence_parallel=sp,
                            use_cpu_initialization=True, params_dtype=torch.float64, add_bias_linear=False)
    g = torch.Generator().manual_seed(7)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)
    wq, wk, wv = rnd(HEADS * D, HID), rnd(GROUPS * D, HID), rnd(GROUPS * D, HID)
    a = {n: rnd(RANK, HID) for n in ("q_proj", "k_proj", "v_proj")}
    b = {n: rnd(w.shape[0], RANK) for n, w in (("q_proj", wq), ("k_proj", wk), ("v_proj", wv))}
    w_o, a_o, b_o = rnd(HID, HEADS * D), rnd(RANK, HEADS * D), rnd(HID, RANK)
    x_full, r_qkv, r_o = rnd(S, B, HID), rnd(S, B, (HEADS + 2 * GROUPS) * D), rnd(S, B, HID)
    scale = ALPHA / RANK

    # ---- dense reference (one process, full tensors, HF-style separate projections)
    xr, ar, br = x_full.clone().requires_grad_(), {n: t.clone().requires_grad_() for n, t in a.items()}, \
        {n: t.clone().requires_grad_() for n, t in b.items()}
    parts = [xr @ w.T + scale * (xr @ ar[n].T) @ br[n].T for n, w in (("q_proj", wq), ("k_proj", wk), ("v_proj", wv))]
    qkv_ref = qkv_layout(GROUPS)(parts)
    (qkv_ref * r_qkv).sum().backward()
    xo = torch.randn(S, B, HEADS * D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    xor, aor, bor = xo.clone().requires_grad_(), a_o.clone().requires_grad_(), b_o.clone().requires_grad_()
    o_ref = xor @ w_o.T + scale * (xor @ aor.T) @ bor.T
    (o_ref * r_o).sum().backward()

    # ---- sharded: rank k owns query groups [k*G/tp, (k+1)*G/tp) of qkv and the same input slice of o
    gl, hl = GROUPS // tp, HEADS // tp
    col = ColumnParallelLinear(HID, (HEADS + 2 * GROUPS) * D, config=cfg, init_method=torch.nn.init.zeros_,
                               bias=False, gather_output=False)
    per_rank = (HEADS + 2 * GROUPS) * D // tp
    col.weight.data.copy_(_megatron_qkv_weight(wq, wk, wv, GROUPS)[k * per_rank:(k + 1) * per_rank])
    segs = [Segment("q_proj", hl * D), Segment("k_proj", gl * D), Segment("v_proj", gl * D)]
    lcol = LoRAColumnParallelLinear(col, segs, qkv_layout(gl), ("q_proj", "k_proj", "v_proj"), RANK, ALPHA, 0.0)
    rows = {"q_proj": slice(k * hl * D, (k + 1) * hl * D), "k_proj": slice(k * gl * D, (k + 1) * gl * D),
            "v_proj": slice(k * gl * D, (k + 1) * gl * D)}
    for n, ad in lcol.adapters.items():
        ad.lora_A.data.copy_(a[n])
        ad.lora_B.data.copy_(b[n][rows[n]])
    seq = slice(k * S // tp, (k + 1) * S // tp) if sp else slice(None)
    x_local = x_full[seq].clone().requires_grad_()
    out, _ = lcol(x_local)
    (out * r_qkv[:, :, k * per_rank:(k + 1) * per_rank]).sum().backward()
    torch.testing.assert_close(out, qkv_ref[:, :, k * per_rank:(k + 1) * per_rank].detach())
    torch.testing.assert_close(x_local.grad, xr.grad[seq])
    for n, ad in lcol.adapters.items():
        torch.testing.assert_close(ad.lora_A.grad, ar[n].grad)  # replicated: the full gradient on every rank
        torch.testing.assert_close(ad.lora_B.grad, br[n].grad[rows[n]])
    assert col.weight.grad is None  # the base stays frozen

    row = RowParallelLinear(HEADS * D, HID, config=cfg, init_method=torch.nn.init.zeros_, bias=False,
                            input_is_parallel=True, skip_bias_add=True)
    cols = slice(k * HEADS * D // tp, (k + 1) * HEADS * D // tp)
    row.weight.data.copy_(w_o[:, cols])
    lrow = LoRARowParallelLinear(row, "o_proj", RANK, ALPHA, 0.0)
    lrow.adapters["o_proj"].lora_A.data.copy_(a_o[:, cols])
    lrow.adapters["o_proj"].lora_B.data.copy_(b_o)
    xo_local = xo[:, :, cols].clone().requires_grad_()
    out_o, _ = lrow(xo_local)
    (out_o * r_o[seq]).sum().backward()
    torch.testing.assert_close(out_o, o_ref[seq].detach())
    torch.testing.assert_close(xo_local.grad, xor.grad[:, :, cols])
    torch.testing.assert_close(lrow.adapters["o_proj"].lora_A.grad, aor.grad[:, cols])
    torch.testing.assert_close(lrow.adapters["o_proj"].lora_B.grad, bor.grad)


def test_tensor_parallel_lora_equals_dense_with_and_without_sp():
    run_ranks(_check_layers, 2)


def _check_dropout_per_projection(rank, world_size):
    megatron_layout(1, 1)
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer.transformer_config import TransformerConfig

    from phf_megatron.lora.layers import LoRAColumnParallelLinear, Segment, concat_layout

    cfg = TransformerConfig(num_layers=1, hidden_size=HID, num_attention_heads=HEADS, use_cpu_initialization=True,
                            params_dtype=torch.float64, add_bias_linear=False)
    col = ColumnParallelLinear(HID, 3 * HID, config=cfg, init_method=torch.nn.init.zeros_, bias=False,
                               gather_output=False)
    names = ("q_proj", "k_proj", "v_proj")
    lcol = LoRAColumnParallelLinear(col, [Segment(n, HID) for n in names], concat_layout, names, HID, HID, 0.5)
    for ad in lcol.adapters.values():  # B A = I: each projection's LoRA output is its dropped input
        ad.lora_A.data.copy_(torch.eye(HID, dtype=torch.float64))
        ad.lora_B.data.copy_(torch.eye(HID, dtype=torch.float64))
    torch.manual_seed(0)
    out, _ = lcol(torch.ones(S, B, HID, dtype=torch.float64))
    kept = [part != 0 for part in out.split(HID, dim=-1)]   # dropout(1) is 0 or 1 / (1 - p)
    assert all(0 < int(m.sum()) < m.numel() for m in kept)
    assert all(not torch.equal(kept[i], kept[j]) for i, j in ((0, 1), (1, 2), (0, 2)))
    lcol.eval()
    ones = torch.ones(S, B, 3 * HID, dtype=torch.float64)
    torch.testing.assert_close(lcol(ones[..., :HID])[0], ones)


def test_each_projection_of_a_fused_layer_draws_its_own_dropout_mask():
    """PEFT's q_proj, k_proj, v_proj (gate_proj, up_proj) are separate modules, each with its own LoRA dropout:
    the fused layer's projections must not share one mask of the input (no dropout in eval mode)."""
    run_ranks(_check_dropout_per_projection, 1)


def _check_row_parallel_dropout_per_shard(rank, world_size):
    megatron_layout(2, 1)
    from megatron.core.tensor_parallel import RowParallelLinear
    from megatron.core.transformer.transformer_config import TransformerConfig

    from phf_megatron.lora.layers import LoRARowParallelLinear

    cfg = TransformerConfig(num_layers=1, hidden_size=HID, num_attention_heads=HEADS, tensor_model_parallel_size=2,
                            use_cpu_initialization=True, params_dtype=torch.float64, add_bias_linear=False)
    row = RowParallelLinear(HID, HID, config=cfg, init_method=torch.nn.init.zeros_, bias=False, input_is_parallel=True,
                            skip_bias_add=True)
    lrow = LoRARowParallelLinear(row, "o_proj", HID, HID, 0.5)
    cols = slice(rank * HID // 2, (rank + 1) * HID // 2)
    lrow.adapters["o_proj"].lora_A.data.copy_(torch.eye(HID, dtype=torch.float64)[:, cols])  # B A = I: the output
    lrow.adapters["o_proj"].lora_B.data.copy_(torch.eye(HID, dtype=torch.float64))          # is the dropped input
    torch.manual_seed(0)   # the default generator: equal on every TP rank (Megatron seeds it so)
    out, _ = lrow(torch.ones(S, B, HID // 2, dtype=torch.float64))
    kept = out != 0
    assert 0 < int(kept.sum()) < kept.numel()
    return kept


def test_a_row_parallel_adapter_drops_each_tensor_parallel_shard_with_its_own_mask():
    """At TP 1 each input feature of o_proj/down_proj has its own dropout draw; at TP 2 each rank holds half the
    features: the two halves must not be dropped with one mask (feature j and feature j + h/2 together)."""
    kept = run_ranks(_check_row_parallel_dropout_per_shard, 2)[0]
    assert not torch.equal(kept[..., :HID // 2], kept[..., HID // 2:])
