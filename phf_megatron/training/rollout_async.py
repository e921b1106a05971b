"""One-step off-policy rollouts (``rollout.async_steps = 1``): the engines sample step k+1 while the trainer runs step k.

Step k, on every rank (only the engines' hosts touch an engine):

1. its samples: prefetched during step k-1 (or restored from the checkpoint after a resume),
   else sampled now (the run's first step); ``RolloutDriver.share`` distributes them at the
   step's start, on the main thread, like every collective;
2. each host hands step k+1's requests to a background thread (engine calls only, no
   collective): they are sampled by the weights of version k, synced after step k-1;
3. the update of step k runs meanwhile;
4. before the sync each host waits for its prefetch (``settle``), so a weight push never races a
   generate and the prefetch always saw version k; then version k+1 is pushed and verified.

So the rollouts of a step come from the weights one update behind the trainer's (logged as
``rollout_staleness``: 1, and 0 on the first step), as in verl's one-step-off-policy trainer and
NeMo-RL's async GRPO with ``max_trajectory_age_steps = 1``. The overlap needs the engine awake
while the trainer steps, on devices or CPU time of its own: not with ``rollout.enable_sleep_mode``
(``rollout.config``), and a vLLM engine runs in a process of its own even in a world of one.

Sampler: step k+1's rows are read from a copy of the sampler; the sampler itself advances only
when a step's update is done (``training.loop``), so a checkpoint's data position is exact.

Checkpoints: one saved after step k holds step k+1's prefetched samples (the last step of a run
prefetches too, so a run resumed with a larger ``training.train_iters`` is exact), every group's, gathered
at save time (part ``rollout_prefetch``, written by rank 0, read by every rank), so a resumed run
trains step k+1 on exactly the samples the uninterrupted run would have used, and equals it.
If an engine's prefetch failed (the run stopped on a ``RolloutFailure``) the part is empty and
the resumed run samples step k+1 afresh from the resumed weights (staleness 0 for that step),
then overlaps again. Samples are stored by prompt and sample index, so a run may resume with
another number of engines.
"""

from __future__ import annotations

import concurrent.futures

from .checkpoint_parts import Part, Scope
from .rollouts import RolloutDriver, StepRequests, StepSamples

#: checkpoint part name of the prefetched samples
PART = "rollout_prefetch"


class RolloutPrefetch:
    """The hosts' background sampling of the next step, and its place in checkpoints."""

    def __init__(self, driver: RolloutDriver, timeout_s: float):
        self.driver = driver
        self._pool = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout-prefetch")
                      if driver.is_host else None)
        self._pending: tuple[int, concurrent.futures.Future | None] | None = None
        """(step, the host's future; None off the hosts) of the prefetch in flight or done."""
        self._restored: dict | None = None
        """every group's samples of one step, from a checkpoint."""
        self._saved: dict | None = None
        self.wait_s = 2 * timeout_s + 60.0
        """bound on waiting for a prefetch (the engine's own timeout fires first)."""

    def rollouts(self, requests: StepRequests, following: StepRequests | None) -> StepSamples:
        """This group's samples of ``requests.step`` (collective), then the prefetch of ``following``
        (None: nothing to prefetch)."""
        step = requests.step
        restored = self._restored_at(step)
        if restored is not None:
            samples = self._from_restored(restored, len(requests.prompts))
        elif self._pending is not None and self._pending[0] == step:
            samples = self.driver.share(self._result(), step)
        else:
            samples = self.driver.generate(requests)
        self._restored = self._pending = None
        if following is not None:
            future = self._pool.submit(self.driver.sample, following) if self._pool is not None else None
            self._pending = (following.step, future)
        return samples

    def _result(self) -> StepSamples | BaseException | None:
        """The host's prefetched samples, or the exception that ended the prefetch (None off the hosts)."""
        future = self._pending[1]
        if future is None:
            return None
        try:
            return future.result(timeout=self.wait_s)
        except concurrent.futures.TimeoutError:
            return TimeoutError(f"the prefetch did not finish within {self.wait_s:.0f} s")
        except Exception as err:  # noqa: BLE001 - reported to every rank by share()
            return err

    def settle(self) -> None:
        """Wait (bounded) until the host's prefetch is done, so the next weight push cannot race it."""
        if self._pending is not None and self._pending[1] is not None:
            concurrent.futures.wait([self._pending[1]], timeout=self.wait_s)

    def _restored_at(self, step: int) -> dict | None:
        """The checkpoint's samples if they are those of ``step``, else None."""
        return self._restored if self._restored is not None and self._restored["step"] == step else None

    def _from_restored(self, saved: dict, num_prompts: int) -> StepSamples:
        n = self.driver.cfg.rollout.n
        rows = self.driver.groups.prompts(self.driver.engine_index, num_prompts)
        return StepSamples(saved["step"], saved["policy_version"],
                           completions={i: c for i, c in saved["completions"].items() if i // n in rows},
                           analyses={i: a for i, a in saved["analyses"].items() if i in rows})

    # ----------------------------------------------------------------- checkpoints

    def prepare_checkpoint(self, step: int) -> None:
        """Collective, before a save at ``step`` (steps done): gather every host's finished prefetch of
        that step into what the part saves (None unless every engine has one)."""
        restored, local = self._restored_at(step), None
        if restored is None and self.driver.is_host and self._pending is not None and self._pending[0] == step:
            self.settle()
            result = self._result()
            if isinstance(result, StepSamples):
                local = dict(step=result.step, policy_version=result.policy_version,
                             completions=result.completions, analyses=result.analyses)
        gathered = self.driver.gather((self.driver.is_host, local))  # every rank takes part, restored or not
        hosts = [s for is_host, s in gathered if is_host]
        if restored is not None:
            self._saved = restored
        elif hosts and all(s is not None for s in hosts):
            self._saved = dict(step=step, policy_version=hosts[0]["policy_version"],
                               completions={i: c for s in hosts for i, c in s["completions"].items()},
                               analyses={i: a for s in hosts for i, a in s["analyses"].items()})
        else:
            self._saved = None

    def part(self) -> Part:
        """The checkpoint part (``PART``): the gathered prefetch, or None."""
        return Part(Scope.GLOBAL, lambda: self._saved, self._load)

    def _load(self, state: dict | None) -> None:
        self._restored = state

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
