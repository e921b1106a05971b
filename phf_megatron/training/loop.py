"""The OPSD + PHF training loop (``python -m phf_megatron.train``).

Each step: the step's prompts from the dataset (deterministic, identical on every rank) →
[``data.reason_first``: the teacher's analyses from the engine, then the teacher prompts] →
rollouts from the engine (rank 0, broadcast; with ``rollout.lmbda`` < 1 the off-policy
micro-batches take the rows' solutions instead, ``policy_mix``) → this rank's micro-batches →
one PHF update (``update.phf_update``) → weight sync into the engine → metrics, layer energy,
the loss by rollout token (every ``logging.loss_tokens_interval`` steps), checkpoint.

Checkpoints are atomic (``checkpoint.save_checkpoint``) and hold everything a resumed run needs
to continue exactly: adapters (or, for full fine-tuning, the model as a dist checkpoint), the
optimizer and LR schedule, the EMA teacher, the data position and every RNG. If the rollout
engine fails, a checkpoint is saved before the error propagates.
"""

from __future__ import annotations

import os
import time

import torch

from ..data import PromptConfig, PromptPair, build_prompt_pair, load_math_dataset
from ..data.prompts import encode_prompt, render_student_prompt
from ..data.reason_first import analysis_prompt_ids, reason_first_teacher_ids
from ..data.sampler import EpochSampler
from ..lora import adapter_parameters
from ..parallel.capture import WindowCapture
from ..tokenizer import load_qwen3_tokenizer
from ..config_errors import fail
from ..errors import UserError
from .batches import build_microbatches
from .checkpoint import load_checkpoint, read_latest, save_checkpoint
from .checkpoint_parts import RankLayout, Scope, dist_model_part, rng_part, stateful_part, tensors_part
from .config import TrainConfig
from .config_io import resume_fingerprint, save_run_config, to_dict
from .diagnostics import layer_energy_metrics
from .distributed import DistributedContext, init_distributed
from .metrics import LOSS_TOKENS, ON_POLICY_FRACTION, MetricsLogger, WandbRun
from .model_setup import StudentModel, build_student, implementations
from .policy_mix import on_policy_samples, solution_completion
from .rollouts import RolloutDriver, RolloutFailure
from .teacher import PrivilegedTeacher
from .update import phf_update


def _eos_token_ids(tokenizer) -> tuple[int, ...]:
    """Tokens that end a Qwen3 assistant turn (``<|im_end|>``, ``<|endoftext|>``) plus the tokenizer's EOS."""
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return tuple(sorted(i for i in ids if i is not None))


def _wandb_run(cfg: TrainConfig) -> WandbRun | None:
    """Where the run's W&B mirror goes (``logging.wandb``), or None."""
    lg = cfg.logging
    if not lg.wandb:
        return None
    return WandbRun(project=lg.wandb_project, name=lg.wandb_exp_name or os.path.basename(os.path.abspath(cfg.run_dir)),
                    entity=lg.wandb_entity, offline=lg.wandb_offline, save_dir=lg.wandb_save_dir or cfg.run_dir,
                    config=to_dict(cfg))


def _load_dataset(cfg: TrainConfig):
    """The training set; a source that cannot be read is an error naming ``--data.path``."""
    try:
        return load_math_dataset(cfg.data.path, split=cfg.data.split, skip_bad_rows=cfg.data.skip_bad_rows)
    except UserError:  # a bad row, named by file and line
        raise
    except ValueError as err:  # "source: ..." (missing file, unknown format, unloadable dataset)
        raise fail("data.path", str(err).removeprefix("source: ")) from err


class Trainer:
    """Builds every piece of a run on this rank; ``run()`` trains to ``training.train_iters``."""

    def __init__(self, cfg: TrainConfig):
        cfg.require_inputs()
        self.cfg = cfg
        self.ctx: DistributedContext = init_distributed(cfg)
        save_run_config(cfg)
        self.tokenizer = load_qwen3_tokenizer(cfg.model.hf_dir)
        self.dataset = _load_dataset(cfg)
        if cfg.data.max_rows:
            self.dataset.rows = self.dataset.rows[: cfg.data.max_rows]
        self.sampler = EpochSampler(len(self.dataset), seed=cfg.data.shuffle_seed, shuffle=cfg.data.shuffle)
        self.prompt_config = PromptConfig(student_enable_thinking=cfg.data.student_enable_thinking,
                                          teacher_enable_thinking=cfg.data.teacher_enable_thinking,
                                          align_generation_prompt=cfg.data.align_generation_prompt,
                                          teacher_prompt=cfg.data.teacher_prompt)
        self.student: StudentModel = build_student(cfg, len(self.dataset))
        self.teacher = PrivilegedTeacher(self.student.chunks, cfg.teacher.mode, cfg.objective.ema_decay,
                                         lora=cfg.lora.enabled, ema_start=cfg.teacher.ema_start)
        self.capture = WindowCapture(self.student.chunks) if cfg.objective.uses_flow else None
        self.layout = RankLayout.from_parallel_state()
        self.step = 0
        # The engine starts first: an in-process vLLM reseeds the global RNGs, which the resume restores.
        self.rollouts = RolloutDriver(cfg, self.student, cfg.model.hf_dir, _eos_token_ids(self.tokenizer))
        self.resumed_from = self._maybe_resume()
        self.rollouts.sync()  # the engine starts from the HF files; push the (resumed) student and verify
        if self.ctx.is_rank0:
            print(f"phf_megatron.train: {implementations(cfg, self.student, self.rollouts.engine)}", flush=True)
        self.metrics = MetricsLogger(cfg.run_dir, cfg.training.train_iters, start_step=self.step,
                                     jsonl=cfg.logging.jsonl, tensorboard=cfg.logging.tensorboard,
                                     tensorboard_dir=cfg.logging.tensorboard_dir,
                                     progress_bar=cfg.logging.progress_bar, wandb=_wandb_run(cfg))

    # ----------------------------------------------------------------- checkpoints

    def _parts(self) -> dict:
        parts = {
            "optimizer": stateful_part(self.student.optimizer, Scope.MODEL_PARALLEL),
            "scheduler": stateful_part(self.student.scheduler, Scope.GLOBAL),
            "data": stateful_part(self.sampler, Scope.GLOBAL),
            "teacher": stateful_part(self.teacher, Scope.MODEL_PARALLEL),
            "rng": rng_part(),
        }
        if self.cfg.lora.enabled:
            parts["adapters"] = tensors_part(dict(p for c in self.student.chunks for p in adapter_parameters(c)))
        else:
            for i, chunk in enumerate(self.student.chunks):
                parts[f"model{i}"] = dist_model_part(chunk.module)
        parts["rng"] = parts.pop("rng")  # restored last
        return parts

    def save(self) -> str:
        return save_checkpoint(self.cfg.save_dir, self.step, self._parts(), self.layout,
                               fingerprint=resume_fingerprint(self.cfg), keep_last=self.cfg.checkpoint.keep_last,
                               extra={"samples_seen": self.step * self.cfg.training.global_batch_size})

    def _maybe_resume(self) -> str | None:
        load_dir = self.cfg.load_dir
        if not load_dir or read_latest(load_dir) is None:
            return None
        parts = self._parts()
        if self.cfg.checkpoint.no_load_optim:
            parts.pop("optimizer")
        if self.cfg.checkpoint.no_load_rng:
            parts.pop("rng")
        info = load_checkpoint(load_dir, parts, self.layout,
                               fingerprint=resume_fingerprint(self.cfg) if self.cfg.checkpoint.strict_config else None)
        self.step = info.iteration
        return info.path

    # ----------------------------------------------------------------- one step

    def _step_inputs(self):
        """The step's rows and prompt pairs (one per row; reason-first pairs need the engine: collective)."""
        rows = [self.dataset[i] for i in self.sampler.take(self.cfg.prompts_per_step)]
        if self.cfg.data.reason_first:
            pairs = self._reason_first_pairs(rows)
        else:
            pairs = [build_prompt_pair(self.tokenizer, r.problem, r.solution, self.prompt_config) for r in rows]
            self._check_prompt_lengths(rows, [p.teacher_ids for p in pairs])
        return rows, pairs

    def _check_prompt_lengths(self, rows, prompts) -> None:
        too_long = [i for i, p in enumerate(prompts) if len(p) > self.cfg.data.max_prompt_length]
        if too_long:
            raise fail("data.max_prompt_length", f"{len(too_long)} prompt(s) of step {self.step} exceed "
                       f"{self.cfg.data.max_prompt_length} tokens (e.g. {rows[too_long[0]].origin})")

    def _reason_first_pairs(self, rows) -> list[PromptPair]:
        """The teacher's analysis of each row's reference (engine: the current student), then the teacher
        prompt ``[analysis prompt][analysis][transition]`` (``data.reason_first``)."""
        prompts = [analysis_prompt_ids(self.tokenizer, r.problem, r.solution) for r in rows]
        self._check_prompt_lengths(rows, prompts)
        analyses = self.rollouts.generate(prompts, self.step, self.rollouts.analysis_params(self.step))
        return [PromptPair(student_ids=encode_prompt(self.tokenizer, render_student_prompt(
                    self.tokenizer, r.problem, self.prompt_config)),
                           teacher_ids=reason_first_teacher_ids(self.tokenizer, p, a, self.prompt_config))
                for r, p, a in zip(rows, prompts, analyses)]

    def _completions(self, rows, pairs) -> tuple[list[list[int]], float]:
        """One completion per sample (``rollout.n`` per row): rollouts, or with ``rollout.lmbda`` < 1 the
        rows' solutions for the off-policy micro-batches; and the on-policy fraction."""
        from megatron.core import parallel_state as ps

        cfg, n = self.cfg, self.cfg.rollout.n
        on_policy = on_policy_samples(cfg.rollout.lmbda, cfg.training.seed, self.step, len(rows) * n,
                                      ps.get_data_parallel_world_size(), cfg.training.micro_batch_size)
        sampled = [r for r in range(len(rows)) if any(on_policy[r * n: (r + 1) * n])]
        rollouts = self.rollouts.generate([pairs[r].student_ids for r in sampled], self.step) if sampled else []
        by_sample = {r * n + j: rollouts[k * n + j] for k, r in enumerate(sampled) for j in range(n)}
        completions = [by_sample[i] if on_policy[i] else
                       solution_completion(self.tokenizer, rows[i // n].solution, cfg.rollout.max_tokens)
                       for i in range(len(on_policy))]
        return completions, sum(on_policy) / len(on_policy)

    def train_step(self) -> dict:
        from megatron.core import parallel_state as ps

        cfg = self.cfg
        t0 = time.perf_counter()
        rows, row_pairs = self._step_inputs()
        completions, on_policy = self._completions(rows, row_pairs)
        pairs = [p for p in row_pairs for _ in range(cfg.rollout.n)]
        t1 = time.perf_counter()
        sp = self.student.config.sequence_parallel
        mbs = build_microbatches(pairs, completions, pad_id=self.tokenizer.pad_token_id,
                                 micro_batch_size=cfg.training.micro_batch_size, dp_rank=ps.get_data_parallel_rank(),
                                 dp_size=ps.get_data_parallel_world_size(),
                                 pad_multiple=ps.get_tensor_model_parallel_world_size() if sp else 1,
                                 window_budget=cfg.objective.flow_window)
        interval = cfg.logging.loss_tokens_interval
        metrics = phf_update(self.student, self.teacher, self.capture, mbs, cfg.objective,
                             collect_loss_tokens=bool(interval) and (self.step + 1) % interval == 0)
        t2 = time.perf_counter()
        if (self.step + 1) % cfg.rollout.sync_interval == 0:
            self.rollouts.sync()
        t3 = time.perf_counter()
        metrics.update(time_rollout_s=t1 - t0, time_update_s=t2 - t1, time_sync_s=t3 - t2, step_time=t3 - t0,
                       rollout_tokens=sum(len(c) for c in completions) / max(len(completions), 1),
                       sync_probe_diff=self.rollouts.last_probe_diff,
                       sync_fingerprint_diff=self.rollouts.last_fingerprint_diff,
                       sync_fingerprints_checked=self.rollouts.last_fingerprints_checked)
        if cfg.rollout.lmbda < 1:
            metrics[ON_POLICY_FRACTION] = on_policy
        if cfg.logging.log_layer_energy and metrics.get("layer_flow"):
            metrics.update(layer_energy_metrics(torch.tensor(metrics["layer_flow"], dtype=torch.float64)))
        return metrics

    # ----------------------------------------------------------------- the run

    def run(self) -> None:
        cfg = self.cfg
        try:
            while self.step < cfg.training.train_iters:
                metrics = self.train_step()
                self.step += 1
                loss_tokens = metrics.pop(LOSS_TOKENS, None)
                if loss_tokens is not None:
                    self.metrics.log_loss_tokens(self.step, [
                        {"id": i, "token": self.tokenizer.decode([i]), "share": share, "count": count}
                        for i, share, count in loss_tokens])
                if self.step % cfg.logging.log_interval == 0 or self.step == cfg.training.train_iters:
                    self.metrics.log(self.step, metrics)
                self.metrics.progress(self.step, loss=metrics.get("loss", float("nan")),
                                      step_time=metrics["step_time"])
                if cfg.checkpoint.save_interval and self.step % cfg.checkpoint.save_interval == 0:
                    self.save()
        except RolloutFailure:
            self.save()  # nothing lost: the next run resumes from here
            raise
        interval = cfg.checkpoint.save_interval
        if not (interval and self.step % interval == 0):  # the last step was not saved by the loop
            self.save()
        self.export()

    def export(self) -> str:
        """The trained student for HF tools: a PEFT adapter (LoRA) or a full HF checkpoint."""
        out = os.path.join(self.cfg.run_dir, "export")
        if self.cfg.lora.enabled:
            from ..lora.export import export_peft_adapter

            path = os.path.join(out, "peft_adapter")
            export_peft_adapter(self.student.chunks, path, self.cfg.lora,
                                base_model_name_or_path=os.path.abspath(self.cfg.model.hf_dir))
            return path
        from megatron.core import parallel_state as ps

        from ..convert.hf_writer import write_hf_checkpoint
        from ..convert.live_model import iter_hf_weights

        path = os.path.join(out, "hf")
        items = (item for chunk in self.student.chunks
                 for item in iter_hf_weights(chunk, self.student.arch,
                                             pp_group=ps.get_pipeline_model_parallel_group()))
        if ps.get_data_parallel_rank() == 0:
            if self.ctx.is_rank0:
                hf_dir = self.cfg.model.hf_dir
                tokenizer_files = [f for f in os.listdir(hf_dir) if f.startswith(("tokenizer", "vocab", "merges",
                                   "special_tokens", "generation_config", "chat_template"))]
                write_hf_checkpoint(items, path, hf_config=self.student.hf_config.to_dict(),
                                    dtype=self.student.config.params_dtype, tokenizer_src=hf_dir,
                                    tokenizer_files=tokenizer_files)
            else:
                for _ in items:
                    pass
        return path

    def close(self) -> None:
        self.metrics.close()
        self.rollouts.close()
        if self.capture is not None:
            self.capture.remove()
