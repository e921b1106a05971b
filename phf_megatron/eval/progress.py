"""Progress bars for the evaluator: samples/s (tqdm's rate) and generated tokens/s (postfix)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable

from ..startup import progress_bar
from .records import complete_size, shard_path


class SampleProgress:
    """A bar over samples whose postfix shows generated tokens per second."""

    def __init__(self, total: int, *, done: int = 0, enabled: bool = True, desc: str = "eval"):
        """``total``: every sample of the run; ``done``: those a resume found written already."""
        self._bar = progress_bar(total=total, initial=done, unit="sample", desc=desc, enabled=enabled)
        self._tokens = 0
        self._t0 = time.perf_counter()

    def update(self, samples: int, tokens: int) -> None:
        self._tokens += tokens
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        self._bar.set_postfix_str(f"{self._tokens / elapsed:,.0f} tok/s", refresh=False)
        self._bar.update(samples)   # (the last samples: close() draws the full bar, once)

    def close(self) -> None:
        self._bar.close()


class ShardProgress(SampleProgress):
    """The parent's bar in data-parallel mode: tails the workers' shards for new records."""

    def __init__(self, run_dir: str, *, total: int, ranks: Iterable[int], done: int = 0):
        super().__init__(total, done=done)
        self._paths = [shard_path(run_dir, r) for r in ranks]
        # past the samples written before; not past a torn last line (a kill), which the worker cuts as it starts
        self._offsets = {p: complete_size(p) for p in self._paths}

    def poll(self) -> None:
        samples = tokens = 0
        for path in self._paths:
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                f.seek(self._offsets[path])
                data = f.read()
            complete = data[:data.rfind(b"\n") + 1]
            self._offsets[path] += len(complete)
            for line in complete.splitlines():
                if line.strip():
                    samples += 1
                    tokens += int(json.loads(line).get("completion_tokens", 0))
        if samples:
            self.update(samples, tokens)
