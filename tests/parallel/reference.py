"""The single-process oracle of a PHF step: the reference objectives on HF transformers tensors.

A fixed global batch of student/teacher sequence pairs (different prompt lengths, the same
rollout tokens, right-padded) is split into ``PhfMicroBatch``es for any DP x micro-batch layout.
``hf_reference`` runs HF Qwen3 on the whole batch: layer outputs (before the final norm, taken
with forward hooks on the decoder layers) at the window positions and the logits that predict
each rollout token, then ``objectives.phf_objective(opsd_loss, hidden_flow_loss)`` and its
gradient with respect to every student parameter.
"""

from __future__ import annotations

import torch

from phf_megatron.objectives import (
    ObjectiveConfig,
    clip_statistics,
    flow_terms,
    generalized_jsd_terms,
    hidden_flow_loss,
    layer_loss,
    opsd_loss,
    opsd_token_divergence,
    phf_objective,
    restrict_to_top_k,
    sampled_token_loss,
)
from phf_megatron.objectives.opsd import log_probs
from phf_megatron.objectives.flow import LayerPlan
from phf_megatron.parallel.batch import PhfMicroBatch

# (student prompt length, extra teacher prompt length, rollout length) per sample: a sample with
# one rollout token (no transition: contributes 0 to the flow), one with two, longer ones that
# the window (budget 5) subsamples.
SAMPLES = [(3, 4, 9), (2, 6, 1), (4, 3, 2), (5, 5, 10), (3, 3, 6), (2, 4, 8), (4, 6, 3), (3, 5, 7)]
SEQ_STUDENT, SEQ_TEACHER, WINDOW = 16, 20, 5


def sample_tokens(vocab: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(student sequence, teacher sequence) token lists per sample, unpadded."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for p_s, extra, n in SAMPLES:
        prompt = torch.randint(0, vocab, (p_s,), generator=g)
        reference = torch.randint(0, vocab, (extra,), generator=g)
        rollout = torch.randint(0, vocab, (n,), generator=g)
        out.append((torch.cat([prompt, rollout]), torch.cat([prompt, reference, rollout])))
    return out


def _pad(seqs, rollouts, length):
    tokens = torch.zeros(len(seqs), length, dtype=torch.long)
    response = torch.zeros(len(seqs), length, dtype=torch.bool)
    for b, (seq, n) in enumerate(zip(seqs, rollouts)):
        tokens[b, : len(seq)] = seq
        response[b, len(seq) - n: len(seq)] = True
    return tokens, response


def microbatches(vocab: int, dp_rank: int = 0, dp_size: int = 1, num_micro: int = 1, packed: bool = False,
                 pad_multiple: int = 1, max_tokens: int | None = None) -> list[PhfMicroBatch]:
    """This DP rank's contiguous share of the global batch, in ``num_micro`` equal micro-batches: right-padded,
    or ``packed`` (each side into one row per micro-batch, every micro-batch of the rank to one length, a
    multiple of ``pad_multiple``). ``max_tokens`` (packed): the rank's micro-batches of the token-budget plan
    instead (``token_budget_plan``: any samples, any count)."""
    from phf_megatron.parallel.layout import packed_length
    from phf_megatron.training.microbatch_plan import token_budget_plan

    pairs = sample_tokens(vocab)
    s_len = torch.tensor([len(s) for s, _ in pairs])
    t_len = torch.tensor([len(t) for _, t in pairs])
    if max_tokens is not None:
        plan = token_budget_plan(s_len.tolist(), t_len.tolist(), dp_size=dp_size, max_tokens=max_tokens,
                                 pad_multiple=pad_multiple)
        cuts = [list(mb) for mb in plan.microbatches(dp_rank)]
    else:
        per_rank = len(pairs) // dp_size
        size = per_rank // num_micro
        lo = dp_rank * per_rank
        cuts = [list(range(lo + k * size, lo + (k + 1) * size)) for k in range(num_micro)]
    totals = [packed_length([lengths[c] for c in cuts], pad_multiple) for lengths in (s_len, t_len)] if packed else None
    out = []
    for idx in cuts:
        n = [SAMPLES[i][2] for i in idx]
        st, sr = _pad([pairs[i][0] for i in idx], n, SEQ_STUDENT)
        tt, tr = _pad([pairs[i][1] for i in idx], n, SEQ_TEACHER)
        if packed:
            out.append(PhfMicroBatch.packed(st, tt, sr, tr, s_len[idx], t_len[idx], window_budget=WINDOW,
                                            pad_multiple=pad_multiple, student_total=totals[0],
                                            teacher_total=totals[1]))
        else:
            out.append(PhfMicroBatch(st, tt, sr, tr, window_budget=WINDOW))
    return out


def _layer_outputs(model, tokens, grad: bool):
    """Logits ``[B, T, V]`` and the stacked decoder-layer outputs ``[L, B, T, H]`` (pre final norm)."""
    outs, handles = [], []
    for layer in model.model.layers:
        handles.append(layer.register_forward_hook(lambda m, a, o: outs.append(o[0] if isinstance(o, tuple) else o)))
    try:
        with torch.set_grad_enabled(grad):
            logits = model(tokens).logits
    finally:
        for h in handles:
            h.remove()
    return logits, torch.stack(outs)


def _rows(hidden, window):
    """``[L, B, T, H]`` at ``window [B, m]`` → ``[L, B, m, H]``."""
    idx = window[None, :, :, None].expand(hidden.shape[0], -1, -1, hidden.shape[-1])
    return hidden.gather(2, idx)


def _pad_cat(tensors, dim, length, value=0):
    out = []
    for t in tensors:
        pad = list(t.shape)
        pad[dim] = length - t.shape[dim]
        out.append(torch.cat([t, torch.full(pad, value, dtype=t.dtype)], dim=dim))
    return torch.cat(out, dim=0 if dim != 0 else 1)


def hf_reference(student, teacher, mbs: list[PhfMicroBatch], objective: ObjectiveConfig, layers_total: int):
    """Loss, its parts, per-layer flow values and the gradient of every student parameter."""
    student.zero_grad(set_to_none=True)
    s_logits, t_logits, s_rows, t_rows, valid, masks, toks = [], [], [], [], [], [], []
    for mb in mbs:
        sl, sh = _layer_outputs(student, mb.student_tokens, grad=True)
        tl, th = _layer_outputs(teacher, mb.teacher_tokens, grad=False)
        n_max = max(int(x) for x in mb.student_response.sum(1))
        for b in range(mb.batch_size):
            si = mb.student_response[b].nonzero().flatten() - 1
            ti = mb.teacher_response[b].nonzero().flatten() - 1
            pad = n_max - len(si)
            s_logits.append(torch.cat([sl[b, si], sl.new_zeros(pad, sl.shape[-1])])[None])
            t_logits.append(torch.cat([tl[b, ti], tl.new_zeros(pad, tl.shape[-1])])[None])
            masks.append(torch.arange(n_max)[None] < len(si))
            toks.append(torch.cat([mb.student_tokens[b, si + 1], torch.zeros(pad, dtype=torch.long)])[None])
        s_rows.append(_rows(sh, mb.student_window))
        t_rows.append(_rows(th, mb.teacher_window))
        valid.append(mb.window_valid)
    n = max(x.shape[1] for x in s_logits)
    s_lg = torch.cat([torch.cat([x, x.new_zeros(1, n - x.shape[1], x.shape[2])], 1) for x in s_logits])
    t_lg = torch.cat([torch.cat([x, x.new_zeros(1, n - x.shape[1], x.shape[2])], 1) for x in t_logits])
    mask = torch.cat([torch.cat([x, torch.zeros(1, n - x.shape[1], dtype=torch.bool)], 1) for x in masks])
    tokens = torch.cat([torch.cat([x, torch.zeros(1, n - x.shape[1], dtype=torch.long)], 1) for x in toks])
    m = max(v.shape[1] for v in valid)
    h_s = torch.cat([torch.cat([r, r[:, :, -1:].expand(-1, -1, m - r.shape[2], -1)], 2) for r in s_rows], 1)
    h_t = torch.cat([torch.cat([r, r[:, :, -1:].expand(-1, -1, m - r.shape[2], -1)], 2) for r in t_rows], 1)
    val = torch.cat([torch.cat([v, torch.zeros(v.shape[0], m - v.shape[1], dtype=torch.bool)], 1) for v in valid])

    o = objective
    if o.use_tinker_loss:
        opsd = sampled_token_loss(s_lg, t_lg, tokens, mask, o.jsd_temperature)
        out = {"loss_opsd": opsd.item(), "loss_flow": 0.0}
    else:
        opsd = opsd_loss(s_lg, t_lg, mask, o.jsd_beta, o.jsd_temperature, o.jsd_clip, o.jsd_clip_mode, o.top_k_loss)
        out = {"loss_opsd": opsd.item(), "loss_flow": 0.0, **_diagnostics(s_lg.detach(), t_lg, tokens, mask, o)}
    loss = opsd
    if o.uses_flow:
        flow = hidden_flow_loss(h_s, h_t, val, o.flow_variant, o.flow_eps, o.flow_layers)
        loss = phf_objective(opsd, flow, o.flow_alpha)
        plan = LayerPlan.build(layers_total, o.flow_variant, o.flow_layers)
        with torch.no_grad():
            terms = flow_terms(h_s, h_t, val, plan, o.flow_variant, o.flow_eps)
            w = terms.sample_mask.double()
            per_layer = (layer_loss(terms, o.flow_variant).double() * w).sum(1) / w.sum().clamp(min=1)
            out["layer_flow"] = per_layer.tolist()
            if terms.adjacent is not None:
                out["pair_flow"] = ((terms.adjacent.double() * w).sum(1) / w.sum().clamp(min=1)).tolist()
        out["loss_flow"] = flow.item()
    loss.backward()
    out["loss"] = loss.item()
    out["grads"] = {name: p.grad.detach().clone() for name, p in student.named_parameters() if p.grad is not None}
    return out


def _diagnostics(s_lg, t_lg, tokens, mask, o: ObjectiveConfig) -> dict:
    """The clip diagnostics and the loss by rollout token id, from the objectives directly."""
    s, t = restrict_to_top_k(s_lg, t_lg, o.top_k_loss) if o.top_k_loss else (s_lg, t_lg)
    terms = generalized_jsd_terms(log_probs(s, o.jsd_temperature), log_probs(t, o.jsd_temperature), o.jsd_beta)
    raw, cut = (x[mask] for x in clip_statistics(terms, o.jsd_clip, o.jsd_clip_mode))
    n = mask.sum()
    out = {"opsd_unclipped": float(raw.sum() / n), "clip_frac_tokens": float((cut > 0).sum() / n)}
    if o.jsd_clip is None or o.jsd_clip_mode == "element":
        out["clip_frac_entries"] = float(cut.sum() / (n * terms.shape[-1]))
    per_token = opsd_token_divergence(s_lg, t_lg, o.jsd_beta, o.jsd_temperature, o.jsd_clip, o.jsd_clip_mode,
                                      o.top_k_loss)[mask]
    by_id: dict[int, list[float]] = {}
    for tok, value in zip(tokens[mask].tolist(), per_token.tolist()):
        entry = by_id.setdefault(tok, [0.0, 0])
        entry[0] += value
        entry[1] += 1
    total = float(per_token.sum())
    out["loss_tokens"] = sorted(([tok, v / total, c] for tok, (v, c) in by_id.items()), key=lambda r: -r[1])
    return out
