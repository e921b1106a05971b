"""Micro-batch validation: aligned rollouts, windows inside the sequences, clear errors otherwise."""

import pytest
import torch

from phf_megatron.parallel.batch import PhfMicroBatch, step_normalizers

from .reference import SAMPLES, microbatches


def _pair(student_prompt=3, teacher_prompt=6, rollout=(5, 6, 7, 8), pad=2):
    n = len(rollout)
    st = torch.cat([torch.arange(100, 100 + student_prompt), torch.tensor(rollout), torch.zeros(pad, dtype=torch.long)])
    tt = torch.cat([torch.arange(200, 200 + teacher_prompt), torch.tensor(rollout), torch.zeros(pad, dtype=torch.long)])
    sr = torch.zeros_like(st, dtype=torch.bool)
    sr[student_prompt: student_prompt + n] = True
    tr = torch.zeros_like(tt, dtype=torch.bool)
    tr[teacher_prompt: teacher_prompt + n] = True
    return st[None], tt[None], sr[None], tr[None]


def test_window_and_scores_index_the_same_rollout_tokens():
    for mb in microbatches(256, num_micro=2):
        assert torch.equal(mb.student_tokens.gather(1, mb.student_window) * mb.window_valid,
                           mb.teacher_tokens.gather(1, mb.teacher_window) * mb.window_valid)
        s_next = mb.student_tokens.flatten()[mb.student_score_index + 1]
        t_next = mb.teacher_tokens.flatten()[mb.teacher_score_index + 1]
        assert torch.equal(s_next, t_next) and len(s_next) == mb.num_tokens


def test_a_packed_microbatch_indexes_the_padded_ones_tokens():
    """``PhfMicroBatch.packed``: one row per side; the window entries, the scored rows and the counts name the
    same tokens as the right-padded micro-batch's, sample by sample; a window ends at a sample's last token,
    beside the next sample's first; the one-token rollout (sample 1) has no flow term."""
    from .reference import SEQ_STUDENT, SEQ_TEACHER, WINDOW, _pad, sample_tokens

    pairs = sample_tokens(256)
    n = [r for _, _, r in SAMPLES]
    st, sr = _pad([s for s, _ in pairs], n, SEQ_STUDENT)
    tt, tr = _pad([t for _, t in pairs], n, SEQ_TEACHER)
    s_len, t_len = torch.tensor([len(s) for s, _ in pairs]), torch.tensor([len(t) for _, t in pairs])
    padded = PhfMicroBatch(st, tt, sr, tr, window_budget=WINDOW)
    packed = PhfMicroBatch.packed(st, tt, sr, tr, s_len, t_len, window_budget=WINDOW, pad_multiple=4)
    assert packed.batch_size == 1 and packed.num_sequences == len(SAMPLES) and packed.student_tokens.shape[1] % 4 == 0
    assert packed.student_tokens.shape[1] < st.numel() and packed.teacher_tokens.shape[1] < tt.numel()
    for side in ("student", "teacher"):
        got = getattr(packed, f"{side}_tokens")[0][getattr(packed, f"{side}_window")]
        want = getattr(padded, f"{side}_tokens").gather(1, getattr(padded, f"{side}_window"))
        assert torch.equal(got * packed.window_valid, want * padded.window_valid), side
        nxt = lambda mb: getattr(mb, f"{side}_tokens").flatten()[getattr(mb, f"{side}_score_index") + 1]  # noqa: E731
        assert torch.equal(nxt(packed), nxt(padded)), side
    assert torch.equal(packed.window_valid, padded.window_valid)
    assert torch.equal(packed.flow_sample_mask, padded.flow_sample_mask) and not bool(packed.flow_sample_mask[1])
    assert packed.num_tokens == padded.num_tokens and torch.equal(packed.score_tokens, padded.score_tokens)
    last = packed.student_window[0, packed.window_valid[0]].max()
    assert int(last) + 1 == int(packed.student_layout.start[1])  # sample 0's window ends at the boundary


def test_a_packed_window_entry_in_another_sample_raises():
    from .reference import SEQ_STUDENT, SEQ_TEACHER, WINDOW, _pad, sample_tokens

    pairs = sample_tokens(256)[:2]
    n = [r for _, _, r in SAMPLES[:2]]
    st, sr = _pad([s for s, _ in pairs], n, SEQ_STUDENT)
    tt, tr = _pad([t for _, t in pairs], n, SEQ_TEACHER)
    mb = PhfMicroBatch.packed(st, tt, sr, tr, torch.tensor([len(s) for s, _ in pairs]),
                              torch.tensor([len(t) for _, t in pairs]), window_budget=WINDOW)
    window = mb.student_window.clone()
    window[1, 0] = window[0, 0]  # sample 1's entry on sample 0's token
    with pytest.raises(ValueError, match=r"^teacher_window: entry 0 of sample 1 does not index the same rollout"):
        PhfMicroBatch(mb.student_tokens, mb.teacher_tokens, mb.student_response, mb.teacher_response, WINDOW,
                      window, mb.teacher_window, mb.window_valid, student_layout=mb.student_layout,
                      teacher_layout=mb.teacher_layout)


def test_samples_with_fewer_than_two_rollout_tokens_leave_the_flow_mean():
    mb = microbatches(256)[0]
    assert mb.flow_sample_mask.tolist() == [n >= 2 for _, _, n in SAMPLES]
    norm = step_normalizers(microbatches(256, num_micro=4), dp_group=None)
    assert norm.num_tokens == sum(n for _, _, n in SAMPLES)
    assert norm.num_flow_samples == sum(n >= 2 for _, _, n in SAMPLES)


def test_rollout_lengths_that_disagree_raise():
    st, tt, sr, tr = _pair()
    tr[0, 10] = True  # one more "rollout" token in the teacher
    with pytest.raises(ValueError, match="rollout lengths disagree for sample 0: student has 4 rollout tokens, teacher has 5"):
        PhfMicroBatch(st, tt, sr, tr)


def test_rollout_tokens_that_differ_raise():
    st, tt, sr, tr = _pair()
    tt[0, 7] += 1
    with pytest.raises(ValueError, match="rollout tokens of sample 0 differ"):
        PhfMicroBatch(st, tt, sr, tr)


def test_window_positions_outside_the_sequence_raise():
    st, tt, sr, tr = _pair()
    window = torch.tensor([[3, 4, 5, 9]])
    with pytest.raises(ValueError, match=r"student_window: window positions must lie in \[0, 9\)"):
        PhfMicroBatch(st, tt, sr, tr, student_window=window, teacher_window=window + 3,
                      window_valid=torch.ones(1, 4, dtype=torch.bool))


def test_misaligned_window_raises():
    st, tt, sr, tr = _pair()
    with pytest.raises(ValueError, match="entry 1 of sample 0 does not index the same rollout token"):
        PhfMicroBatch(st, tt, sr, tr, student_window=torch.tensor([[3, 4]]), teacher_window=torch.tensor([[6, 8]]),
                      window_valid=torch.ones(1, 2, dtype=torch.bool))
    ok = PhfMicroBatch(st, tt, sr, tr, student_window=torch.tensor([[3, 6]]), teacher_window=torch.tensor([[6, 9]]),
                       window_valid=torch.ones(1, 2, dtype=torch.bool))
    assert ok.flow_sample_mask.tolist() == [True]


@pytest.mark.parametrize("mutate,match", [
    (lambda a: (a[0].float(), *a[1:]), "student_tokens: expected a \\[B, T\\] long tensor"),
    (lambda a: (a[0], a[1], a[2][:, :-1], a[3]), "student_response: expected a bool tensor"),
    (lambda a: (a[0], a[1], torch.roll(a[2], -3, 1), a[3]), "student_response: sample 0 has a rollout token at position 0"),
    (lambda a: (a[0], torch.cat([a[1], a[1]]), a[2], torch.cat([a[3], a[3]])), "teacher_tokens: batch 2 != student batch 1"),
])
def test_malformed_tensors_raise(mutate, match):
    with pytest.raises(ValueError, match=match):
        PhfMicroBatch(*mutate(_pair()))


def test_partial_window_arguments_raise():
    st, tt, sr, tr = _pair()
    with pytest.raises(ValueError, match="give all three or none"):
        PhfMicroBatch(st, tt, sr, tr, student_window=torch.tensor([[3, 4]]))


def test_to_device_keeps_the_window_and_indices():
    mb = microbatches(256)[0]
    moved = mb.to("cpu")
    assert torch.equal(moved.student_window, mb.student_window) and torch.equal(moved.teacher_window, mb.teacher_window)
    assert torch.equal(moved.student_score_index, mb.student_score_index) and moved.num_tokens == mb.num_tokens
