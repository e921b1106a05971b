"""The sections of the run config (model, LoRA, teacher, rollout, data, optimizer, training,
checkpoint, logging); ``config.TrainConfig`` nests them with ``ObjectiveConfig``. The LoRA and
rollout sections live with their packages (``lora.config``, ``rollout.config``).

Every field is followed by its docstring (default and source); every ``__post_init__`` error
names the field and the command-line flag that changes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config_errors import check_choice, check_positive, fail
from ..data.prompts import TEACHER_PROMPTS
from ..data.reason_first import DEFAULT_ANALYSIS_TOKENS
from ..lora.config import LoraConfig  # noqa: F401 - the LoRA section lives with LoRA
from ..models.choices import DTYPE_SPELLINGS, PACKED_ATTENTIONS, TRANSFORMER_IMPLS, dtype_name
from ..rollout.config import RolloutConfig  # noqa: F401 - the rollout section lives with the engines

TEACHER_MODES = ("ema", "fixed", "dynamic")
EMA_STARTS = ("initial", "after_first_step")
RECOMPUTE_GRANULARITIES = ("full", "selective")
RECOMPUTE_METHODS = ("uniform", "block")
LR_DECAY_STYLES = ("cosine", "linear", "constant")
MODEL_FORMATS = ("auto", "torch_dist", "per_rank")
#: The signals ``checkpoint.exit_signal`` may name (``training.stop_signal``).
EXIT_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")


@dataclass
class ModelConfig:
    """The policy model and how Megatron-Core lays it out."""

    hf_dir: str | None = None
    """HF Qwen3 checkpoint directory (config.json, tokenizer, safetensors). Required to run: the model's
    config, the tokenizer, the rollout engines' starting weights, the tokenizer of the export and the
    PEFT adapter's base; the student's base weights too unless pretrained_checkpoint is set."""
    pretrained_checkpoint: str | None = None
    """Megatron-Core checkpoint of the same base model (tools/convert/hf_to_mcore.py's; Megatron's
    --pretrained-checkpoint), from which the student loads its base weights under any TP/PP; None:
    the student reads them from hf_dir's safetensors (nothing is converted or written)."""
    dtype: str = "bfloat16"
    """Parameter dtype of the frozen base: bfloat16 | float16 | float32 (or bf16 | fp16 | fp32; official: torch_dtype
    bfloat16)."""
    tensor_model_parallel_size: int = 1
    """Megatron TP degree; must divide the attention heads and the KV heads (8 for Qwen3 1.7B-8B)."""
    pipeline_model_parallel_size: int = 1
    """Megatron PP degree; must divide the number of layers (28 or 36)."""
    virtual_pipeline_model_parallel_size: int | None = None
    """Interleaved-schedule model chunks per pipeline rank; None: no interleaving. On CPU (gloo) the schedule
    sends and receives one message at a time (Megatron's batch_p2p_comm=False: gloo's batched p2p paired its
    messages wrongly at PP = 2 with more micro-batches than stages)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (needs TP > 1; as in Megatron it is turned off at TP = 1)."""
    recompute_granularity: str | None = "full"
    """full | selective | None. Official runs use --gradient_checkpointing (full recompute)."""
    recompute_method: str | None = "uniform"
    """uniform | block, for full recompute."""
    recompute_num_layers: int | None = 1
    """Layers per recompute chunk (uniform) or recomputed layers per stage (block)."""
    transformer_impl: str = "auto"
    """auto (Transformer Engine when importable and on CUDA, else local) | local | te (Transformer
    Engine; Megatron's --transformer-impl transformer_engine)."""
    disable_dropout: bool | None = None
    """Zero every dropout, LoRA's included (Qwen3's own dropouts are 0). None: as the method's official
    trainer (``TrainConfig.dropout_disabled``): true for phf (TRL GOLDConfig's default), false for sft and
    grpo (TRL 0.26's SFTTrainer has no such switch, GRPOConfig defaults it to false: their LoRA dropout 0.05 trains).
    False under phf also scores the EMA / dynamic teacher with LoRA dropout on, as official OPSD (opsd_trainer.py:683-687:
    its teacher forward is the training-mode model under no_grad, dropout zeroed only by --disable_dropout, 178-179)."""
    fused_kernels: bool = True
    """Compiled RMSNorm / RoPE / SwiGLU fast paths (GPU only; measured 1.31x HF tokens/s on an H100)."""
    compile_layers: bool = False
    """``torch.compile`` each decoder layer (GPU; measured 1.65x HF tokens/s on an H100, longer start-up)."""
    packed_attention: str = "sdpa"
    """Attention of packed sequences (training.packing) in the local spec: sdpa (one causal SDPA call per sequence) |
    varlen (one call per layer of PyTorch's varlen flash attention from cu_seqlens, models/varlen.py: CUDA only, no
    attention dropout, not with Transformer Engine). Opt-in: not yet measured on a GPU (benchmarks/sdpa_plans.py). No
    effect (and not checked) with --training.packing=false."""

    def __post_init__(self) -> None:
        check_choice("model.dtype", self.dtype, DTYPE_SPELLINGS)   # was the torch spellings only: bf16 is taken too
        self.dtype = dtype_name(self.dtype)   # bf16 was refused here, taken by the converters
        check_positive("model.tensor_model_parallel_size", self.tensor_model_parallel_size)
        check_positive("model.pipeline_model_parallel_size", self.pipeline_model_parallel_size)
        vpp = self.virtual_pipeline_model_parallel_size
        if vpp is not None:
            check_positive("model.virtual_pipeline_model_parallel_size", vpp)
            if self.pipeline_model_parallel_size == 1 and vpp > 1:
                raise fail("model.virtual_pipeline_model_parallel_size",
                           f"{vpp} chunks need pipeline_model_parallel_size > 1")
        if self.tensor_model_parallel_size == 1:
            self.sequence_parallel = False  # Megatron's rule: nothing to split at TP = 1
        check_choice("model.transformer_impl", self.transformer_impl, TRANSFORMER_IMPLS)
        check_choice("model.packed_attention", self.packed_attention, PACKED_ATTENTIONS)
        if self.recompute_granularity is not None:
            check_choice("model.recompute_granularity", self.recompute_granularity, RECOMPUTE_GRANULARITIES)
        if self.recompute_granularity == "full":
            check_choice("model.recompute_method", self.recompute_method, RECOMPUTE_METHODS)
            check_positive("model.recompute_num_layers", self.recompute_num_layers)

    def check_model_shape(self, num_layers: int, num_attention_heads: int, num_query_groups: int, *,
                          intermediate_size: int | None = None, vocab_size: int | None = None) -> None:
        """Raise if the parallel layout does not fit the model (called once the HF config is read)."""
        tp, pp = self.tensor_model_parallel_size, self.pipeline_model_parallel_size
        for what, n in (("num_attention_heads", num_attention_heads), ("num_key_value_heads", num_query_groups),
                        ("intermediate_size", intermediate_size)):
            if n is not None and n % tp:
                raise fail("model.tensor_model_parallel_size", f"{tp} does not divide the model's {what} ({n})")
        if vocab_size is not None and vocab_size % tp:
            raise fail("model.tensor_model_parallel_size", f"{tp} does not divide the model's vocab_size ({vocab_size}); "
                       "the vocabulary is not padded for TP: use a TP size that divides it, or pad the embedding")
        chunks = pp * (self.virtual_pipeline_model_parallel_size or 1)
        if num_layers % chunks:
            raise fail("model.pipeline_model_parallel_size",
                       f"{num_layers} layers do not split into pipeline_model_parallel_size x "
                       f"virtual_pipeline_model_parallel_size = {chunks} equal chunks")


@dataclass
class TeacherConfig:
    """Which weights score the privileged prompt. The EMA decay is ``objective.ema_decay``."""

    mode: str = "ema"
    """ema (paper: EMA of the student's trainable weights, rho = objective.ema_decay) | fixed
    (adapters off: the initial policy; needs LoRA; the official OPSD scripts' --fixed_teacher) |
    dynamic (the current student)."""
    ema_start: str = "initial"
    """Where the EMA starts: initial (paper: theta_bar_0 = theta_0) | after_first_step (official
    OPSD code at 7448751, opsd_trainer.py lines 193, 531-544, 571-573: the teacher is the student
    until the first optimizer step, whose result theta_1 the EMA copies; see training.teacher)."""

    def __post_init__(self) -> None:
        check_choice("teacher.mode", self.mode, TEACHER_MODES)
        check_choice("teacher.ema_start", self.ema_start, EMA_STARTS)
        if self.ema_start != "initial" and self.mode != "ema":
            raise fail("teacher.ema_start", f"{self.ema_start!r} applies to the EMA teacher only, not "
                       f"teacher.mode={self.mode!r}")


@dataclass
class DataConfig:
    """The OPSD math set and how its prompts are rendered."""

    path: str = "siyanzhao/Openthoughts_math_30k_opsd"
    """JSONL / Parquet file, dataset directory or HF dataset name (official set: 29,434 rows)."""
    split: str = "train"
    """Split of a HF dataset."""
    max_rows: int | None = None
    """Use only the first this many rows (tiny runs); None: all."""
    student_enable_thinking: bool = False
    """Qwen3 thinking mode of the student's prompt (False: it ends in an empty think block)."""
    teacher_enable_thinking: bool = True
    """Thinking mode of the privileged prompt (official: True); used only without align_generation_prompt."""
    align_generation_prompt: bool = True
    """End the teacher's prompt with the student's generation prompt so y continues the same
    assistant turn in both (fixes OPSD issue #10); False reproduces the official rendering."""
    teacher_prompt: str = "official"
    """Wording of the teacher's message: official (OPSD 7448751, data_collator.py) | opsd_2026_03
    (the wording before the authors' 2026-03-18 rewrite; see phf_megatron/data/prompts.py)."""
    max_prompt_length: int = 20000
    """Longest prompt in tokens; a longer row stops the run at load (official --max_length 20000 truncates)."""
    skip_bad_rows: bool = False
    """Skip and count invalid rows instead of stopping at the first one."""
    holdout_fraction: float | None = None
    """Share of the rows never trained on, as the official baselines' ``train_test_split(test_size, seed)``
    (``data/holdout.py``: its ``train`` part, in its order, then ``max_rows``). None: the method's official
    script (``TrainConfig.holdout_fraction``): sft 0.01, grpo 0.007, phf 0, a resume the checkpoint's (one saved
    before this setting: 0); 0: every row."""
    holdout_seed: int = 42
    """Seed of that split (official: 42)."""
    shuffle: bool = True
    """Reshuffle the rows every epoch (HF Trainer's RandomSampler)."""
    shuffle_seed: int = 42
    """Seed of the shuffle (HF TrainingArguments seed = 42)."""
    reason_first: bool = False
    """The teacher first writes an analysis of the reference (sampled by the rollout engine, i.e.
    the student's weights, as the official vLLM runs do) and its prompt is the analysis prompt,
    the analysis and the transition text (official --reason_first; data.reason_first). False: the
    plain privileged prompt (paper, official scripts)."""
    reason_first_max_tokens: int = DEFAULT_ANALYSIS_TOKENS
    """Most tokens of the teacher's analysis (official max_reasoning_length default 4096)."""

    def __post_init__(self) -> None:
        if not self.path:
            raise fail("data.path", "is empty")
        check_positive("data.reason_first_max_tokens", self.reason_first_max_tokens)
        if self.max_rows is not None:
            check_positive("data.max_rows", self.max_rows)
        check_positive("data.max_prompt_length", self.max_prompt_length)
        check_positive("data.shuffle_seed", self.shuffle_seed, allow_zero=True)   # the sampler's, once the model loaded
        check_positive("data.holdout_seed", self.holdout_seed, allow_zero=True)
        if self.holdout_fraction is not None and not 0 <= self.holdout_fraction < 1:
            raise fail("data.holdout_fraction", f"{self.holdout_fraction}: must be in [0, 1) (the share held out)")
        check_choice("data.teacher_prompt", self.teacher_prompt, TEACHER_PROMPTS)


@dataclass
class OptimizerConfig:
    """AdamW (Megatron's ``adam`` decouples weight decay) and its learning-rate schedule."""

    lr: float = 5e-6
    """Peak learning rate (paper: 5e-6)."""
    min_lr: float = 0.0
    """Floor of the decay (HF cosine schedule: 0)."""
    lr_decay_style: str = "cosine"
    """cosine (paper) | linear | constant."""
    lr_warmup_iters: int = 0
    """Linear warm-up steps (official warmup 0)."""
    num_train_epochs: float = 30.0
    """Epochs the cosine spans (official num_train_epochs = 30); the run stops earlier at train_iters."""
    lr_decay_iters: int | None = None
    """Decay length in optimizer steps; None: num_train_epochs * ceil(rows / global_batch_size)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (HF TrainingArguments default 0)."""
    adam_beta1: float = 0.9
    """Adam beta1 (HF default)."""
    adam_beta2: float = 0.999
    """Adam beta2 (HF default)."""
    adam_eps: float = 1e-8
    """Adam epsilon (HF default)."""
    clip_grad: float = 0.1
    """Global gradient-norm clip (paper: 0.1); 0 disables it."""
    use_distributed_optimizer: bool = False
    """Shard optimizer state over data-parallel ranks (Megatron's distributed optimizer; CUDA only)."""
    loss_scale: float | None = None
    """Static loss scale (Megatron's --loss-scale); None: float16 scales dynamically (the settings below). As in
    Megatron it also scales bfloat16's loss (and float32's with use_distributed_optimizer), where nothing needs
    it, and a step whose scaled gradient overflows is a non-finite step (skipped, counted in nonfinite_steps)."""
    initial_loss_scale: float = 2.0**16
    """float16's dynamic loss scale at the start (Megatron's --initial-loss-scale; a run resumed from a dynamic
    scale continues from the checkpoint's). 2^16 (torch.amp.GradScaler's start), not Megatron's 2^32: each
    overflow skips a step and throws its rollouts away, and the tiny fp16 run skipped its first 19 steps from
    2^32, its first 3 from 2^16 (docs/reliability.md); a lower start risks gradient underflow for the whole
    run, as the scale grows only every loss_scale_window steps. Ignored under bfloat16 / float32 (Megatron's rule)."""
    min_loss_scale: float = 1.0
    """Floor of float16's dynamic loss scale (Megatron's --min-loss-scale)."""
    loss_scale_window: int = 1000
    """float16: double the dynamic loss scale after this many steps without an overflow (Megatron's
    --loss-scale-window)."""
    hysteresis: int = 2
    """float16: halve the dynamic loss scale at every overflow from the hysteresis-th on (consecutive or not;
    the count restarts when the scale grows; Megatron's --hysteresis). Each overflow skips the step (no weight,
    Adam, LR-schedule or EMA-teacher change; ``update_skipped`` in metrics.jsonl) but is the scale's search,
    not a non-finite step (not in nonfinite_steps or training.max_nonfinite_steps) until the scale sits at
    min_loss_scale, where the search is over and an overflow is a non-finite step."""

    def __post_init__(self) -> None:
        check_positive("optimizer.lr", self.lr)
        check_positive("optimizer.min_lr", self.min_lr, allow_zero=True)
        if self.min_lr > self.lr:
            raise fail("optimizer.min_lr", f"{self.min_lr} exceeds lr = {self.lr}")
        check_choice("optimizer.lr_decay_style", self.lr_decay_style, LR_DECAY_STYLES)
        check_positive("optimizer.lr_warmup_iters", self.lr_warmup_iters, allow_zero=True)
        check_positive("optimizer.num_train_epochs", self.num_train_epochs)
        if self.lr_decay_iters is not None and self.lr_decay_iters <= self.lr_warmup_iters:
            raise fail("optimizer.lr_decay_iters", f"{self.lr_decay_iters} must exceed lr_warmup_iters = {self.lr_warmup_iters}")
        check_positive("optimizer.weight_decay", self.weight_decay, allow_zero=True)
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise fail(f"optimizer.{name}", f"must lie in [0, 1), got {getattr(self, name)}")
        check_positive("optimizer.adam_eps", self.adam_eps)
        check_positive("optimizer.clip_grad", self.clip_grad, allow_zero=True)
        if self.loss_scale is not None:
            check_positive("optimizer.loss_scale", self.loss_scale)
        for name in ("initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis"):
            check_positive(f"optimizer.{name}", getattr(self, name))
        if self.min_loss_scale > self.initial_loss_scale:
            raise fail("optimizer.min_loss_scale", f"{self.min_loss_scale} exceeds initial_loss_scale = {self.initial_loss_scale}")


@dataclass
class TrainingConfig:
    """Batch sizes, step budget and seed."""

    micro_batch_size: int = 4
    """Sequences per forward/backward on one data-parallel rank (official per-device batch 4)."""
    global_batch_size: int = 32
    """Rollouts per optimizer step over all ranks (paper: effective batch 32)."""
    train_iters: int = 100
    """Optimizer steps to run (paper: the watcher stops at step 100)."""
    seed: int = 42
    """Seed of the model init, dropout and sampling (HF TrainingArguments default 42)."""
    max_nonfinite_steps: int = 3
    """Stop the run (one line naming the step and the NaN/inf: the loss, or which gradient on
    which rank) after this many consecutive steps with a non-finite loss or gradient. Each such
    step is skipped on every rank (no weight, Adam, LR-schedule or EMA-teacher change) and counted
    (``nonfinite_steps`` in metrics.jsonl); 0: never stop."""
    packing: bool = True
    """Pack each micro-batch's sequences into one row without padding (THD: positions restarting per
    sequence, attention kept inside each; ``parallel.layout``), padded only to a multiple of the TP size
    under sequence parallelism (and, under pipelining, to one length per rank); the update equals the padded
    one (PHF: the windows at every layer and the scored rows are addressed through each side's layout).
    Every method; the default (exact, and 1.35x the padded step on the real mix on CPU; 0.40x on one H200 before
    cuDNN attention was left out of the packed calls, not re-measured since: BENCHMARKS.md, issue 23).
    false: right-padded micro-batches."""
    max_tokens_per_microbatch: int | None = None
    """With --training.packing: group a step's samples into micro-batches by their token counts instead of
    micro_batch_size sequences each: spread over the data-parallel ranks by cost (LPT), then first-fit
    decreasing into micro-batches of at most this many packed tokens (``training.microbatch_plan``); a
    long sample gets a micro-batch of its own. A data row whose longest sequence (its longer prompt +
    rollout.max_tokens; with data.reason_first + data.reason_first_max_tokens; sft: prompt + solution within
    sft.max_length), padded as the layout pads, is over the budget alone stops the run at load, one line
    naming it and the smallest budget every row fits (``StepPlanner.check_rows``). The loss
    is normalized over the step's token count, so the update equals the fixed micro-batching's (up to
    float rounding). None: micro_batch_size sequences per micro-batch. Supported with --method=phf, sft and
    grpo (phf: student and teacher sequences each within the budget; one rollout engine group; grpo: not
    with grpo.loss_type=bnpo, each micro-batch's token mean)."""

    def __post_init__(self) -> None:
        for name in ("micro_batch_size", "global_batch_size", "train_iters"):
            check_positive(f"training.{name}", getattr(self, name))
        check_positive("training.max_nonfinite_steps", self.max_nonfinite_steps, allow_zero=True)
        if self.max_tokens_per_microbatch is not None:
            check_positive("training.max_tokens_per_microbatch", self.max_tokens_per_microbatch)
        if self.global_batch_size % self.micro_batch_size:
            raise fail("training.global_batch_size",
                       f"{self.global_batch_size} is not a multiple of micro_batch_size = {self.micro_batch_size}")


@dataclass
class CheckpointConfig:
    """Where and how often the run is saved (Megatron's iter_XXXXXXX layout)."""

    save: str | None = None
    """Checkpoint directory; None: <run_dir>/checkpoints."""
    load: str | None = None
    """Resume from this directory; None: from ``save`` when it holds a checkpoint."""
    save_interval: int = 50
    """Save every this many steps, and at the last step (official OPSD scripts at
    7448751: save_steps 25); 0: last step only (and a failing rollout engine's step)."""
    keep_last: int | None = None
    """Keep only the newest this many checkpoints; None: keep all (the paper evaluates step 100
    and plots the intermediate ones)."""
    model_format: str = "auto"
    """torch_dist (Megatron dist-checkpointing, reshardable) | per_rank (torch.save of each rank's
    trainable tensors, same layout to resume) | auto (per_rank with LoRA, torch_dist otherwise: the
    only formats the trainer writes, the other is refused; recorded in a run's config.yaml by an older
    trainer, which ignored it, it reads as auto)."""
    no_load_optim: bool = False
    """Do not restore the optimizer state on resume (Megatron's --no-load-optim)."""
    no_load_rng: bool = False
    """Do not restore the RNG states on resume (Megatron's --no-load-rng)."""
    strict_config: bool = True
    """Refuse to resume when a setting that changes the run's math differs from the checkpoint's."""
    exit_signal_handler: bool = True
    """On ``exit_signal`` (a scheduler's preemption): finish the step in flight, save a checkpoint and
    exit with 128 + the signal's number (Megatron's --exit-signal-handler); repeats are noted again, a
    second Ctrl-C stops at once; before the first step (the run starting) it stops at once, one line. torchrun kills its workers --shutdown-timeout seconds (default 30) after
    passing a signal on: leave a step and a save (examples/slurm/train_phf_multinode.sbatch)."""
    exit_signal: str = "SIGTERM"
    """The signal exit_signal_handler acts on: SIGTERM | SIGINT | SIGUSR1 | SIGUSR2."""

    def __post_init__(self) -> None:
        check_positive("checkpoint.save_interval", self.save_interval, allow_zero=True)
        if self.keep_last is not None:
            check_positive("checkpoint.keep_last", self.keep_last)
        check_choice("checkpoint.model_format", self.model_format, MODEL_FORMATS)
        check_choice("checkpoint.exit_signal", self.exit_signal, EXIT_SIGNALS)


@dataclass
class LoggingConfig:
    """What the run writes about itself (rank 0 only)."""

    log_interval: int = 1
    """Log metrics every this many steps (per-step layer energy needs 1)."""
    jsonl: bool = True
    """Write <run_dir>/metrics.jsonl, one line per logged step."""
    tensorboard: bool = False
    """Also write TensorBoard events."""
    tensorboard_dir: str | None = None
    """TensorBoard directory; None: <run_dir>/tensorboard."""
    progress_bar: bool = True
    """Show a tqdm bar with step time and loss."""
    log_layer_energy: bool = True
    """Log the per-layer flow energy and its spread (paper Section 4 diagnostics)."""
    loss_tokens_interval: int = 10
    """Every this many steps, write the 20 rollout tokens with the largest share of the step's
    OPSD loss (sft: the solution tokens' cross-entropy; grpo: its loss) to <run_dir>/loss_tokens.jsonl
    (style tokens such as "wait": OPSD issues #3, #20); 0: never."""
    verbose: bool = False
    """Show third-party warnings (Megatron's Transformer Engine / Apex fallbacks, deprecations),
    vLLM's INFO and WARNING log, and a spawned engine's tracebacks when it fails to start. Off: one line
    says which implementations run (and one what stopped an engine's start); progress bars stay."""
    wandb: bool = False
    """Also log to Weights & Biases (pip install wandb): the scalars TensorBoard gets, same names and
    steps, and the resolved config. A resume continues the same W&B run (its id in
    <run_dir>/wandb_run_id.txt) from the killed run's last step on."""
    wandb_project: str = "phf-megatron"
    """W&B project (Megatron's --wandb-project)."""
    wandb_exp_name: str | None = None
    """W&B run name (Megatron's --wandb-exp-name); None: the run directory's name."""
    wandb_entity: str | None = None
    """W&B entity (team or user); None: the logged-in user's default."""
    wandb_offline: bool = False
    """Write the W&B run to disk only (no network); upload it later with ``wandb sync DIR``."""
    wandb_save_dir: str | None = None
    """Where W&B writes its files (Megatron's --wandb-save-dir); None: <run_dir> (files under
    <run_dir>/wandb)."""


    def __post_init__(self) -> None:
        check_positive("logging.log_interval", self.log_interval)
        check_positive("logging.loss_tokens_interval", self.loss_tokens_interval, allow_zero=True)
        if self.wandb and not self.wandb_project:
            raise fail("logging.wandb_project", "is empty (W&B needs a project name)")
