"""vLLM's progress bar as a callback: ``LLM.generate(..., use_tqdm=finished_requests(on_done))``.

``use_tqdm`` takes a callable that makes the bar (vLLM 0.24 and 0.32: ``_run_engine`` calls it with
``total=``, then per finished request sets ``postfix`` to the output tokens so far over
``format_dict["elapsed"]`` and calls ``update(completions)``; ``maybe_tqdm`` calls it with the prompts to
iterate over, "Rendering prompts"). With an elapsed time of 1 s the postfix holds the token count itself.
A vLLM that words it otherwise: the tokens are told with 0 here, and ``RolloutEngine.generate`` tells them
all at the end of the call.
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: vLLM's postfix, "est. speed input: {:.2f} toks/s, output: {:.2f} toks/s".
_OUTPUT_TOKENS = re.compile(r"output: ([0-9]+(?:\.[0-9]*)?) toks/s")


class FinishedRequests:
    """The bar ``_run_engine`` updates: tells ``on_done(completions, tokens)`` per finished request."""

    def __init__(self, on_done: Callable[[int, int], None]):
        self._on_done = on_done
        self._tokens = 0
        self.n = 0
        self.postfix = ""
        self.format_dict = {"elapsed": 1.0}   # the postfix's rate is then its count

    def update(self, n: int = 1) -> None:
        self.n += n
        match = _OUTPUT_TOKENS.search(str(self.postfix))
        tokens = round(float(match.group(1))) if match else self._tokens
        self._on_done(n, tokens - self._tokens)
        self._tokens = tokens

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


def finished_requests(on_done: Callable[[int, int], None]):
    """What ``LLM.generate``'s ``use_tqdm`` takes: the prompts it iterates over pass through untouched."""
    def make(iterable=None, *args, **kwargs):
        return iterable if iterable is not None else FinishedRequests(on_done)
    return make
