"""The training run's configuration: one dataclass per section, each field with the paper's default.

A run is ``TrainConfig`` = model / lora / teacher / rollout / data / optimizer / training /
objective / checkpoint / logging. Names follow Megatron's arguments where Megatron has one
(``tensor_model_parallel_size``, ``micro_batch_size``, ``lr``, ``clip_grad``, ``save`` ...), so
``--lr 1e-5`` means what it means in ``pretrain_gpt.py``. Defaults are the paper's appendix
table and the official OPSD launch script (``siyan-zhao/OPSD``, ``scripts/run_opsd.sh`` on TRL's
GOLDConfig / TrainingArguments defaults); each field's docstring says which.

Every ``__post_init__`` error names the field and the command-line flag that changes it.
The sections live in ``config_sections.py``; YAML loading, overrides and dumping in ``config_io.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from phf_megatron.data.sources import missing_source
from phf_megatron.input_files import LATEST_FILE, missing_dir, run_checkpoints_dir  # noqa: F401 - LATEST_FILE: re-exported
from phf_megatron.objectives.config import METHODS, GrpoConfig, ObjectiveConfig, SftConfig

from ..config_errors import check_choice, fail
from .config_sections import (  # noqa: F401 - re-exported: the sections are part of this module's API
    CheckpointConfig, DataConfig, LoggingConfig, LoraConfig, ModelConfig, OptimizerConfig, RolloutConfig,
    TeacherConfig, TrainingConfig,
)

#: ``data.holdout_fraction`` left unset: the official script's share of rows never trained on (data/holdout.py)
HOLDOUT = {"phf": 0.0, "sft": 0.01, "grpo": 0.007}

#: The paper's ablation rows (Table 2 and Section 4) as switches: ``--ablation NAME`` sets these
#: ``objective`` values before the explicit command-line overrides are applied.
ABLATIONS: dict[str, dict[str, object]] = {
    "opsd_only": {"flow_variant": "none"},
    "local_only": {"flow_variant": "local"},
    "direction_only": {"flow_variant": "direction"},
    "geometry_only": {"flow_variant": "geometry"},
    "pointwise_mse": {"flow_variant": "pointwise_mse"},
    # A fixed hand-picked subset; the paper does not list it, so the run must name it.
    "selected_layers": {"flow_variant": "phf"},
}


def written_model_format(lora: bool) -> str:
    """The one format the trainer saves the trainable weights in (``Trainer._parts``): the LoRA adapters per
    model-parallel rank, a full fine-tuning's model as a dist checkpoint (``checkpoint.model_format`` names no other)."""
    return "per_rank" if lora else "torch_dist"


@dataclass
class TrainConfig:
    """One PHF training run."""

    run_dir: str = "runs/phf"
    """Directory of the run: resolved config, metrics, plots, default checkpoint dir."""
    method: str = "phf"
    """What a step trains: phf (OPSD + hidden flow, the paper's method; the ablations too) | sft
    (the SFT baseline: cross-entropy on the rows' solutions, see ``sft``; no rollouts, no teacher) | grpo
    (the GRPO baseline: ``rollout.n`` rollouts per prompt rewarded by their answer, TRL 0.26's clipped
    policy-gradient loss, see ``grpo``; no teacher)."""
    ablation: str | None = None
    """A paper ablation: opsd_only | local_only | direction_only | geometry_only | pointwise_mse |
    selected_layers (with objective.flow_layers); None: the main PHF recipe."""
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    grpo: GrpoConfig = field(default_factory=GrpoConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        if not self.run_dir:
            raise fail("run_dir", "is empty")
        check_choice("method", self.method, METHODS)
        if self.training.max_tokens_per_microbatch is not None:
            if self.method == "grpo" and self.grpo.loss_type == "bnpo":
                raise fail("training.max_tokens_per_microbatch", "not with grpo.loss_type=bnpo: its loss is each "
                           "micro-batch's token mean, so the grouping would change the update (grpo, dr_grpo and "
                           "dapo normalize by the step's counts and take a budget)")
            if not self.training.packing:
                raise fail("training.max_tokens_per_microbatch", "counts packed tokens: it needs --training.packing")
            if (self.model.virtual_pipeline_model_parallel_size or 1) > 1:
                raise fail("training.max_tokens_per_microbatch", "not yet with model.virtual_pipeline_model_parallel_"
                           "size: the interleaved schedule needs a multiple of the PP size of micro-batches on every "
                           "rank, which a token budget does not give")
        if self.method != "phf" and self.ablation is not None:
            raise fail("ablation", f"{self.ablation} is an ablation of PHF's loss; --method={self.method} has no "
                       "hidden-flow or OPSD term to ablate (leave --ablation out, or use --method=phf)")
        interval, sync = self.checkpoint.save_interval, self.rollout.sync_interval
        if self.method == "phf" and interval % sync:
            raise fail("checkpoint.save_interval", f"{interval} is not a multiple of rollout.sync_interval = {sync}: a "
                       "run resumed between weight pushes would sample from newer weights than the one it continues")
        if self.method == "phf" and self.training.train_iters % sync:
            raise fail("training.train_iters", f"{self.training.train_iters} is not a multiple of rollout.sync_interval "
                       f"= {sync}: the run must end after a weight push (a run extended later resumes from its end)")
        if self.method == "sft":
            self._check_sft()
        if self.method == "grpo":
            self._check_grpo()
        if self.ablation is not None:
            check_choice("ablation", self.ablation, tuple(ABLATIONS))
            for key, value in ABLATIONS[self.ablation].items():
                if getattr(self.objective, key) != value:
                    raise fail(f"objective.{key}", f"{getattr(self.objective, key)!r} contradicts "
                               f"--ablation={self.ablation}, which sets {value!r}")
            if self.ablation == "selected_layers" and self.objective.flow_layers is None:
                raise fail("objective.flow_layers", "--ablation=selected_layers needs the layer subset, "
                           "e.g. --objective.flow_layers=6,7,20,21")
        written = written_model_format(self.lora.enabled)
        if self.checkpoint.model_format not in ("auto", written):
            raise fail("checkpoint.model_format", f"{self.checkpoint.model_format}: the trainer saves "
                       f"{'LoRA adapters' if self.lora.enabled else 'the full model'} as {written} only; leave it at auto")
        if self.teacher.mode == "fixed" and not self.lora.enabled:
            raise fail("teacher.mode", "'fixed' is the base model with the adapters off and needs "
                       "--lora.enabled=true (or use --teacher.mode=ema)")
        if self.training.global_batch_size % self.rollout.n:
            raise fail("training.global_batch_size", f"{self.training.global_batch_size} rollouts do not "
                       f"split into prompts of rollout.n = {self.rollout.n} completions")

    def _check_no_teacher(self) -> None:
        """SFT and GRPO have no teacher: a teacher setting would be silently ignored."""
        if self.data.reason_first:
            raise fail("data.reason_first", f"is a PHF teacher option; --method={self.method} has no teacher")
        default = TeacherConfig()
        for f in fields(TeacherConfig):
            if getattr(self.teacher, f.name) != getattr(default, f.name):
                raise fail(f"teacher.{f.name}", f"{getattr(self.teacher, f.name)}: --method={self.method} has no "
                           "teacher; leave the teacher settings out")

    def _check_sft(self) -> None:
        """Settings that change what an SFT step would train on, and that SFT cannot honour."""
        if self.rollout.n != 1:
            raise fail("rollout.n", f"{self.rollout.n}: --method=sft trains each row's solution once; set --rollout.n=1")
        self._check_no_teacher()
        if self.rollout.async_steps:
            raise fail("rollout.async_steps", "--method=sft has no rollouts to overlap; set --rollout.async_steps=0")
        if self.rollout.lmbda != 1.0:
            raise fail("rollout.lmbda", f"{self.rollout.lmbda}: --method=sft trains on the rows' solutions only (no "
                       "rollouts to mix in); set --rollout.lmbda=1")

    def _check_grpo(self) -> None:
        """Settings GRPO cannot honour (each one line naming the setting)."""
        g, n = self.grpo, self.rollout.n
        if n < 2:
            raise fail("rollout.n", f"{n}: --method=grpo compares G >= 2 completions per prompt (TRL's "
                       "num_generations; paper 8); set e.g. --rollout.n=8")
        self._check_no_teacher()
        if self.rollout.lmbda != 1.0:
            raise fail("rollout.lmbda", f"{self.rollout.lmbda}: --method=grpo trains on its rollouts only; "
                       "set --rollout.lmbda=1")
        if self.rollout.async_steps:
            raise fail("rollout.async_steps", "is not supported with --method=grpo (each rollout batch is sampled "
                       "by the policy its first optimizer step starts from); set --rollout.async_steps=0")
        if self.checkpoint.save_interval % g.num_iterations:
            raise fail("checkpoint.save_interval", f"{self.checkpoint.save_interval} is not a multiple of "
                       f"grpo.num_iterations = {g.num_iterations}: checkpoints must fall between rollout batches")
        if self.training.train_iters % g.num_iterations:
            raise fail("training.train_iters", f"{self.training.train_iters} is not a multiple of "
                       f"grpo.num_iterations = {g.num_iterations}: the run must end between rollout batches")
        if self.rollout.sync_interval != 1:
            raise fail("rollout.sync_interval", f"{self.rollout.sync_interval}: --method=grpo pushes the weights "
                       "before every rollout batch (as TRL); set --rollout.sync_interval=1")
        r = self.rollout
        if g.vllm_importance_sampling_correction and (r.top_k > 0 or r.top_p < 1):
            raise fail("grpo.vllm_importance_sampling_correction", f"compares the engine's log-probs after top-k / "
                       f"top-p (rollout.top_k={r.top_k}, rollout.top_p={r.top_p}) with the trainer's over the whole "
                       "vocabulary: every ratio would be far from 1; sample unfiltered (--rollout.top_k=0 "
                       "--rollout.top_p=1.0, TRL's defaults) or set it to false")
        if g.beta != 0 and not self.lora.enabled:
            raise fail("grpo.beta", f"{g.beta}: the KL reference is the base model with the adapters off and "
                       "needs --lora.enabled=true (or --grpo.beta=0)")

    # ------------------------------------------------------------------ derived values

    @property
    def iterations(self) -> int:
        """Optimizer steps per rollout batch (``grpo.num_iterations`` for GRPO, else 1)."""
        return self.grpo.num_iterations if self.method == "grpo" else 1

    @property
    def dropout_disabled(self) -> bool:
        """``model.disable_dropout``, or where it is None the official trainer's choice for the method: PHF's
        (TRL GOLDConfig, disable_dropout=True) zeroes every dropout; SFT's and GRPO's (TRL 0.26 SFTTrainer,
        GRPOConfig.disable_dropout=False) train with LoRA dropout (``lora.dropout``, ModelConfig's 0.05)."""
        return self.method == "phf" if self.model.disable_dropout is None else self.model.disable_dropout

    @property
    def holdout_fraction(self) -> float:
        """``data.holdout_fraction``, or where it is None the official script's for the method (OPSD 7448751):
        sft_train.py holds out 0.01 of the rows, grpo_train.py 0.007, opsd_train.py none."""
        return HOLDOUT[self.method] if self.data.holdout_fraction is None else self.data.holdout_fraction

    @property
    def save_dir(self) -> str:
        return run_checkpoints_dir(self.run_dir, self.checkpoint.save)

    @property
    def load_dir(self) -> str:
        """Where the run resumes from: its own save directory once that holds a checkpoint (a rerun, a
        requeue), else ``checkpoint.load`` (a run that starts from another run's checkpoint)."""
        own = os.path.isfile(os.path.join(self.save_dir, LATEST_FILE))
        return self.save_dir if own or not self.checkpoint.load else self.checkpoint.load

    @property
    def model_format(self) -> str:
        """The resolved checkpoint format of the trainable weights."""
        if self.checkpoint.model_format != "auto":
            return self.checkpoint.model_format
        return written_model_format(self.lora.enabled)

    @property
    def prompts_per_step(self) -> int:
        return self.training.global_batch_size // self.rollout.n

    def data_parallel_size(self, world_size: int) -> int:
        """World size over TP x PP; raises if the ranks do not factor."""
        mp = self.model.tensor_model_parallel_size * self.model.pipeline_model_parallel_size
        if world_size % mp:
            raise fail("model.tensor_model_parallel_size", f"world size {world_size} is not a multiple of "
                       f"tensor_model_parallel_size x pipeline_model_parallel_size = {mp}")
        return world_size // mp

    def check_world_size(self, world_size: int) -> None:
        """What the run checks as it starts, for ``world_size`` ranks: TP x PP divides it and a step's samples split
        over the data-parallel ranks and their micro-batches; one line naming the setting (``--print-config``
        under ``RANK``/``WORLD_SIZE``: torchrun's, or a launcher's check before it converts the model and starts the ranks)."""
        from .microbatch_plan import check_step_split

        t, m = self.training, self.model
        check_step_split(t.global_batch_size, self.data_parallel_size(world_size), t.micro_batch_size,
                         t.max_tokens_per_microbatch, m.pipeline_model_parallel_size,
                         m.virtual_pipeline_model_parallel_size, self.rollout.lmbda)

    def num_microbatches(self, world_size: int) -> int:
        """Micro-batches per step on each data-parallel rank (gradient accumulation)."""
        dp = self.data_parallel_size(world_size)
        per_step = self.training.micro_batch_size * dp
        if self.training.global_batch_size % per_step:
            raise fail("training.global_batch_size", f"{self.training.global_batch_size} is not a multiple of "
                       f"micro_batch_size x data-parallel size = {self.training.micro_batch_size} x {dp}")
        return self.training.global_batch_size // per_step

    def require_inputs(self) -> None:
        """Raise unless the inputs a real run needs are named and its model directories exist (not
        checked at construction so that presets and tests can build configs without the files)."""
        self.rollout.check_placement()
        self.rollout.check_vllm_installed()
        if not self.model.hf_dir:
            raise fail("model.hf_dir", "is required: the HF Qwen3 checkpoint directory")
        for key in ("hf_dir", "pretrained_checkpoint"):   # named here, not by the loader that meets them
            path = getattr(self.model, key)
            if path and (why := missing_dir(path)):
                raise fail(f"model.{key}", why)
        if why := missing_source(self.data.path):   # was said after torch, Megatron and the model had loaded (~6 s)
            raise fail("data.path", why)
        if os.path.exists(self.run_dir) and not os.path.isdir(self.run_dir):   # not once the model is loaded
            raise fail("run_dir", f"{self.run_dir} is not a directory")
