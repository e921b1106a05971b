"""EvalConfig: one Average@k evaluation, with the paper's defaults."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields

from phf_megatron.models.choices import DTYPE_SPELLINGS, dtype_name
from phf_megatron.rollout.choices import BACKENDS, ENGINE_SET_VLLM_KWARGS, vllm_kwargs_problem

PAPER_BENCHMARKS = ("aime24", "aime25", "hmmt25")
#: The graders (``grading.grade``), each an Avg@k column: ``official`` (the paper's numbers) and ``extended``; here,
#: without math-verify, so that ``--grader`` is checked before anything heavy loads.
GRADERS = ("official", "extended")
#: What official OPSD's eval/evaluate_math.py (7448751) picks when unset, by thinking mode:
#: top-p (lines 653-654) and the engine's context length (lines 114-116).
OFFICIAL_TOP_P = {True: 0.95, False: 0.8}
OFFICIAL_MAX_MODEL_LEN = {True: 40_960, False: 32_768}
#: The ``EngineConfig`` fields the eval sets from its own flags (``runner.generate_samples``): refused in
#: ``--engine_kwargs``, which would pass them twice.
ENGINE_FIELDS_SET = {"model_dir": "--model", "backend": "--backend", "dtype": "--dtype", "seed": "--seed",
                     "max_model_len": "--max_model_len"}
#: The flag each ``vllm.LLM`` keyword the eval's engine sets comes from: refused in ``--engine_kwargs '{vllm_kwargs:
#: ...}'`` naming it (the engine's own keywords, absent, named as such).
VLLM_KWARG_FLAGS = {key: ENGINE_FIELDS_SET.get(name, f"--engine_kwargs {name}")
                    for key, name in ENGINE_SET_VLLM_KWARGS.items() if name}

#: The settings a rerun into an out_dir must share with its samples to resume them (``generation_fingerprint``,
#: with top_p and max_model_len as the engine gets them, the model and the backend); --n, --limit, --benchmarks resume.
GENERATION_KEYS = ("temperature", "top_k", "max_new_tokens", "thinking", "seed", "dtype", "data_revision")


@dataclass
class EvalConfig:
    """Paper defaults (Appendix C): n=12, T=1.0, top-p 0.95, top-k off, 38,912 new tokens, thinking,
    graded by the official OPSD grader. Without thinking the official script's own defaults apply
    (top-p 0.8, context 32,768)."""

    out_dir: str
    """run directory (a rerun resumes it): samples.rank*.jsonl, summary.json, run_config.json, and
    merged_model/ (with adapter), converted_model/ (with megatron_checkpoint), avg_at_k.png (with plot)."""
    model: str | None = None
    """HF model directory (the base model when ``adapter`` or a training run's checkpoint is given). A resume must
    find the same files (their digest): samples of a model retrained or overwritten in place are not mixed."""
    adapter: str | None = None
    """PEFT adapter directory, merged into ``model`` (into <out_dir>/merged_model) before evaluation. A resume
    must find the same adapter and base files (their digests): samples of an adapter retrained since are not mixed
    with the new one's."""
    megatron_checkpoint: str | None = None
    """Megatron-Core checkpoint converted to HF on the fly into <out_dir>/converted_model: hf_to_mcore's,
    or a training run's (runs/x/checkpoints/iter_N; runs/x or runs/x/checkpoints: its latest, also where the
    run's checkpoint.save put them; LoRA merged;
    ``model``, else the run's model.hf_dir, is its base). A resume must find the same iteration: samples of a
    run's earlier latest are not mixed with a later one's."""
    benchmarks: tuple[str, ...] = PAPER_BENCHMARKS
    """names (aime24, aime25, hmmt25) or paths to .jsonl files with problem/answer fields."""
    data_dir: str | None = None
    """where the names' problems come from: None = the copies shipped with the package
    (phf_megatron/eval/sets/, offline); a directory holding <name>.jsonl; or hub = the HF datasets
    official OPSD evaluates on (needs `datasets` and network, or the cache with HF_HUB_OFFLINE=1)."""
    data_revision: str | None = None
    """with data_dir=hub: the Hub revision (commit SHA, tag or branch) of every set; None = main, which
    moves (summary.json then says "main (unpinned)"). Pin a commit SHA for published numbers."""
    n: int = 12
    """samples per problem (k of Average@k)."""
    temperature: float = 1.0
    """sampling temperature (paper, evaluation protocol: 1.0)."""
    top_p: float | None = None
    """None: the official choice, 0.95 with thinking (paper), 0.8 without (``sampling_top_p``)."""
    top_k: int = -1
    """-1 or 0 = off."""
    max_new_tokens: int = 38_912
    """most new tokens per sample (paper: 38,912)."""
    thinking: bool = True
    """Qwen3 chat template enable_thinking."""
    seed: int = 0
    """sample i of problem p uses seed hash(seed, benchmark, p, i): reruns and resumes reproduce it."""
    backend: str = "auto"
    """auto (vLLM if installed) | vllm | hf | vllm_server (a running vLLM server, --engine_kwargs '{server_url:
    http://host:port}', evaluates the model named here: --model, the merged --adapter, the converted checkpoint;
    its weights are pushed into the server before sampling, as the trainer pushes; the server must serve a model of
    the same architecture in --dtype, started in dev mode with our worker extension: rollout/server_process.py)."""
    dtype: str = "bfloat16"
    """the engine's weight dtype: bfloat16 | float16 | float32 (or bf16 | fp16 | fp32)."""
    max_model_len: int | None = None
    """engine context length (prompt + completion); None: the official choice, 40,960 with thinking,
    32,768 without, never above the model's max_position_embeddings (``engine_max_model_len``)."""
    data_parallel: int = 0
    """engine replicas, each on tensor_parallel_size GPUs; 0 = as many as the visible GPUs allow (1 on CPU;
    1 with --backend vllm_server, whose server generates every sample).
    Replica r takes the r-th slice of the GPUs this process sees (of its ``CUDA_VISIBLE_DEVICES`` when set)."""
    batch_size: int = 512
    """samples per engine call; each finished call is written to disk before the next (the bar moves as each
    sample finishes)."""
    grader: str = "official"
    """the grader of the headline Avg@k, pass@k and plot: official (OPSD eval/evaluate_math.py at
    7448751, the paper's numbers) | extended (ours: the official verdict or our fallbacks,
    ``eval/grading.py``). Both Avg@k columns are always reported."""
    require_boxed: bool = True
    """extended grader: an output without \\boxed is wrong, as in the official rule (False:
    math-verify's fallback extraction on the whole output)."""
    limit: int | None = None
    """evaluate only the first N problems of each benchmark (smoke runs)."""
    pass_ks: tuple[int, ...] = (1,)
    """pass@k values reported besides pass@n, each in [1, n] (another is refused at the start)."""
    plot: bool = False
    """also write avg_at_k.png (needs matplotlib)."""
    keep_model: bool = True
    """keep the HF model the run made (merged_model/, converted_model/) in out_dir; false: delete it at
    the end (a rerun that has samples to generate makes it again)."""
    engine_kwargs: dict = field(default_factory=dict)
    """extra EngineConfig fields (e.g. gpu_memory_utilization, tensor_parallel_size; vllm_kwargs: a mapping of
    extra vllm.LLM keywords, e.g. {vllm_kwargs: {attention_backend: TRITON_ATTN}}); not those the eval's own flags
    set (ENGINE_FIELDS_SET: --seed, --max_model_len, --dtype, ...)."""

    def __post_init__(self) -> None:
        from .benchmarks import HUB, check_benchmarks

        self.benchmarks = tuple(self.benchmarks)
        check_benchmarks(self.benchmarks, self.data_dir)     # a missing file: one line at once, before torch
        if self.data_revision is not None and self.data_dir != HUB:
            raise ValueError(f"data_revision: {self.data_revision!r}: a Hub revision (commit SHA, tag or branch), "
                             f"only with --data_dir {HUB} (the shipped sets and data directories have none)")
        if not self.benchmarks:
            raise ValueError("benchmarks: give at least one")
        if self.n < 1:
            raise ValueError(f"n: must be >= 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be >= 1, got {self.max_new_tokens}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: {self.backend!r} is not one of {BACKENDS}")
        if self.data_parallel < 0:
            raise ValueError(f"data_parallel: must be >= 0 (0 = all GPUs), got {self.data_parallel}")
        if self.data_parallel > 1 and self.backend == "vllm_server":   # one client pushes the model, once
            raise ValueError(f"data_parallel: {self.data_parallel} replicas, and --backend vllm_server has the server "
                             "generate every sample on its own GPUs: leave it out")
        if self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        self.pass_ks = tuple(self.pass_ks)
        if bad := [k for k in self.pass_ks if not 1 <= k <= self.n]:   # was left out of the scores in silence
            raise ValueError(f"pass_ks: each must lie in [1, n={self.n}] (pass@k of n samples), got {bad[0]}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit: must be >= 1 or None, got {self.limit}")
        if self.model is None and self.megatron_checkpoint is None:
            raise ValueError("model: give a HF model directory, or megatron_checkpoint")
        if self.grader not in GRADERS:
            raise ValueError(f"grader: {self.grader!r} is not one of {GRADERS}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must lie in (0, 1] or be None (official), got {self.top_p}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len: must be >= 1 or None (official), got {self.max_model_len}")
        if os.path.exists(self.out_dir) and not os.path.isdir(self.out_dir):   # not once the model is loaded
            raise ValueError(f"out_dir: {self.out_dir} is not a directory")
        if self.dtype not in DTYPE_SPELLINGS:   # the engine's check named the torch spellings only
            raise ValueError(f"dtype: {self.dtype!r} is not one of {DTYPE_SPELLINGS}")
        self.dtype = dtype_name(self.dtype)   # bf16 was refused here, taken by the converters
        self._check_engine_settings()

    def _check_engine_settings(self) -> None:
        """The sampler's and the engine's own checks, run before any work (not when the engine
        starts): a bad --temperature, --top_k, --dtype or --engine_kwargs is one line naming its flag."""
        from phf_megatron.cli import did_you_mean
        from phf_megatron.rollout.factory import EngineConfig
        from phf_megatron.rollout.types import SamplingParams

        SamplingParams(temperature=self.temperature, top_p=self.sampling_top_p, top_k=self.top_k,
                       max_tokens=self.max_new_tokens)
        for key, flag in ENGINE_FIELDS_SET.items():   # runner.generate_samples passes them: a duplicate keyword there
            if key in self.engine_kwargs:
                raise ValueError(f"engine_kwargs: {key} is set by the eval from {flag}: give it there")
        known = [f.name for f in fields(EngineConfig) if f.name not in ENGINE_FIELDS_SET]
        for key in self.engine_kwargs:   # was "EngineConfig.__init__() got an unexpected keyword argument"
            if key not in known:
                hint = did_you_mean(str(key), known) or f" (its fields: {', '.join(known)})"
                raise ValueError(f"engine_kwargs: {key!r} is not an EngineConfig field{hint}")
        problem = vllm_kwargs_problem(self.engine_kwargs.get("vllm_kwargs", {}), self.backend, VLLM_KWARG_FLAGS,
                                      by="the eval", backend_flag="--backend")
        if problem is not None:
            raise ValueError(f"engine_kwargs: vllm_kwargs: {problem}")
        try:
            EngineConfig(model_dir="", backend=self.backend, dtype=self.dtype, **self.engine_kwargs)
        except (TypeError, ValueError) as err:
            if isinstance(err, ValueError) and str(err).partition(":")[0] in ("backend", "dtype"):
                raise
            raise ValueError(f"engine_kwargs: {err}") from None

    @property
    def sampling_top_p(self) -> float:
        """``top_p``, or the official choice for the thinking mode."""
        return OFFICIAL_TOP_P[self.thinking] if self.top_p is None else self.top_p

    def engine_max_model_len(self, model_limit: int | None) -> int:
        """``max_model_len``, or the official choice capped at ``model_limit`` (the model's own)."""
        if self.max_model_len is not None:
            return self.max_model_len
        official = OFFICIAL_MAX_MODEL_LEN[self.thinking]
        return official if model_limit is None else min(official, model_limit)

    def generation_fingerprint(self, model_dir: str, backend: str, model_limit: int | None = None) -> dict:
        """What fixes the samples: a rerun into the same out_dir must match it to resume (the
        top-p and context length as the engine gets them)."""
        fp = {k: getattr(self, k) for k in GENERATION_KEYS}
        fp.update(top_p=self.sampling_top_p, max_model_len=self.engine_max_model_len(model_limit),
                  model_dir=model_dir, backend=backend, adapter=self.adapter,
                  megatron_checkpoint=self.megatron_checkpoint)
        if backend == "vllm_server":   # samples of a server before its weights were pushed are not mixed in
            fp["server_weights"] = "pushed from model_dir"
        return fp

    def to_json(self) -> dict:
        return asdict(self)


def sample_seed(seed: int, benchmark: str, problem_id: str, sample_index: int) -> int:
    """A stable 31-bit seed for one sample (independent of batching, order and resumption)."""
    h = hashlib.sha256(json.dumps([seed, benchmark, problem_id, sample_index]).encode()).digest()
    return int.from_bytes(h[:8], "little") % (2**31 - 1)
