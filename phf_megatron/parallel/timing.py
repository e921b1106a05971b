"""Optional device-time breakdown of the PHF-only work: where a PHF step spends more than OPSD.

Off by default: ``region(name)`` is then a shared null context (one global read per call).
``RegionTimer`` (a context manager) switches it on for the steps run inside it and records a
pair of CUDA events around each region (``time.perf_counter`` on CPU). After the device
synchronizes, ``totals_ms()`` sums the elapsed time per name. Regions, as the code names them:

* ``capture``: the window-row gathers of the layer outputs (teacher and student forward);
* ``capture_bwd``: adding the flow gradient into the layer-output gradients (student backward);
* ``flow_fwd`` / ``flow_bwd``: the stage's flow terms and their gradient w.r.t. the rows;
* ``jsd_fwd`` / ``jsd_bwd``: the vocabulary-parallel JSD (both step kinds);
* ``token_logprob_fwd`` / ``token_logprob_bwd``: the sampled-token loss's log-probabilities
  (``objective.use_tinker_loss``, instead of the JSD);
* ``teacher_rows``: picking the teacher's scored logit rows (both step kinds).

Event pairs measure device time between two points of the stream: a region whose kernels
wait on the host (launch-bound) shows the gaps too, which is what a step pays for it.
"""

from __future__ import annotations

import collections
import contextlib
import time

import torch

_ACTIVE: "RegionTimer | None" = None
_NULL = contextlib.nullcontext()


class RegionTimer:
    """Collects the regions of the steps run while it is entered."""

    def __init__(self, cuda: bool | None = None):
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self._marks: dict[str, list] = collections.defaultdict(list)

    def __enter__(self) -> "RegionTimer":
        global _ACTIVE
        _ACTIVE = self
        return self

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        _ACTIVE = None

    @contextlib.contextmanager
    def _record(self, name: str):
        if self.cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            stop.record()
        else:
            start = time.perf_counter()
            yield
            stop = time.perf_counter()
        self._marks[name].append((start, stop))

    def totals_ms(self) -> dict[str, float]:
        """Milliseconds per region, summed over its occurrences (synchronizes the device first)."""
        if self.cuda:
            torch.cuda.synchronize()
        return {name: sum(a.elapsed_time(b) if self.cuda else 1e3 * (b - a) for a, b in marks)
                for name, marks in self._marks.items()}

    def counts(self) -> dict[str, int]:
        return {name: len(marks) for name, marks in self._marks.items()}


def region(name: str):
    """A context that times ``name`` while a ``RegionTimer`` is active, else does nothing."""
    return _NULL if _ACTIVE is None else _ACTIVE._record(name)
