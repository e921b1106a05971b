"""The SFT reference (``objectives.sft.sft_loss``) is teacher-forced cross-entropy.

* against ``F.cross_entropy`` on the scored entries, float64: loss and gradient w.r.t. the logits,
  token mean and ``sum / num_items``;
* against HF transformers' Qwen3 loss (``labels`` -100 on the unscored tokens) on a tiny random
  model, response-only and with the prompt tokens, one row right-padded: loss and every
  parameter's gradient. HF upcasts the logits to float32 (``ForCausalLMLoss``), so both sides run
  in float32 on the same logits: 1e-5 relative covers the two log-softmax orders.
"""

import pytest
import torch
import torch.nn.functional as F

from phf_megatron.objectives.sft import sft_loss
from tests.helpers.tiny_qwen3 import tiny_hf_model


def test_equals_torch_cross_entropy_in_float64():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (3, 5), generator=g)
    mask = torch.rand(3, 5, generator=g) < 0.6
    n = int(mask.sum())
    assert 0 < n < mask.numel()
    for ours_kw, reduction, scale in (({}, "mean", 1.0), ({"num_items": 40.0}, "sum", 1 / 40)):
        ours = sft_loss(logits, targets, mask, **ours_kw)
        ref = F.cross_entropy(logits[mask], targets[mask], reduction=reduction) * scale
        torch.testing.assert_close(ours, ref, rtol=1e-14, atol=0)
        g_ours, = torch.autograd.grad(ours, logits)
        g_ref, = torch.autograd.grad(ref, logits)
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-13, atol=1e-16)
        assert not bool(g_ours[~mask].any())                       # an unscored position gets no gradient


def test_no_scored_token_is_zero_with_zero_gradient():
    logits = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    loss = sft_loss(logits, torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.bool))
    assert float(loss.detach()) == 0.0 and not bool(torch.autograd.grad(loss, logits)[0].any())


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (2, 12), generator=g)
    attention = torch.ones(2, 12, dtype=torch.long)
    attention[1, 10:] = 0                                          # row 1: two pad tokens on the right
    prompt = torch.arange(12)[None] < torch.tensor([[4], [6]])     # prompt lengths 4 and 6
    return ids, attention, prompt


@pytest.mark.parametrize("with_prompt", [False, True], ids=["response_only", "with_prompt"])
@pytest.mark.parametrize("num_items", [None, 30])
def test_equals_hf_qwen3_loss_and_gradients(with_prompt, num_items):
    model = tiny_hf_model("gqa", num_layers=2)
    ids, attention, prompt = _batch()
    scored = attention.bool() & (True if with_prompt else ~prompt)
    labels = ids.masked_fill(~scored, -100)

    hf_kwargs = {} if num_items is None else {"num_items_in_batch": torch.tensor(num_items)}
    hf_loss = model(input_ids=ids, attention_mask=attention, labels=labels, **hf_kwargs).loss
    hf_grads = torch.autograd.grad(hf_loss, list(model.parameters()))

    logits = model(input_ids=ids, attention_mask=attention).logits
    loss = sft_loss(logits[:, :-1], ids[:, 1:], scored[:, 1:], num_items=num_items)
    grads = torch.autograd.grad(loss, list(model.parameters()))

    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, hf_loss, rtol=1e-5, atol=0)
    for (name, _), ours, ref in zip(model.named_parameters(), grads, hf_grads):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-7, msg=name)
    if with_prompt:                                                # the prompt's tokens do enter the loss
        response_only = sft_loss(logits[:, :-1], ids[:, 1:], (attention.bool() & ~prompt)[:, 1:], num_items=num_items)
        assert abs(float(loss.detach()) - float(response_only.detach())) > 1e-3


@pytest.mark.parametrize("call, message", [
    (lambda: sft_loss(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool)),
     "logits: expected 3 dims"),
    (lambda: sft_loss(torch.zeros(2, 3, 4), torch.zeros(2, 2, dtype=torch.long), torch.ones(2, 2, dtype=torch.bool)),
     "targets: shape"),
    (lambda: sft_loss(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3)),
     "mask: expected a bool tensor"),
    (lambda: sft_loss(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool),
                      num_items=0), "num_items: must be > 0"),
])
def test_bad_arguments_are_one_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
