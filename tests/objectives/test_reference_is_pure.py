"""The float64 reference never dispatches to a kernel: ``objectives.hidden_flow_loss`` runs the
terms function it is given (its own ``flow_terms`` by default), and only ``phf_megatron.kernels``
chooses the fused CUDA kernels.

* CPU: the signature has no backend switch and its default terms function is the reference; a
  whole evaluation in a fresh interpreter never even imports ``phf_megatron.kernels``; a terms
  function passed in is the one that runs.
* CUDA (skipped without): on CUDA float32 inputs (what the kernels accept) with every way into
  the kernels made to raise, the reference evaluates, and equals the float64 result on CPU.
"""

import inspect
import os
import subprocess
import sys

import pytest
import torch

from phf_megatron.objectives import flow, hidden_flow_loss
from phf_megatron.runtime.process_group import standalone_environ

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_signature_gives_no_path_to_a_kernel():
    params = inspect.signature(hidden_flow_loss).parameters
    assert "backend" not in params
    assert params["terms"].default is flow.flow_terms


def test_an_evaluation_never_imports_the_kernels():
    code = ("import sys, torch\n"
            "from phf_megatron.objectives import hidden_flow_loss\n"
            "s, t = torch.randn(3, 2, 6, 5, dtype=torch.float64), torch.randn(3, 2, 6, 5, dtype=torch.float64)\n"
            "for variant in ('phf', 'local', 'direction', 'geometry', 'pointwise_mse'):\n"
            "    hidden_flow_loss(s.requires_grad_(), t, variant=variant).backward()\n"
            "print(sorted(m for m in sys.modules if m.startswith('phf_megatron.kernels')))\n")
    env = {**standalone_environ(), "PYTHONPATH": os.path.abspath(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout


def test_the_given_terms_function_is_the_one_that_runs():
    s, t = torch.randn(3, 2, 6, 5, dtype=torch.float64), torch.randn(3, 2, 6, 5, dtype=torch.float64)
    calls = []

    def terms(*args):
        calls.append(args[3])  # the plan
        return flow.flow_terms(*args)

    assert hidden_flow_loss(s, t, terms=terms) == hidden_flow_loss(s, t)
    assert len(calls) == 1 and calls[0].layers == (0, 1, 2) and calls[0].pairs == ((0, 1), (1, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["phf", "local", "direction", "geometry"])
def test_cuda_float32_inputs_run_the_reference(variant, monkeypatch):
    from phf_megatron import kernels
    from phf_megatron.kernels import dispatch, flow_cuda

    def refuse(*args, **kwargs):
        raise AssertionError("the reference reached the kernels")

    for module, name in ((flow_cuda, "flow_terms_cuda"), (dispatch, "flow_backend"), (dispatch, "_decided_terms"),
                         (kernels.loader, "load_extension"), (kernels.loader, "require")):
        monkeypatch.setattr(module, name, refuse)
    s = torch.randn(4, 3, 64, 96, device="cuda")
    t = torch.randn(4, 3, 64, 96, device="cuda")
    valid = torch.arange(64, device="cuda")[None] < torch.tensor([64, 40, 2], device="cuda")[:, None]
    got = hidden_flow_loss(s, t, valid, variant=variant)
    ref = hidden_flow_loss(s.double().cpu(), t.double().cpu(), valid.cpu(), variant=variant)
    assert got.dtype == torch.float32 and got.is_cuda
    assert abs(float(got) - float(ref)) <= 1e-4 * abs(float(ref)), (float(got), float(ref))  # float32 sums
