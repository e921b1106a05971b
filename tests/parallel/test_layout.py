"""``parallel.layout.SequenceLayout``: padded and packed addressing of a micro-batch's sequences.

Round trips (a per-sample tensor placed into the layout and read back at ``flat_index``), the
packed row's boundaries (``cu_seqlens`` with the trailing pad segment, ``max_seqlen`` the longest
segment), positions restarting per sequence, the padded layout's forward arguments equal to
today's (``0..T-1``, no ``PackedSeqParams``), and one-line errors.
"""

import pytest
import torch

from phf_megatron.parallel.layout import SequenceLayout, packed_length


def _rows():
    torch.manual_seed(0)
    lengths = torch.tensor([5, 1, 7, 2])  # a one-token sequence among them
    tokens = torch.randint(1, 100, (4, 7))
    tokens[torch.arange(7)[None] >= lengths[:, None]] = 0
    return tokens, lengths


def test_pack_concatenates_without_padding_and_pads_to_the_multiple():
    tokens, lengths = _rows()
    layout = SequenceLayout.pack(tokens, lengths, pad_multiple=4)
    assert layout.packed and layout.tokens.shape == (1, 16)  # 15 tokens -> 16: a pad segment of 1
    assert layout.tokens[0, :15].tolist() == [t for row, n in zip(tokens.tolist(), lengths.tolist()) for t in row[:n]]
    assert layout.cu_seqlens.tolist() == [0, 5, 6, 13, 15, 16] and layout.cu_seqlens.dtype == torch.int32
    assert layout.max_seqlen == 7
    assert layout.position_ids()[0].tolist() == [0, 1, 2, 3, 4, 0, 0, 1, 2, 3, 4, 5, 6, 0, 1, 0]
    assert layout.start.tolist() == [0, 5, 6, 13] and layout.column.tolist() == [0, 0, 0, 0]
    starts = layout.sequence_starts()[0].nonzero().flatten().tolist()
    assert starts == [0, 5, 6, 13]  # the pad segment is nobody's


def test_pack_at_the_multiple_has_no_pad_segment():
    tokens, lengths = _rows()
    layout = SequenceLayout.pack(tokens[:3], lengths[:3] + torch.tensor([0, 0, -1]), pad_multiple=4)  # 5+1+6 = 12
    assert layout.tokens.shape == (1, 12) and layout.cu_seqlens.tolist() == [0, 5, 6, 12]
    assert layout.max_seqlen == 6


def test_pack_to_a_common_total():
    tokens, lengths = _rows()
    total = packed_length([lengths[:2], lengths[2:]], 4)
    assert total == 12  # max(6, 9) -> 12
    layout = SequenceLayout.pack(tokens[:2], lengths[:2], 4, total=total)
    assert layout.cu_seqlens.tolist() == [0, 5, 6, 12] and layout.max_seqlen == 6  # the pad segment is the longest
    with pytest.raises(ValueError, match="^total: 6 is below the packed length 8"):
        SequenceLayout.pack(tokens[:2], lengths[:2], 4, total=6)


@pytest.mark.parametrize("packed", [False, True])
def test_place_and_flat_index_round_trip(packed):
    tokens, lengths = _rows()
    layout = SequenceLayout.pack(tokens, lengths, 2) if packed else SequenceLayout.pad(tokens, lengths)
    values = torch.randn(4, 7, 3)
    placed = layout.place(values)
    assert placed.shape == layout.tokens.shape + (3,)
    assert torch.equal(layout.place(tokens), layout.tokens)
    flat = placed.reshape(-1, 3)
    for b, n in enumerate(lengths.tolist()):
        index = layout.flat_index(torch.tensor(b), torch.arange(n))
        assert torch.equal(flat[index], values[b, :n])
    real = layout.place(torch.ones(4, 7, dtype=torch.bool), False)
    assert int(real.sum()) == int(lengths.sum())


@pytest.mark.parametrize("packed", [False, True])
def test_take_inverts_place_and_sample_ids_name_each_position(packed):
    tokens, lengths = _rows()
    layout = SequenceLayout.pack(tokens, lengths, 4) if packed else SequenceLayout.pad(tokens, lengths)
    values = torch.randn(4, 7, 3)
    back = layout.take(layout.place(values), fill=-1.0)
    assert back.shape == (4, int(lengths.max()), 3)
    for b, n in enumerate(lengths.tolist()):
        assert torch.equal(back[b, :n], values[b, :n]) and bool((back[b, n:] == -1).all())
    ids = layout.sample_ids()
    assert [int((ids == b).sum()) for b in range(4)] == lengths.tolist()
    assert int((ids < 0).sum()) == layout.tokens.numel() - int(lengths.sum())  # padding / the pad segment
    with pytest.raises(ValueError, match=r"^values: expected the activation's"):
        layout.take(values[:, :5])


def test_padded_forward_kwargs_are_todays():
    tokens, _ = _rows()
    kwargs = SequenceLayout.pad(tokens).forward_kwargs()
    assert kwargs["packed_seq_params"] is None and kwargs["attention_mask"] is None
    assert torch.equal(kwargs["position_ids"], torch.arange(7)[None].expand(4, 7))


def test_packed_seq_params_are_megatrons_thd():
    pytest.importorskip("megatron.core")
    tokens, lengths = _rows()
    params = SequenceLayout.pack(tokens, lengths, 4).packed_seq_params()
    assert params.qkv_format == "thd" and params.cu_seqlens_q is params.cu_seqlens_kv
    assert params.max_seqlen_q == params.max_seqlen_kv == 7


def test_one_line_errors():
    tokens, lengths = _rows()
    with pytest.raises(ValueError, match=r"^lengths: sample 1 has length 0, outside \[1, 7\]$"):
        SequenceLayout.pack(tokens, torch.tensor([5, 0, 7, 2]))
    with pytest.raises(ValueError, match=r"^lengths: expected \[4\], got \(3,\)$"):
        SequenceLayout.pad(tokens, lengths[:3])
    with pytest.raises(ValueError, match="^pad_multiple: must be >= 1, got 0$"):
        SequenceLayout.pack(tokens, lengths, 0)


def test_the_planners_packed_token_count_is_the_layouts_length():
    """``training.microbatch_plan.microbatch_tokens(..., "packed", m)`` counts what ``pack`` computes."""
    from phf_megatron.training.microbatch_plan import microbatch_tokens

    tokens, lengths = _rows()
    for m in (1, 2, 4, 8):
        assert SequenceLayout.pack(tokens, lengths, m).seq_len == microbatch_tokens(lengths.tolist(), "packed", m)
