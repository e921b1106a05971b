"""The training loop (``python -m phf_megatron.train``): OPSD + PHF, or a baseline (``--method``, ``methods``).

Each step: the step's prompts from the dataset (deterministic, identical on every rank:
``step_plan``) → [``data.reason_first``: the teacher's analyses from the engines, then the teacher
prompts] → rollouts from the engines (each group's engine samples its ranks' prompts and sends
them to its ranks only: ``rollouts``; with ``rollout.async_steps`` = 1 they were sampled during the
previous step: ``rollout_async``; with ``rollout.lmbda`` < 1 the off-policy micro-batches take the
rows' solutions instead, ``policy_mix``) → this rank's micro-batches → one update of the method
(``update.run_update``; SFT: no engines, the rows' solutions, no teacher) → the sampler advances → weight sync into every engine → metrics, layer
energy, the loss by rollout token (every ``logging.loss_tokens_interval`` steps), checkpoint.

Checkpoints (``trainer_checkpoint``) are atomic (``checkpoint.save_checkpoint``) and hold everything a
resumed run needs to continue exactly: adapters (or, for full fine-tuning, the model as a dist checkpoint), the
optimizer and LR schedule, the EMA teacher, the data position and every RNG (and, overlapped,
the next step's prefetched rollouts). If a rollout engine fails, a checkpoint is saved before the
error propagates at a step the weights are pushed after (``Trainer.at_push``; a failed push too: the
resumed run pushes at its start); between pushes the last checkpoint is kept (``checkpoint.save_interval``
puts it at a push) and the resume redoes the steps after it: it equals the uninterrupted run (overlapped,
but for a failed prefetch: ``rollout_async``); without ``save_interval`` the step is saved (the resume
samples the rest of the interval with its weights).

A step whose loss or gradient holds a NaN or inf on any rank changes nothing (``update``,
``nonfinite``): it is counted (``nonfinite_steps`` in the metrics, cumulative over the run, and on
the progress bar), the engines keep the weights they have (no push of unchanged weights), and
``training.max_nonfinite_steps`` consecutive ones stop the run with one line naming the step and
what was not finite. Checkpoints and exports refuse to write a non-finite tensor.
"""

from __future__ import annotations

import os
import signal
import time

import torch

from ..data import PromptConfig, load_math_dataset
from ..data.holdout import without_holdout
from ..data.sampler import EpochSampler
from ..tokenizer import eos_token_ids, load_qwen3_tokenizer
from ..config_errors import fail
from ..errors import RunStopped, UserError
from ..input_files import kept
from .batches import build_microbatches
from .checkpoint import iter_dir_name
from .checkpoint_parts import RankLayout
from .config import TrainConfig
from .config_io import save_run_config
from .diagnostics import layer_energy_metrics
from .distributed import DistributedContext, init_distributed, lost_rank
from .export import export_dir, outputs_message, write_student
from .metrics import LOSS_TOKENS, ON_POLICY_FRACTION, MetricsLogger, WandbRun
from .model_setup import StudentModel, build_student, implementations
from .nonfinite import faults_from_env, nonfinite_stop
from .rollout_async import RolloutPrefetch
from .methods import build_method
from .rollouts import RolloutFailure
from .step_plan import StepPlanner, local_rollout_record, rollout_stats, row_origins
from .stop_signal import StopSignal, ignoring
from .trainer_checkpoint import TrainerCheckpoints
from .update import run_update


def _load_dataset(cfg: TrainConfig):
    """The training set; a source that cannot be read is an error naming ``--data.path``."""
    try:
        dataset = load_math_dataset(cfg.data.path, split=cfg.data.split, skip_bad_rows=cfg.data.skip_bad_rows)
    except UserError:  # a bad row, named by file and line
        raise
    except ValueError as err:  # "source: ..." (missing file, unknown format, unloadable dataset)
        raise fail("data.path", str(err).removeprefix("source: ")) from err
    try:  # the official baselines' train_test_split: its train part
        return without_holdout(dataset, cfg.holdout_fraction, cfg.data.holdout_seed)
    except ValueError as err:
        raise fail("data.holdout_fraction", f"{cfg.holdout_fraction} (--method={cfg.method}) {err}") from err


class Trainer(TrainerCheckpoints):
    """Builds every piece of a run on this rank; ``run()`` trains to ``training.train_iters``."""

    def __init__(self, cfg: TrainConfig):
        cfg.require_inputs()
        self.cfg, self.phase = cfg, "starting"  # what the run is doing (LostRank names it)
        self.prefetch = self.rollouts = None
        try:
            self._start()
        except BaseException as err:  # a refused resume, a lost rank...: the engines stop now, not at exit
            stop = lost_rank(err, self.phase, cfg.save_dir) if isinstance(err, Exception) else None  # said first
            with ignoring(cfg.checkpoint):  # a preemption now does not take the place of ``err``
                for started in (self.prefetch, self.rollouts):  # the prefetch first: it uses the engines
                    if started is not None:
                        started.close()
            if stop is not None:
                raise stop from None
            raise

    def _start(self) -> None:
        """Builds every piece (``__init__``: the engines stop if one fails; a lost rank is one line)."""
        cfg = self.cfg
        self.ctx: DistributedContext = init_distributed(cfg)
        self._starting(f"loading the data ({cfg.data.path})")
        self.tokenizer = load_qwen3_tokenizer(cfg.model.hf_dir)
        self.dataset = _load_dataset(cfg)
        if cfg.data.max_rows:
            self.dataset.rows = self.dataset.rows[: cfg.data.max_rows]
        self.sampler = EpochSampler(len(self.dataset), seed=cfg.data.shuffle_seed, shuffle=cfg.data.shuffle)
        self.prompt_config = PromptConfig(student_enable_thinking=cfg.data.student_enable_thinking,
                                          teacher_enable_thinking=cfg.data.teacher_enable_thinking,
                                          align_generation_prompt=cfg.data.align_generation_prompt,
                                          teacher_prompt=cfg.data.teacher_prompt)
        self._starting(f"building the student from {cfg.model.pretrained_checkpoint or cfg.model.hf_dir}")
        self.student: StudentModel = build_student(cfg, len(self.dataset))
        self.method = build_method(cfg, self.student)
        self.layout = RankLayout.from_parallel_state()
        self.planner = StepPlanner(cfg, self.dataset, self.tokenizer, self.prompt_config, self.layout.dp_size,
                                   row_inputs=self.method.row_inputs)
        self.method.check_rows(self.planner)  # a row over data.max_prompt_length: named now, before any training
        self._plans = {}
        self._round = None
        """(plan, samples, completions, micro-batches) of the rollout batch in training (``method.iterations``)."""
        self.step = 0
        self.nonfinite_steps = 0
        """Steps skipped for a NaN/inf loss or gradient, over the whole run (resumes included)."""
        self.nonfinite_run = 0
        """Of them, how many in a row up to the current step."""
        self.faults = faults_from_env()  # testing only (nonfinite.ENV_VAR); none in a real run
        # The engines start first: an in-process vLLM reseeds the global RNGs, which the resume restores.
        self._starting(f"starting the rollout engines (rollout.backend={cfg.rollout.backend})")
        self.rollouts = self.method.rollout_driver(cfg, self.student, cfg.model.hf_dir, eos_token_ids(self.tokenizer))
        self.prefetch = RolloutPrefetch(self.rollouts, cfg.rollout.timeout_s) if cfg.rollout.async_steps else None
        self.resumed_from = self._maybe_resume()
        self.rollouts.sync(self.step)  # the engines start from the HF files; push the (resumed) student, verify
        self._engines_current = True  # the engines hold the student's weights (nothing to push)
        save_run_config(cfg)  # after the resume: a refused one leaves the run directory as it was
        if self.ctx.is_rank0:
            groups = self.rollouts.groups
            more = f"; {groups.describe()}" if groups.num_engines > 1 else ""
            line = implementations(cfg, self.student, self.rollouts.engine, self.method.implementations())
            print(f"phf_megatron.train: {line}{more}", flush=True)
            if self.resumed_from:
                print(f"phf_megatron.train: resuming from step {self.step} of {cfg.training.train_iters} "
                      f"({self.resumed_from})", flush=True)
        self.metrics = MetricsLogger(cfg.run_dir, cfg.training.train_iters, start_step=self.step,
                                     jsonl=cfg.logging.jsonl, tensorboard=cfg.logging.tensorboard,
                                     tensorboard_dir=cfg.logging.tensorboard_dir,
                                     progress_bar=cfg.logging.progress_bar, wandb=WandbRun.of(cfg))

    def _starting(self, what: str) -> None:
        """Rank 0 says what the start is doing (minutes at 8B, silent until its implementations line)."""
        if self.ctx.is_rank0:
            print(f"phf_megatron.train: starting: {what}", flush=True)

    # ----------------------------------------------------------------- one step

    def _plan(self, step: int):
        """The plan of ``step`` (made ahead by the overlapped mode, else now)."""
        return self._plans.pop(step, None) or self.planner.plan(step, self.sampler, step - self.step)

    def _samples(self, plan):
        """This group's samples of the step (a collective); overlapped, the next step's prefetch starts."""
        if self.prefetch is None:
            return self.rollouts.generate(plan.requests)
        # past the last step too: its checkpoint then holds the next step, and a longer resumed run is exact
        following = self._plans[self.step + 1] = self.planner.plan(self.step + 1, self.sampler, 1)
        return self.prefetch.rollouts(plan.requests, following.requests)

    def train_step(self) -> dict:
        """Rollouts and one update; the sampler advances past the step's rows (the sync follows in ``run``)."""
        from megatron.core import parallel_state as ps

        cfg = self.cfg
        t0 = time.perf_counter()
        dp_rank, dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        iteration = self.step % self.method.iterations
        if iteration == 0:  # a new rollout batch (every step, but for GRPO's grpo.num_iterations)
            plan = self._plan(self.step)
            samples = self._samples(plan)
            group = self.rollouts.groups.prompts(self.rollouts.engine_index, len(plan.rows))
            pairs, completions = self.method.training_samples(self.planner, plan, samples, group)
            sp = self.student.config.sequence_parallel
            mbs = build_microbatches(pairs, completions, pad_id=self.tokenizer.pad_token_id,
                                     micro_batch_size=cfg.training.micro_batch_size, dp_rank=dp_rank,
                                     dp_size=dp_size, pad_multiple=ps.get_tensor_model_parallel_world_size() if sp else 1,
                                     make=self.method.microbatches, max_tokens=cfg.training.max_tokens_per_microbatch,
                                     origins=row_origins(plan.rows, len(pairs)))
            self._round = (plan, samples, completions, mbs)
        elif self._round is None:
            raise RuntimeError(f"step {self.step}: iteration {iteration} of a rollout batch this run did not sample "
                               "(a checkpoint inside a batch of grpo.num_iterations steps)")
        else:
            plan, samples, completions, mbs = self._round
        t1 = time.perf_counter()
        interval = cfg.logging.loss_tokens_interval
        metrics = run_update(self.student, self.method, mbs,
                             collect_loss_tokens=bool(interval) and (self.step + 1) % interval == 0,
                             faults=tuple(f for f in self.faults if f.step == self.step + 1))
        metrics.update(self.method.step_metrics())
        if metrics["nonfinite"] is not None:
            self.nonfinite_steps += 1
            self.nonfinite_run += 1
        else:
            self.nonfinite_run = 0
        if not metrics["update_skipped"]:
            self._engines_current = False
        metrics["nonfinite_steps"] = self.nonfinite_steps
        if iteration == self.method.iterations - 1:  # the batch's last step: its rows are done
            self._round = None
            if self.sampler.take(len(plan.rows)) != plan.indices:
                raise RuntimeError(f"step {self.step}: the sampler moved while the step was planned")
        t2 = time.perf_counter()
        metrics.update(time_rollout_s=t1 - t0, time_update_s=t2 - t1, step_time=t2 - t0,
                       time_engine_s=max(self.rollouts.last_engine_s, default=None) if iteration == 0 else 0.0,
                       rollout_staleness=self.step - samples.policy_version,
                       **rollout_stats(self.rollouts.gather(local_rollout_record(completions, dp_rank, dp_size))))
        if cfg.rollout.lmbda < 1:
            metrics[ON_POLICY_FRACTION] = sum(plan.requests.on_policy) / len(plan.requests.on_policy)
        energy = torch.tensor(metrics.get("layer_flow") or [], dtype=torch.float64)
        if cfg.logging.log_layer_energy and energy.numel() and bool(energy.isfinite().all()):  # NaN: a skipped step
            metrics.update(layer_energy_metrics(energy))
        return metrics

    def at_push(self) -> bool:
        """Whether the weights are pushed after step ``self.step`` (every ``rollout.sync_interval`` steps, at a
        rollout batch's end): only there does a checkpoint resume exactly (a resumed run pushes at its start)."""
        return self.step % self.cfg.rollout.sync_interval == 0 and self.step % self.method.iterations == 0

    def sync(self, metrics: dict) -> None:
        """Push the weights of the steps done into every engine (every ``rollout.sync_interval`` steps)."""
        t0 = time.perf_counter()
        wait, pushed = 0.0, False
        if self.at_push():
            if self.prefetch is not None:  # the prefetch in flight read the version it samples with
                self.prefetch.settle()
                wait = time.perf_counter() - t0
            if self._engines_current:  # no update since the last push (skipped steps): the same weights
                self.rollouts.policy_version = self.step
            else:
                self.rollouts.sync(self.step)
                self._engines_current = pushed = True
        seconds = time.perf_counter() - t0
        report = self.rollouts.sync_metrics()
        if report and not pushed:  # no push: the last push's verification stays, its time is not this step's
            report["time_engine_sync_s"] = 0.0
        metrics.update(time_sync_s=seconds, step_time=metrics["step_time"] + seconds, **report)
        if self.prefetch is not None:
            metrics["time_prefetch_wait_s"] = wait

    # ----------------------------------------------------------------- the run

    def run(self) -> int:
        """Train to ``training.train_iters``, save and export; returns the exit code: 0, or 128 + the
        signal's number when ``checkpoint.exit_signal`` stopped the run (saved at its last step). A rank
        that is gone stops the others with ``LostRank`` (``distributed.lost_rank``), saving nothing."""
        try:
            return self._run()
        except Exception as err:  # noqa: BLE001 - re-raised unless another rank is gone (said now, before the cleanup)
            if (stop := lost_rank(err, self.phase, self.cfg.save_dir, redone=True, after=RolloutFailure)) is None:
                raise
            raise stop from None

    def _run(self) -> int:
        cfg = self.cfg
        metrics = None
        interval = cfg.checkpoint.save_interval
        stop = StopSignal(cfg.checkpoint.exit_signal) if cfg.checkpoint.exit_signal_handler else None
        try:
            while self.step < cfg.training.train_iters:
                self.phase = f"step {self.step + 1} of {cfg.training.train_iters}"
                metrics = self.train_step()
                self.step += 1  # the update is done: a failing sync below does not undo it
                self.sync(metrics)
                self._log(metrics)
                limit = cfg.training.max_nonfinite_steps
                if limit and self.nonfinite_run >= limit:
                    raise nonfinite_stop(self.step, self.nonfinite_run, metrics["nonfinite"])
                metrics = None
                if interval and self.step % interval == 0:
                    self.save()
                if stop is not None and self.step < cfg.training.train_iters and self.at_push() and stop.agreed():
                    return self._stopped(stop.name)
        except KeyboardInterrupt:  # Ctrl-C: one line (commands.run_command) saying what is kept
            raise KeyboardInterrupt(f"during step {self.step + 1} of {cfg.training.train_iters}; {self._kept()}; "
                                    "rerun the same command to resume") from None
        except RolloutFailure as err:
            if metrics is not None:
                self._log(metrics)  # the step trained; its sync failed
            pushed = self.at_push()  # without save_interval no checkpoint is at a push: saved between, not lost
            saved = pushed or (not interval and self.step % self.method.iterations == 0)
            if saved:
                self.save()  # nothing lost: the next run resumes from here
            if stop is not None and stop.agreed():  # Slurm signals every process of the job step: the engines too
                return self._stopped(stop.name, engines=str(err), redone=not saved)
            n, sync = self.step, cfg.rollout.sync_interval
            between = (f"saved at step {n}, between weight pushes (rollout.sync_interval = {sync}, checkpoint."
                       f"save_interval = 0): the resumed run samples the steps to the next push with step {n}'s "
                       f"weights, not step {n - n % sync}'s as this run did" if saved else
                       f"not saved at step {n}, between weight pushes (rollout.sync_interval = {sync})")
            raise RunStopped(f"{err}; {'' if pushed else between + '; '}{self._kept(redone=not saved)}; "
                             "rerun the same command to resume") from err
        finally:
            if stop is not None:
                stop.close()
        self._save_last()
        self.phase = f"exporting step {self.step}"
        self.export()
        self.metrics.end_progress()
        if self.ctx.is_rank0:
            print(f"phf_megatron.train: finished step {self.step} of {cfg.training.train_iters}; the run's "
                  f"outputs:\n{outputs_message(cfg, self.step)}", flush=True)
        return 0

    def _stopped(self, name: str, engines: str | None = None, redone: bool = False) -> int:
        """The run stops on ``name`` after its current step, saved there; returns 128 + the signal's number.
        ``engines``: the engines' failure after the signal (saved already; ``redone``: not, the last push kept)."""
        if engines is None:
            self._save_last()
        self.metrics.end_progress()
        if self.ctx.is_rank0:
            saved = (f"saved as {os.path.join(self.cfg.save_dir, iter_dir_name(self.step))}" if engines is None else
                     f"the rollout engines stopped on it too ({engines}); {self._kept(redone=redone)}")
            print(f"phf_megatron.train: {name} received: stopped after step {self.step} of "
                  f"{self.cfg.training.train_iters}, {saved}; rerun the same command to resume", flush=True)
        return 128 + int(getattr(signal, name))

    def _kept(self, redone: bool = False) -> str:  # what a stopped run keeps (``input_files.kept``)
        return kept(self.cfg.save_dir, redone)

    def _log(self, metrics: dict) -> None:
        cfg = self.cfg
        loss_tokens = metrics.pop(LOSS_TOKENS, None)
        if loss_tokens is not None:
            self.metrics.log_loss_tokens(self.step, [
                {"id": i, "token": self.tokenizer.decode([i]), "share": share, "count": count}
                for i, share, count in loss_tokens])
        if self.step % cfg.logging.log_interval == 0 or self.step == cfg.training.train_iters:
            self.metrics.log(self.step, metrics)
        shown = {"nonfinite": self.nonfinite_steps} if self.nonfinite_steps else {}
        self.metrics.progress(self.step, loss=metrics.get("loss", float("nan")), step_time=metrics["step_time"], **shown)

    def export(self) -> str:
        """The trained student for HF tools: a PEFT adapter (LoRA) or a full HF checkpoint."""
        return write_student(self.student.chunks, self.student.arch, self.student.hf_config.to_dict(), self.cfg,
                             export_dir(self.cfg), adapter=self.cfg.lora.enabled)

    def close(self) -> None:
        self.metrics.close()
        if self.prefetch is not None:
            self.prefetch.close()
        self.rollouts.close()
        self.method.close()
