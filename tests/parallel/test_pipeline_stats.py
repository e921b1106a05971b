"""The stats rows that carry the flow share down the pipeline: exact values, working gradient."""

import pytest
import torch

from phf_megatron.parallel.pipeline_stats import (pack_stats, pipeline_seq_length, split_received, stats_rows,
                                                  unpack_stats)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_values_round_trip_bit_exactly(dtype):
    values = torch.randn(3, 9) * torch.tensor([1e-30, 1e30, 1.0, 3.3, -7.0, 1e-7, 0.1, 2.0, 5.0])
    share = values[:, 0].clone().requires_grad_()
    stats = pack_stats(share, values, hidden_size=8, dtype=dtype)
    assert stats.dtype == dtype and stats.shape == (stats_rows(9, 8, dtype), 3, 8)
    got_share, got_values = unpack_stats(stats, 9)
    assert torch.equal(got_values, values) and torch.equal(got_share.detach(), values[:, 0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_one_sample_in_one_column_unpacks_from_the_received_activation(dtype):
    """micro_batch_size 1 (or a packed micro-batch of one sample): the record is one contiguous run inside the
    received activation, its float32 values at an odd 16-bit offset; they still decode bit-exactly (viewing them
    in place as float32 was a RuntimeError on every stage after the first in bf16/fp16)."""
    values = torch.randn(1, 5)
    stats = pack_stats(values[:, 0].clone(), values, hidden_size=16, dtype=dtype, columns=1)
    received = torch.cat([torch.randn(5, 1, 16, dtype=dtype), stats])
    _, rows = split_received(received, 5, stats.shape[0])
    got_share, got_values = unpack_stats(rows, 5, samples=1)
    assert torch.equal(got_values, values) and torch.equal(got_share, values[:, 0])


def _share_grad_through_the_pipeline(dtype, weights):
    """dL/dshare on the sending stage for ``L = sum_b weights[b] * share_b`` on the receiving one."""
    values = torch.randn(len(weights), 3)
    share = values[:, 0].clone().requires_grad_()
    stats = pack_stats(share, values, hidden_size=16, dtype=dtype)
    # What the pipeline does: the stats rows travel with the activation, the next stage unpacks.
    received = torch.cat([torch.randn(5, len(weights), 16, dtype=dtype), stats]).detach().requires_grad_()
    _, rows = split_received(received, 5, stats.shape[0])
    got_share, _ = unpack_stats(rows, 3)
    (got_share * weights).sum().backward()
    (share_grad,) = torch.autograd.grad(stats, share, received.grad[5:])
    return share_grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gradient_reaches_the_share_through_the_carrier(dtype):
    weights = torch.tensor([0.5, -1.0, 2.0, 0.25])
    assert torch.equal(_share_grad_through_the_pipeline(dtype, weights), weights)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_gradient_reaches_earlier_stages_in_float32(dtype):
    """dL/dshare is alpha * N_tok / N_flow (per-token loss): not a power of two. Through the 16-bit
    activation it arrives as float32, not rounded to the pipeline dtype (one bf16 carrier gave 47.0
    for 46.875 and 16.625 for 16.67: up to 2^-8 off, on every stage but the last)."""
    small = -1e-3 / 7 if dtype == torch.bfloat16 else -7 / 3  # float16's parts of a float32 need |g| >= 0.5
    weights = torch.tensor([0.05 * 30000 / 32, 0.05 * 1000 / 3, small, 12345.678])
    assert torch.equal(_share_grad_through_the_pipeline(dtype, weights), weights)


def test_rows_and_seq_length():
    assert stats_rows(10, 64, torch.float32) == 1 and stats_rows(10, 64, torch.bfloat16) == 1
    assert stats_rows(40, 64, torch.bfloat16) == 2  # 3 + 80 elements
    assert pipeline_seq_length(16, 1, tp_size=2, sequence_parallel=True) == 18
    assert pipeline_seq_length(16, 1, tp_size=2, sequence_parallel=False) == 17


def test_received_tensor_without_stats_rows_is_a_clear_error():
    with pytest.raises(ValueError, match="pipeline_seq_length"):
        split_received(torch.zeros(8, 2, 4), 8, 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_packed_column_carries_every_samples_record(dtype):
    """Packed: 5 samples' records back to back in one activation column, at the step's (larger) row count."""
    values = torch.randn(5, 7)
    share = values[:, 0].clone().requires_grad_()
    need = stats_rows(7, 8, dtype, samples=5, columns=1)
    assert need == -(-5 * ((3 + 2 * 7) if dtype == torch.bfloat16 else (1 + 7)) // 8)  # carrier + float32 values
    stats = pack_stats(share, values, hidden_size=8, dtype=dtype, columns=1, rows=need + 1)
    assert stats.shape == (need + 1, 1, 8)
    got_share, got_values = unpack_stats(stats, 7, samples=5)
    assert torch.equal(got_values, values) and torch.equal(got_share.detach(), values[:, 0])
    weights = torch.tensor([0.5, -1.0, 2.0, 0.25, 4.0])
    (share_grad,) = torch.autograd.grad((got_share * weights).sum(), share)
    assert torch.equal(share_grad, weights)
    with pytest.raises(ValueError, match=r"^rows: 1 stats rows cannot hold 5 records of 7 values"):
        pack_stats(share, values, hidden_size=8, dtype=dtype, columns=1, rows=1)
