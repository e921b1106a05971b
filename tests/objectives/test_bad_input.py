"""Bad input fails loudly with a ValueError that names the argument."""

import pytest
import torch

from phf_megatron.objectives import hidden_flow_loss, opsd_loss, select_window


def test_flow_shape_mismatch_names_teacher():
    with pytest.raises(ValueError, match="teacher"):
        hidden_flow_loss(torch.randn(2, 2, 4, 3), torch.randn(2, 2, 5, 3))


def test_flow_wrong_rank_names_student():
    with pytest.raises(ValueError, match="student"):
        hidden_flow_loss(torch.randn(2, 4, 3), torch.randn(2, 4, 3))


def test_flow_non_prefix_mask_names_valid():
    valid = torch.tensor([[True, False, True, True]])
    with pytest.raises(ValueError, match="valid"):
        hidden_flow_loss(torch.randn(2, 1, 4, 3), torch.randn(2, 1, 4, 3), valid)


def test_flow_mask_shape_names_valid():
    with pytest.raises(ValueError, match="valid"):
        hidden_flow_loss(torch.randn(2, 1, 4, 3), torch.randn(2, 1, 4, 3), torch.ones(1, 5, dtype=torch.bool))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_flow_non_finite_names_the_tensor(bad):
    s, t = torch.randn(2, 1, 4, 3), torch.randn(2, 1, 4, 3)
    s[1, 0, 2, 1] = bad
    with pytest.raises(ValueError, match="student"):
        hidden_flow_loss(s, t)
    with pytest.raises(ValueError, match="teacher"):
        hidden_flow_loss(t, s)


def test_flow_bad_variant_and_layers():
    s = torch.randn(3, 1, 4, 2)
    with pytest.raises(ValueError, match="variant"):
        hidden_flow_loss(s, s, variant="cka")
    with pytest.raises(ValueError, match="layers"):
        hidden_flow_loss(s, s, layers=[0, 7])
    with pytest.raises(ValueError, match="layers"):
        hidden_flow_loss(s, s, variant="phf", layers=[0, 2])  # no neighbouring pair


def test_jsd_bad_inputs_name_the_argument():
    s, t = torch.randn(1, 3, 5), torch.randn(1, 3, 5)
    mask = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="teacher_logits"):
        opsd_loss(s, torch.randn(1, 3, 6), mask)
    with pytest.raises(ValueError, match="mask"):
        opsd_loss(s, t, torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="beta"):
        opsd_loss(s, t, mask, beta=-0.1)
    s[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="student_logits"):
        opsd_loss(s, t, mask)


def test_window_rejects_non_bool():
    with pytest.raises(ValueError, match="generated"):
        select_window(torch.ones(1, 4))
