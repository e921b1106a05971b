"""Step time against nodes, prompts per step and rollout length, for three placements of the
rollout engines (the model of ``docs/scaling.md``; its inputs are in ``scaling_inputs.py``, which
imports this module, never the reverse; the command is ``scaling.py``).

    python benchmarks/scaling.py                            # the tables of docs/scaling.md
    python benchmarks/scaling.py --plot runs/scaling.png    # + step time against nodes

Modes (``Setting`` fields in brackets):

* ``one``     (a) today: one engine, on global rank 0, samples every completion of the step; the
  token ids are broadcast to every rank.
* ``groups``  (b) ``rollout.num_engines = E`` [``engines``; None = one per node]: the ranks form E
  contiguous groups; the first rank of each hosts an engine that samples its group's prompts; ids
  go to the group only; each engine gets its weights from ranks of its own node.
* ``overlap`` (c) (b) with ``rollout.async_steps = 1``: the engines, on devices of their own (taken
  from the trainer's, or spare CPU cores), sample step k+1 while the trainer runs step k.

Step time (seconds), per step in the steady state:

    (a), (b):  T = T_roll(B_e) + T_ids + T_wake + T_host + T_train(D) + T_sync
    (c):       T = max(T_roll(B_e) + T_ids, T_host + T_train(D - E * d_e)) + T_sync

with B_e = ceil(prompts x n / E) sequences per engine, D devices, d_e devices per engine. The
sync blocks both sides in (c) too: the trainer gathers and pushes, the engine must not sample
with half-loaded weights. Every term is one function below, named after its equation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

MODES = ("one", "groups", "overlap")


@dataclass(frozen=True)
class DecodeCost:
    """What one rollout engine costs (seconds), as measured or projected."""

    fixed_s: float
    """one decode step whatever the batch: weights read once, scheduler, sampler (Eq. D)."""
    per_seq_s: float
    """what each concurrent sequence adds to a decode step."""
    per_ctx_token_s: float = 0.0
    """what each token of a sequence's context adds to a decode step (KV-cache reads)."""
    compute_per_seq_s: float = 0.0
    """compute floor of a step per sequence (the step is at least B x this: the batch saturates the device)."""
    prefill_fixed_s: float = 0.0
    """one generate call: its prefill step (Eq. P)."""
    prefill_per_token_s: float = 0.0
    """per prompt token prefilled."""
    per_request_s: float = 0.0
    """per sequence admitted (request set-up, first sampled token, output handling)."""
    kv_capacity_tokens: float = math.inf
    """tokens of KV cache an engine holds; more sequences than fit run in waves (Eq. R)."""


@dataclass(frozen=True)
class TrainCost:
    """What the trainer costs per device (seconds), as measured or projected."""

    student_s_per_token: float
    """student forward + backward with L_OPSD + alpha L_flow, per token (prompt + rollout)."""
    teacher_s_per_token: float
    """teacher forward with capture, per token (privileged prompt + rollout)."""
    optimizer_s: float
    """optimizer step + EMA update, per step."""


@dataclass(frozen=True)
class SyncCost:
    """What moving the weights costs (seconds), as measured or projected."""

    model_bytes: float
    """merged weights pushed into an engine (bytes in the engine's dtype)."""
    local_s: float
    """a verified sync into an engine on the node of its source ranks (gather, merge, push, probe)."""
    cross_node_bytes_per_s: float
    """the network between nodes (per node, one direction)."""
    wake_s: float = 0.0
    """colocated sleep mode: wake before rollouts + sleep after, per step (0: no sleep mode)."""


@dataclass(frozen=True)
class IdsCost:
    """What sending the completions' token ids to the ranks costs (``broadcast_object_list`` over gloo)."""

    latency_s: float
    """one hop of the broadcast tree."""
    bytes_per_id: float
    """pickled bytes per token id."""
    bytes_per_s: float
    """per hop."""


@dataclass(frozen=True)
class Costs:
    """One hardware / model / engine combination; ``source`` says where every number comes from."""

    name: str
    decode: DecodeCost
    train: TrainCost
    sync: SyncCost
    ids: IdsCost
    engine_devices: int = 1
    """devices an engine occupies (its tensor-parallel size on GPUs)."""
    host_s: float = 0.0
    """per step, outside the engine and the model passes: reading the rows, tokenizing, building micro-batches."""
    dedicated_decode: DecodeCost | None = None
    """the engine's costs when its devices are its own ((c) on GPUs: a larger KV cache); None = ``decode``."""
    source: str = ""


@dataclass(frozen=True)
class Setting:
    """One training configuration (defaults: the paper's, appendix "Hyperparameters")."""

    nodes: int = 1
    devices_per_node: int = 8
    prompts: int = 32
    """prompts per step (the global batch; the paper: 32)."""
    samples_per_prompt: int = 1
    """``rollout.n`` (the paper: 1)."""
    prompt_len: int = 256
    """student prompt tokens (mean)."""
    reference_len: int = 512
    """what the privileged prompt adds (reference solution), tokens."""
    rollout_len: int = 1024
    """tokens sampled per completion (the paper: 1024; every completion is taken to run to the end)."""
    engines: int | None = None
    """(b), (c): number of engines; None = one per node."""
    engines_take_trainer_devices: bool = True
    """(c): the engines' devices are taken from the trainer's (GPUs); False: they run on spare CPU cores."""
    sync_topology: str = "local"
    """local: every engine gets its weights from ranks of its own node (in parallel); funnel: one
    source sends the whole model to every other engine over the network, one after another."""

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples_per_prompt


def fit_line(x, y, relative: bool = False) -> tuple[float, float]:
    """Least-squares ``y ≈ a + b x``; returns ``(a, b)``. ``relative``: weights 1/y², so every point
    counts by its relative error (a step time at B = 1 as much as one at B = 64)."""
    n = len(x)
    if n != len(y) or n == 0:
        raise ValueError(f"fit_line: need as many x as y values, at least one (got {len(x)} and {len(y)})")
    w = [1.0 / (v * v) if relative and v else 1.0 for v in y]
    sw = sum(w)
    mx, my = sum(wi * xi for wi, xi in zip(w, x)) / sw, sum(wi * yi for wi, yi in zip(w, y)) / sw
    sxx = sum(wi * (xi - mx) ** 2 for wi, xi in zip(w, x))
    b = sum(wi * (xi - mx) * (yi - my) for wi, xi, yi in zip(w, x, y)) / sxx if sxx > 0 else 0.0
    return my - b * mx, b


# ---------------------------------------------------------------------------------------- equations

def decode_step_s(c: DecodeCost, batch: int, context: float) -> float:
    """Eq. D: one decode step of ``batch`` sequences with ``context`` tokens each,
    t(B, c) = max(f + B (s + c k), B q): flat in B while the batch is latency-bound, linear once it
    saturates the device."""
    if batch <= 0:
        return 0.0
    return max(c.fixed_s + batch * (c.per_seq_s + context * c.per_ctx_token_s), batch * c.compute_per_seq_s)


def prefill_s(c: DecodeCost, sequences: int, prompt_len: int) -> float:
    """Eq. P: admitting ``sequences`` prompts of ``prompt_len`` tokens and sampling their first
    token, f_p + B (r + P k_p)."""
    if sequences <= 0:
        return 0.0
    return c.prefill_fixed_s + sequences * (c.per_request_s + prompt_len * c.prefill_per_token_s)


def wave_s(c: DecodeCost, batch: int, prompt_len: int, rollout_len: int) -> float:
    """Eq. W: one wave of ``batch`` concurrent sequences: the prefill (which samples token 1), then
    the decode steps of tokens 2 .. L, sum of t(B, P + i) for i = 1 .. L-1 (closed form: the affine
    part grows by B k per step and crosses the compute floor B q at most once)."""
    if batch <= 0 or rollout_len <= 0:
        return 0.0
    steps = rollout_len - 1
    a = c.fixed_s + batch * (c.per_seq_s + (prompt_len + 1) * c.per_ctx_token_s)   # affine part, first decode step
    g = batch * c.per_ctx_token_s                                                  # its growth per step
    floor = batch * c.compute_per_seq_s
    if g > 0:
        below = min(steps, max(0, math.ceil((floor - a) / g)))                    # steps where the floor wins
    else:
        below = steps if floor > a else 0
    n = steps - below
    affine = n * a + g * (below * n + n * (n - 1) / 2)                           # sum of a + g j, j = below .. steps-1
    return prefill_s(c, batch, prompt_len) + below * floor + affine


def rollout_s(c: DecodeCost, sequences: int, prompt_len: int, rollout_len: int) -> tuple[float, int]:
    """Eq. R: one engine sampling ``sequences`` completions; as many run together as the KV cache
    holds at full length (cap = floor(capacity / (P + L))), the rest in further waves. Returns
    (seconds, waves)."""
    if sequences <= 0:
        return 0.0, 0
    cap = c.kv_capacity_tokens / (prompt_len + rollout_len)
    if cap < 1:
        raise ValueError(f"rollout_len: one sequence of {prompt_len} + {rollout_len} tokens does not fit the "
                         f"engine's KV cache ({c.kv_capacity_tokens:.0f} tokens)")
    cap = sequences if math.isinf(cap) else int(cap)
    full, rest = divmod(sequences, cap)
    return full * wave_s(c, cap, prompt_len, rollout_len) + wave_s(c, rest, prompt_len, rollout_len), full + (rest > 0)


def train_s(c: TrainCost, sequences: int, devices: int, s: Setting) -> float:
    """Eq. T: teacher forward + student forward/backward over the step's sequences, split evenly
    over ``devices`` (ideal data parallelism), + the optimizer step."""
    if devices <= 0:
        raise ValueError(f"devices: the trainer has {devices} devices left (engines take them all)")
    student = s.prompt_len + s.rollout_len
    teacher = s.prompt_len + s.reference_len + s.rollout_len
    per_sequence = c.student_s_per_token * student + c.teacher_s_per_token * teacher
    return sequences * per_sequence / devices + c.optimizer_s


def sync_s(c: SyncCost, engines: int, topology: str) -> float:
    """Eq. S: weights into every engine after the optimizer step. local: every engine from its own
    node's ranks, all at once (the time of one); funnel: the first engine locally, every other one
    over the network from the same source, one after another."""
    if topology == "local":
        return c.local_s
    if topology == "funnel":
        return c.local_s + (engines - 1) * c.model_bytes / c.cross_node_bytes_per_s
    raise ValueError(f"sync_topology: {topology!r} is not one of local, funnel")


def ids_s(c: IdsCost, sequences: int, rollout_len: int, ranks: int) -> float:
    """Eq. I: broadcasting ``sequences`` x L token ids from an engine's host rank to ``ranks`` ranks
    (a tree: ceil(log2 ranks) hops of latency + bytes / bandwidth)."""
    if ranks <= 1 or sequences <= 0:
        return 0.0
    nbytes = sequences * rollout_len * c.bytes_per_id
    return math.ceil(math.log2(ranks)) * (c.latency_s + nbytes / c.bytes_per_s)


# ---------------------------------------------------------------------------------------- the step

@dataclass(frozen=True)
class Step:
    """One step's parts (seconds) and the layout behind them."""

    mode: str
    engines: int
    sequences_per_engine: int
    waves: int
    train_devices: int
    rollout_s: float
    ids_s: float
    wake_s: float
    train_s: float
    """host work + the model passes + the optimizer."""
    sync_s: float
    total_s: float


def step_time(s: Setting, c: Costs, mode: str) -> Step:
    """Eq. (a) / (b) / (c) of the module docstring."""
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {MODES}")
    engines = 1 if mode == "one" else (s.engines or s.nodes)
    if engines < 1 or engines * c.engine_devices > s.devices:
        raise ValueError(f"engines: {engines} engines of {c.engine_devices} devices do not fit {s.devices} devices")
    per_engine = math.ceil(s.sequences / engines)
    dedicated = mode == "overlap" and s.engines_take_trainer_devices and c.dedicated_decode is not None
    roll, waves = rollout_s(c.dedicated_decode if dedicated else c.decode, per_engine, s.prompt_len, s.rollout_len)
    ids = ids_s(c.ids, per_engine, s.rollout_len, s.devices // engines)
    sync = sync_s(c.sync, engines, "local" if engines == 1 else s.sync_topology)
    if mode == "overlap":
        devices = s.devices - (engines * c.engine_devices if s.engines_take_trainer_devices else 0)
        train = c.host_s + train_s(c.train, s.sequences, devices, s)
        return Step(mode, engines, per_engine, waves, devices, roll, ids, 0.0, train, sync, max(roll + ids, train) + sync)
    train = c.host_s + train_s(c.train, s.sequences, s.devices, s)
    wake = c.sync.wake_s
    return Step(mode, engines, per_engine, waves, s.devices, roll, ids, wake, train, sync, roll + ids + wake + train + sync)


def regime(s: Setting, c: Costs) -> dict:
    """Where a setting sits: the rollout's share of today's step, and whether its decode is
    latency-bound (a step of the whole batch costs < 2x a step of one sequence)."""
    a = step_time(s, c, "one")
    mid = s.prompt_len + s.rollout_len / 2
    one, full = decode_step_s(c.decode, 1, mid), decode_step_s(c.decode, min(a.sequences_per_engine, _cap(c, s)), mid)
    return {"rollout_share": (a.rollout_s + a.ids_s) / a.total_s, "batch_step_over_single": full / one,
            "latency_bound": full / one < 2.0, "waves": a.waves}


def _cap(c: Costs, s: Setting) -> int:
    cap = c.decode.kv_capacity_tokens / (s.prompt_len + s.rollout_len)
    return s.sequences if math.isinf(cap) else max(1, int(cap))


# ---------------------------------------------------------------------------------------- tables

def _fmt(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


LABELS = {"one": "(a) one engine", "groups": "(b) engine groups", "overlap": "(c) overlap"}


def table(rows: list[tuple[str, Setting]], c: Costs, engines: dict[str, int] | None = None) -> str:
    """Markdown: one line per setting and mode, step time and its parts (seconds); ``engines``
    overrides ``Setting.engines`` per mode (e.g. one engine per GPU in (b), one in (c))."""
    out = ["| setting | mode | engines x seqs (waves) | rollout | ids | host + train (devices) | sync + wake | step |",
           "|---|---|---|---|---|---|---|---|"]
    for label, s in rows:
        for mode in MODES:
            try:
                t = step_time(replace(s, engines=(engines or {}).get(mode, s.engines)), c, mode)
            except ValueError as err:
                out.append(f"| {label} | {LABELS[mode]} | — | — | — | — | — | {err} |")
                continue
            out.append(f"| {label} | {LABELS[mode]} | {t.engines} x {t.sequences_per_engine} ({t.waves}) | {_fmt(t.rollout_s)} | "
                       f"{_fmt(t.ids_s)} | {_fmt(t.train_s)} ({t.train_devices}) | {_fmt(t.sync_s + t.wake_s)} | "
                       f"**{_fmt(t.total_s)}** |")
    return "\n".join(out)


def plot(path: str, c: Costs, base: Setting, nodes=(1, 2, 4, 8, 16), prompts_per_node: int | None = None) -> None:
    """Step time against nodes for the three modes (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in MODES:
        xs, ys = [], []
        for n in nodes:
            s = replace(base, nodes=n, prompts=prompts_per_node * n if prompts_per_node else base.prompts)
            try:
                ys.append(step_time(s, c, mode).total_s)
                xs.append(n)
            except ValueError:
                pass
        ax.plot(xs, ys, marker="o", label=LABELS[mode] + (" per node" if mode == "groups" else ""))
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(nodes), [str(n) for n in nodes])
    ax.set_xlabel("nodes")
    ax.set_ylabel("step time (s)")
    per = f"{prompts_per_node} prompts per node" if prompts_per_node else f"{base.prompts} prompts"
    ax.set_title(f"{c.name}: {per} x {base.rollout_len} tokens (model; decode projected)", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
