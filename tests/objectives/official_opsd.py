"""A short float64 transcription of the official OPSD output losses, for the tests (not used by the package).

Source: the official OPSD code at its newest commit ``7448751f307a9cdbcc1246dd1565a1a605b443df``
(2026-05-09; forks ``louieworth/OPSD`` and ``shx2005/OPSD``), ``opsd_trainer.py``:

* ``official_jsd``: ``OPSDTrainer.generalized_jsd_loss``, lines 381-479, with ``labels`` and
  ``reduction="batchmean"`` as ``compute_loss`` calls it (lines 736-744): temperature first
  (427-428), the teacher's top-k gathered on both sides (430-435), ``log_softmax`` (438-439),
  ``F.kl_div(input, target, log_target=True)`` = ``exp(target) (target - input)`` element-wise
  (441-460), ``clamp(max=token_clip)`` element-wise (463-464), then the masked sum over the
  number of unmasked tokens (467-473);
* ``official_tinker``: the ``use_thinking_machines_loss`` branch of ``compute_loss``: the
  sampled token's log-probs at the temperature (647-652, 691-695), the detached advantage and
  ``-(advantage * logp_student).mean()`` over the unmasked tokens (714-726).

Written from those lines for this test; it shares no code with ``phf_megatron.objectives``.
"""

import torch
import torch.nn.functional as F


def _kl_div_log_target(inp, target):
    """``F.kl_div(inp, target, reduction="none", log_target=True)``: exp(target) * (target - inp)."""
    return F.kl_div(inp, target, reduction="none", log_target=True)


def official_jsd(student_logits, teacher_logits, labels, beta=0.5, temperature=1.0, top_k=None, token_clip=None):
    student_logits = student_logits / temperature
    teacher_logits = teacher_logits / temperature
    if top_k is not None and top_k > 0:
        _, idx = torch.topk(teacher_logits, k=top_k, dim=-1)
        student_logits = torch.gather(student_logits, -1, idx)
        teacher_logits = torch.gather(teacher_logits, -1, idx)
    s = F.log_softmax(student_logits, dim=-1)
    t = F.log_softmax(teacher_logits, dim=-1)
    if beta == 0:
        jsd = _kl_div_log_target(s, t)
    elif beta == 1:
        jsd = _kl_div_log_target(t, s)
    else:
        b = torch.tensor(beta, dtype=s.dtype)
        m = torch.logsumexp(torch.stack([s + torch.log1p(-b), t + torch.log(b)]), dim=0)
        jsd = b * _kl_div_log_target(m, t) + (1 - b) * _kl_div_log_target(m, s)
    if token_clip is not None:
        jsd = jsd.clamp(max=token_clip)
    mask = labels != -100
    return jsd[mask].sum() / mask.sum()


def official_tinker(student_logits, teacher_logits, sampled_ids, labels, temperature=1.0):
    s = F.log_softmax(student_logits / temperature, dim=-1).gather(-1, sampled_ids.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        t = F.log_softmax(teacher_logits / temperature, dim=-1).gather(-1, sampled_ids.unsqueeze(-1)).squeeze(-1)
    advantage = (t - s).detach()
    mask = labels != -100
    return -(advantage[mask] * s[mask]).mean()
