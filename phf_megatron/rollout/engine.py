"""The rollout engine interface: token ids in, completions out; weights pushed by HF name.

    engine = build_engine(EngineConfig(model_dir="/models/Qwen3-1.7B"))   # vLLM if installed
    outs = engine.generate([[151644, 872, ...]], SamplingParams(n=4, temperature=1.0))
    engine.generate(prompts, params, on_done=lambda samples, tokens: ...)   # told as completions finish
    outs[0][3].token_ids, outs[0][3].logprobs, outs[0][3].finish_reason
    engine.update_weights(hf_named_tensor_stream)     # or rollout.sync.sync_weights(...)
    engine.score(prompt_ids, completion_ids)           # raw logprobs of completion tokens
    engine.sleep(); engine.wake(); engine.close()

Subclasses implement the ``_``-prefixed hooks; this class owns state (weight version,
unusable-after-failure), validation, bucketing and timeouts, so every backend fails the same
way. Calls are serialized by a lock: no generate overlaps a weight update.
"""

from __future__ import annotations

import abc
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from .errors import EngineUnusableError, GenerationTimeoutError, RolloutEngineError, WeightSyncError
from .types import Completion, SamplingParams, normalize_requests
from .weights import QWEN3_PACKED_MODULES, WeightSpec, iter_buckets


@dataclass
class UpdateStats:
    """What one update_weights call pushed."""

    tensors: int
    bytes: int
    buckets: int
    seconds: float
    weight_version: int


#: How long ``close`` waits for an abandoned call once ``_abandon`` has stopped what it waited on.
ABANDON_WAIT_S = 10.0


class RolloutEngine(abc.ABC):
    """Base class of the rollout backends (see the module docstring)."""

    #: A weight update's loads go to another process (a spawned engine) that may hang: each is given
    #: up after ``timeout_s``. False: they run in this process (nothing to give up on), or carry
    #: timeouts of their own (HTTP requests).
    timed_loads: bool = False

    #: fused parameter groups loaded as a whole (see weights.iter_buckets). vLLM needs this;
    #: the fallback keeps the same rule so a trainer bug shows up on either backend.
    packed_modules: dict[str, tuple[str, ...]] = QWEN3_PACKED_MODULES

    def __init__(self, spec: WeightSpec, *, bucket_bytes: int, timeout_s: float | None):
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0 or None, got {timeout_s}")
        self.spec = spec
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.weight_version = 0
        """bumped by every successful update_weights; tag rollouts with it."""
        self._broken: str | None = None
        """why the engine is unusable for good (closed, timed out)."""
        self._stale: str | None = None
        """why generate() is refused until an update succeeds (a sync failed half-way)."""
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._inflight: concurrent.futures.Future | None = None

    # ----------------------------------------------------------------- public API
    def generate(self, prompt_token_ids: Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams], *,
                 timeout_s: float | None = None,
                 on_done: Callable[[int, int], None] | None = None) -> list[list[Completion]]:
        """Sample ``params.n`` completions for each prompt.

        Args:
            prompt_token_ids: B prompts, each a non-empty list of token ids.
            params: one SamplingParams for all prompts, or one per prompt.
            timeout_s: overrides the engine's timeout for this call (None = engine default).
            on_done: called ``(completions, tokens)`` as completions finish (a progress bar), one call at a time:
                vLLM per finished request, transformers per batch, a server per response; whatever the backend
                did not tell during the call comes in one call before this returns, so the calls sum to the
                completions returned and their tokens.
        Returns:
            B lists; list i holds the n completions of prompt i, in order.
        Raises:
            GenerationTimeoutError: no result within the timeout (the engine becomes unusable).
        """
        prompts = [list(p) for p in prompt_token_ids]
        per_prompt = normalize_requests(prompts, params)
        if self._stale is not None:
            raise EngineUnusableError(f"{type(self).__name__} refuses to generate: {self._stale}")
        if not prompts:
            return []
        told = _Told(on_done) if on_done is not None else None
        try:
            outs = self._guarded("generate", timeout_s, self._generate, prompts, per_prompt, told)
            self._check_completions(outs, per_prompt)
        finally:
            if told is not None:
                told.stop()   # an abandoned call (a timeout) tells nothing more
        if told is not None:
            told.rest(outs)
        return outs

    def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], *,
              timeout_s: float | None = None) -> list[float]:
        """Raw log-probability of each completion token given the prompt and earlier tokens
        (float32 values; len == len(completion_ids))."""
        prompt, completion = list(prompt_ids), list(completion_ids)
        normalize_requests([prompt, completion], SamplingParams())
        return self._guarded("score", timeout_s, self._score, prompt, completion)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *,
                       bucket_bytes: int | None = None) -> UpdateStats:
        """Push HF-named tensors into the running engine, bucket by bucket, in stream order.

        Each bucket is validated (names, shapes, complete fused groups) before it is pushed and
        loaded before the next one is drawn from ``named_tensors``, so a producer that gathers
        tensor by tensor holds at most about one bucket. A subset of the model's tensors is a
        valid (partial) update. A failure after the first bucket went in makes generate() refuse
        until a later update succeeds (it would otherwise sample from a mix of versions);
        score() still works.
        """
        self._check_usable()
        with self._lock:
            t0 = time.perf_counter()
            n_tensors = n_bytes = n_buckets = 0
            try:
                for bucket in iter_buckets(named_tensors, self.spec, packed=self.packed_modules,
                                           bucket_bytes=bucket_bytes or self.bucket_bytes):
                    # the stream (the trainer's gathers) runs here; a load in another process within the timeout
                    self._timed("update_weights", self.timeout_s if self.timed_loads else None, self._load_bucket,
                                bucket)
                    n_buckets += 1
                    n_tensors += len(bucket)
                    n_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
                if n_buckets:
                    self._timed("update_weights", self.timeout_s if self.timed_loads else None, self._after_update)
            except BaseException as exc:
                if n_buckets:
                    self._stale = (f"a weight update failed after {n_tensors} tensors went in "
                                      f"({type(exc).__name__}: {exc}); push a full update before generating")
                    if self._broken is None:   # not after a timeout: the engine may still hang
                        self._after_update()
                if isinstance(exc, RolloutEngineError) or not isinstance(exc, Exception):
                    raise
                raise WeightSyncError(f"weight update failed: {type(exc).__name__}: {exc}") from exc
            self._stale = None
            self.weight_version += 1
            return UpdateStats(n_tensors, n_bytes, n_buckets, time.perf_counter() - t0, self.weight_version)

    def fingerprints(self, names: Sequence[str], projections: int, seed: int = 0) -> dict[str, list[float] | None]:
        """Fingerprints (``fingerprint.tensor_fingerprint``) of the named tensors as the engine holds them
        (None for a tensor the backend cannot read back)."""
        self._check_usable()
        with self._lock:
            return self._fingerprints(list(names), projections, seed)

    def sleep(self) -> None:
        """Free accelerator memory (weights offloaded, KV cache dropped) while the trainer runs.
        A no-op where the backend cannot (vLLM on CPU, the transformers fallback)."""
        self._check_usable()
        with self._lock:
            self._sleep()

    def wake(self) -> None:
        """Undo sleep(); the weights are those of the last update."""
        self._check_usable()
        with self._lock:
            self._wake()

    def close(self, wait_s: float = 60.0) -> None:
        """Release the engine; later calls raise EngineUnusableError.

        After a timeout the abandoned call may still be running in its thread: close waits up to
        ``wait_s`` for it before tearing the backend down (vLLM keeps process-global state that
        must not be destroyed under a running step). If it is still running then, ``_abandon``
        stops what it waits on (a spawned vLLM engine is killed), since Python joins the pool's
        thread at exit: a hung engine kept the trainer alive forever after its checkpoint. If
        even that leaves it running, the backend is left as is.
        """
        if self._broken == "closed":
            return
        self._broken = "closed"
        self._cancel.set()
        if self._inflight is not None and not self._inflight.done():
            concurrent.futures.wait([self._inflight], timeout=wait_s)
            if not self._inflight.done():
                self._abandon()   # its thread must end: the process exits only once every pool thread has
                concurrent.futures.wait([self._inflight], timeout=ABANDON_WAIT_S)
                if not self._inflight.done():
                    return
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- hooks
    @abc.abstractmethod
    def _generate(self, prompts: list[list[int]], params: list[SamplingParams],
                  on_done: Callable[[int, int], None] | None) -> list[list[Completion]]:
        """``on_done(completions, tokens)`` (None: nobody asked) as completions finish, from any thread."""

    @abc.abstractmethod
    def _score(self, prompt: list[int], completion: list[int]) -> list[float]:
        ...

    @abc.abstractmethod
    def _load_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """Copy a validated bucket (complete fused groups) into the live model."""

    def _after_update(self) -> None:
        """Drop state derived from the old weights (prefix/KV caches)."""

    def _fingerprints(self, names: list[str], projections: int, seed: int) -> dict[str, list[float] | None]:
        return {name: None for name in names}   # a backend that cannot read its weights back

    def _sleep(self) -> None:
        pass

    def _wake(self) -> None:
        pass

    def _close(self) -> None:
        pass

    def _abandon(self) -> None:
        """The call in flight outlived ``close``'s wait: make it return (the transformers fallback stops
        at its next step on ``_cancel``; nothing to do by default)."""

    # ----------------------------------------------------------------- plumbing
    def _check_completions(self, outs: list[list[Completion]], params: list[SamplingParams]) -> None:
        """``n`` completions per prompt, each of at least one token (an engine samples one at least, ``max_tokens``
        >= 1): a broken engine or server that answered with none raises instead of training on nothing."""
        engine = type(self).__name__
        if len(outs) != len(params):
            raise RolloutEngineError(f"{engine} returned completions for {len(outs)} of {len(params)} prompts")
        for i, (comps, p) in enumerate(zip(outs, params)):
            if len(comps) != p.n:
                raise RolloutEngineError(f"{engine} returned {len(comps)} completions for prompt {i}, asked for {p.n}")
            if any(not c.token_ids for c in comps):
                raise RolloutEngineError(f"{engine} returned an empty completion (no token, not even an end-of-text) "
                                         f"for prompt {i} of {len(params)}: the engine is broken; restart it")

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise EngineUnusableError(f"{type(self).__name__} is unusable: {self._broken}")

    def _guarded(self, what: str, timeout_s: float | None, fn, *args):
        """Run ``fn`` under the lock; with a timeout, in a worker thread that we stop waiting for."""
        self._check_usable()
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        if timeout_s is None:
            with self._lock:
                return fn(*args)
        if not self._lock.acquire(timeout=timeout_s):
            raise GenerationTimeoutError(f"{what}: the engine stayed busy for {timeout_s:.3g} s")
        try:
            return self._timed(what, timeout_s, fn, *args)
        finally:
            self._lock.release()

    def _timed(self, what: str, timeout_s: float | None, fn, *args):
        """``fn(*args)`` (the lock held), given up after ``timeout_s`` in a worker thread; the engine
        is then unusable (the call may still run: ``close`` ends it)."""
        if timeout_s is None:
            return fn(*args)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout")
        device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

        def on_callers_device():   # a thread starts on device 0: a rank's engine work stays on its own GPU
            if device is not None:
                torch.cuda.set_device(device)
            return fn(*args)

        future = self._inflight = self._pool.submit(on_callers_device)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            self._broken = f"{what} timed out after {timeout_s:.3g} s"
            self._cancel.set()   # backends that loop in Python stop at their next step
            raise GenerationTimeoutError(
                f"{type(self).__name__}.{what} did not finish within {timeout_s:.3g} s; the engine "
                "is now unusable (save a checkpoint and restart)") from None


class _Told:
    """A caller's ``on_done``: one call at a time, nothing after ``stop``, and counted, so that ``rest`` tells
    what the backend did not."""

    def __init__(self, on_done: Callable[[int, int], None]):
        self._on_done = on_done
        self._lock = threading.Lock()
        self._open = True
        self.completions = self.tokens = 0

    def __call__(self, completions: int, tokens: int) -> None:
        with self._lock:
            if self._open and (completions or tokens):
                self.completions += completions
                self.tokens += tokens
                self._on_done(completions, tokens)

    def stop(self) -> None:
        with self._lock:
            self._open = False

    def rest(self, outs: list[list[Completion]]) -> None:
        completions = sum(map(len, outs)) - self.completions
        tokens = sum(len(c.token_ids) for comps in outs for c in comps) - self.tokens
        if completions or tokens:
            self._on_done(completions, tokens)
