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


class SharedTally:
    """A data-parallel worker's bar: the samples and tokens its engine told, summed in ``tally[2 * rank]`` and
    ``tally[2 * rank + 1]`` (a ``multiprocessing.Array``) for the parent's ``ShardProgress``."""

    def __init__(self, tally, rank: int):
        self._tally, self._at = tally, 2 * rank

    def update(self, samples: int, tokens: int) -> None:
        with self._tally.get_lock():
            self._tally[self._at] += samples
            self._tally[self._at + 1] += tokens

    def close(self) -> None:
        pass


class ShardProgress(SampleProgress):
    """The parent's bar in data-parallel mode: per worker, the samples its engine told so far (``tally``, a
    ``SharedTally``'s array: they move as samples finish) or, where more, those read from its shard (tailed
    for new records; written per ``--batch_size`` call)."""

    def __init__(self, run_dir: str, *, total: int, ranks: Iterable[int], done: int = 0, tally=None):
        super().__init__(total, done=done)
        self._ranks = list(ranks)
        self._paths = [shard_path(run_dir, r) for r in self._ranks]
        # past the samples written before; not past a torn last line (a kill), which the worker cuts as it starts
        self._offsets = {p: complete_size(p) for p in self._paths}
        self._tally = tally
        self._written = {r: [0, 0] for r in self._ranks}
        self._shown = {r: [0, 0] for r in self._ranks}

    def poll(self) -> None:
        for rank, path in zip(self._ranks, self._paths):
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                f.seek(self._offsets[path])
                data = f.read()
            complete = data[:data.rfind(b"\n") + 1]
            self._offsets[path] += len(complete)
            for line in complete.splitlines():
                if line.strip():
                    self._written[rank][0] += 1
                    self._written[rank][1] += int(json.loads(line).get("completion_tokens", 0))
        samples = tokens = 0
        for rank in self._ranks:
            told = self._tally[2 * rank:2 * rank + 2] if self._tally is not None else [0, 0]
            now = [max(w, t) for w, t in zip(self._written[rank], told)]
            samples += now[0] - self._shown[rank][0]
            tokens += now[1] - self._shown[rank][1]
            self._shown[rank] = now
        if samples or tokens:
            self.update(samples, tokens)
