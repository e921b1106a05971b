"""Where a micro-batch's sequences sit in the activation: right-padded rows, or packed into one row.

* ``SequenceLayout.pad(tokens, lengths)``: today's layout, ``[B, T]`` with sample ``b`` in row
  ``b`` from position 0; causal attention needs no mask (a real token never sees a later pad).
* ``SequenceLayout.pack(tokens, lengths, pad_multiple)``: the ``B`` sequences concatenated
  without padding into one row ``[1, S]`` (THD, Megatron's ``PackedSeqParams`` with
  ``cu_seqlens``); position ids restart at every sequence and attention stays inside each. ``S``
  is ``Σ L_b`` rounded up to ``pad_multiple`` (the TP size under sequence parallelism: each rank
  holds ``S / tp`` positions) or to ``total`` (one length for every micro-batch of a rank: a
  pipeline sends fixed-size activations); the remainder is one trailing pad segment, a sequence of
  its own that nothing scores.

Both expose the same addressing, so the code that indexes activations (``logit_rows``,
``window_rows``, ``vocab_parallel_jsd``) has no packed branch: sample ``b``'s position ``t`` sits
at row ``column[b]``, sequence position ``start[b] + t``, i.e. flat ``column·S + start + t``
(``flat_index``). ``place`` moves a per-sample ``[B, T]`` tensor (a scored mask, per-token values)
into the layout's ``[b_act, S]``.

RoPE: ``max_seqlen`` is the longest *segment*, so Megatron's unfused RoPE takes its
per-sequence branch (``rope_utils._apply_rotary_pos_emb_thd``, freqs of ``max_seqlen`` rows,
each sequence from position 0): each sequence is rotated exactly as when it runs alone. Were it the
packed length (freqs of ``cu_seqlens[-1]`` rows), the offset branch would rotate sequence ``i``
from ``cu_seqlens[i]``; RoPE scores depend only on ``q - k`` inside a sequence, so that gives the
same attention in exact arithmetic, but at other angles (rounding grows with the offset) and a
freqs table of the whole packed length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _check_lengths(tokens: torch.Tensor, lengths: torch.Tensor) -> None:
    if tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError(f"tokens: expected a [B, T] long tensor, got {tokens.dtype} {tuple(tokens.shape)}")
    if lengths.shape != (tokens.shape[0],):
        raise ValueError(f"lengths: expected [{tokens.shape[0]}], got {tuple(lengths.shape)}")
    if bool((lengths < 1).any()) or bool((lengths > tokens.shape[1]).any()):
        b = int(((lengths < 1) | (lengths > tokens.shape[1])).nonzero()[0])
        raise ValueError(f"lengths: sample {b} has length {int(lengths[b])}, outside [1, {tokens.shape[1]}]")


@dataclass(frozen=True)
class SequenceLayout:
    """The activation tokens of a micro-batch and where each sample sits in them (module docstring)."""

    tokens: torch.Tensor
    """``[b_act, S]`` long: what the model runs (``b_act = B`` padded, 1 packed)."""
    lengths: torch.Tensor
    """``[B]`` long: each sample's length."""
    column: torch.Tensor
    """``[B]`` long: each sample's activation row."""
    start: torch.Tensor
    """``[B]`` long: each sample's first position in its row."""
    cu_seqlens: torch.Tensor | None = None
    """Packed: ``[segments + 1]`` int32 boundaries, the trailing pad segment included; padded: None."""
    max_seqlen: int | None = None
    """Packed: the longest segment (the RoPE pitfall above); padded: None."""

    @classmethod
    def pad(cls, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> "SequenceLayout":
        """Right-padded rows as given (``lengths`` default: every row is ``T`` long)."""
        b, t = tokens.shape
        lengths = torch.full((b,), t, dtype=torch.long, device=tokens.device) if lengths is None else lengths.long()
        _check_lengths(tokens, lengths)
        return cls(tokens, lengths, torch.arange(b, device=tokens.device), torch.zeros_like(lengths))

    @classmethod
    def pack(cls, tokens: torch.Tensor, lengths: torch.Tensor, pad_multiple: int = 1, pad_id: int = 0,
             total: int | None = None) -> "SequenceLayout":
        """Row ``b``'s first ``lengths[b]`` tokens, concatenated; then a pad segment up to a multiple of
        ``pad_multiple`` (or to ``total``, itself such a multiple and at least the packed length)."""
        lengths = lengths.long()
        _check_lengths(tokens, lengths)
        if pad_multiple < 1:
            raise ValueError(f"pad_multiple: must be >= 1, got {pad_multiple}")
        used = int(lengths.sum())
        size = -(-used // pad_multiple) * pad_multiple
        if total is not None:
            if total < size or total % pad_multiple:
                raise ValueError(f"total: {total} is below the packed length {size} or not a multiple of "
                                 f"{pad_multiple}")
            size = total
        keep = torch.arange(tokens.shape[1], device=tokens.device)[None] < lengths[:, None]
        row = torch.full((1, size), pad_id, dtype=torch.long, device=tokens.device)
        row[0, :used] = tokens[keep]
        segments = lengths.tolist() + ([size - used] if size > used else [])
        cu = torch.tensor([0] + segments, dtype=torch.int32, device=tokens.device).cumsum(0, dtype=torch.int32)
        start = cu[:-1][: len(lengths)].long()
        return cls(row, lengths, torch.zeros_like(lengths), start, cu, max(segments))

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None

    @property
    def num_sequences(self) -> int:
        return self.lengths.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def flat_index(self, sample: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Flat ``column·S + start + pos`` of sample ``sample``'s position ``pos`` (the score index's addressing)."""
        return self.column[sample] * self.seq_len + self.start[sample] + pos

    def place(self, values: torch.Tensor, fill=0) -> torch.Tensor:
        """A per-sample ``[B, T]`` tensor moved to ``[b_act, S]``; ``fill`` off the samples' tokens."""
        if values.shape[0] != self.num_sequences or values.shape[1] < int(self.lengths.max()):
            raise ValueError(f"values: expected [{self.num_sequences}, >= {int(self.lengths.max())}], got "
                             f"{tuple(values.shape)}")
        keep = torch.arange(values.shape[1], device=values.device)[None] < self.lengths[:, None].to(values.device)
        sample, pos = keep.nonzero(as_tuple=True)
        out = torch.full((self.tokens.numel(),) + values.shape[2:], fill, dtype=values.dtype, device=values.device)
        out[self.flat_index(sample, pos).to(values.device)] = values[sample, pos]
        return out.reshape(self.tokens.shape + values.shape[2:])

    def take(self, values: torch.Tensor, fill=0) -> torch.Tensor:
        """Inverse of ``place``: ``[b_act, S]`` to per-sample ``[B, max L]``, ``fill`` past each sample's length."""
        if tuple(values.shape[:2]) != tuple(self.tokens.shape):
            raise ValueError(f"values: expected the activation's {tuple(self.tokens.shape)}, got {tuple(values.shape)}")
        pos = torch.arange(int(self.lengths.max()), device=values.device)[None]
        keep = pos < self.lengths[:, None].to(values.device)
        sample = torch.arange(self.num_sequences, device=values.device)[:, None]
        index = self.flat_index(sample, pos).clamp(max=self.tokens.numel() - 1).to(values.device)
        flat = values.reshape((-1,) + values.shape[2:])[index]
        return torch.where(keep.reshape(keep.shape + (1,) * (values.dim() - 2)), flat,
                           torch.full((), fill, dtype=values.dtype, device=values.device))

    def sample_ids(self) -> torch.Tensor:
        """``[b_act, S]`` long: the sample each position belongs to, -1 on the pad segment (and right padding)."""
        out = torch.full((self.tokens.numel(),), -1, dtype=torch.long, device=self.tokens.device)
        keep = torch.arange(int(self.lengths.max()), device=self.tokens.device)[None] < self.lengths[:, None]
        sample, pos = keep.nonzero(as_tuple=True)
        out[self.flat_index(sample, pos)] = sample
        return out.reshape(self.tokens.shape)

    def sequence_starts(self) -> torch.Tensor:
        """``[b_act, S]`` bool: True at each sample's first token (no token of its own sequence predicts it)."""
        out = torch.zeros(self.tokens.numel(), dtype=torch.bool, device=self.tokens.device)
        out[self.flat_index(torch.arange(self.num_sequences, device=self.tokens.device), 0)] = True
        return out.reshape(self.tokens.shape)

    def position_ids(self) -> torch.Tensor:
        """``[b_act, S]`` long: positions restarting at every segment (padded: ``0..S-1`` in every row)."""
        if not self.packed:
            return torch.arange(self.seq_len, device=self.tokens.device)[None].expand_as(self.tokens)
        cu = self.cu_seqlens.long()
        seg = torch.repeat_interleave(torch.arange(len(cu) - 1, device=cu.device), cu[1:] - cu[:-1])
        return (torch.arange(self.seq_len, device=cu.device) - cu[seg])[None]

    def packed_seq_params(self):
        """Megatron's ``PackedSeqParams`` (THD; ``max_seqlen`` the longest segment); None when padded."""
        if not self.packed:
            return None
        from megatron.core.packed_seq_params import PackedSeqParams  # Megatron: on first use

        return PackedSeqParams(qkv_format="thd", cu_seqlens_q=self.cu_seqlens, cu_seqlens_kv=self.cu_seqlens,
                               max_seqlen_q=self.max_seqlen, max_seqlen_kv=self.max_seqlen)

    def forward_kwargs(self) -> dict:
        """``position_ids``, ``attention_mask`` (None: causal) and ``packed_seq_params`` for the model's forward."""
        return dict(position_ids=self.position_ids(), attention_mask=None, packed_seq_params=self.packed_seq_params())

    def to(self, device) -> "SequenceLayout":
        cu = None if self.cu_seqlens is None else self.cu_seqlens.to(device)
        return SequenceLayout(self.tokens.to(device), self.lengths.to(device), self.column.to(device),
                              self.start.to(device), cu, self.max_seqlen)


def packed_length(lengths: list[torch.Tensor], pad_multiple: int = 1) -> int:
    """One packed length for every micro-batch of a rank (``lengths[k]``: micro-batch ``k``'s sequence
    lengths): the longest packed micro-batch rounded up to ``pad_multiple`` (pipeline schedules send
    fixed-size activations; the others get a longer trailing pad segment)."""
    longest = max(int(x.sum()) for x in lengths)
    return -(-longest // pad_multiple) * pad_multiple
