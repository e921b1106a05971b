"""What the evaluator can load, reduced to one HF model directory for the rollout engine.

- a HF model directory: used as is;
- a base HF directory + a PEFT (LoRA) adapter: merged with ``peft`` into ``<run>/merged_model``;
- a Megatron-Core checkpoint: converted to HF into ``<run>/converted_model`` by
  ``phf_megatron.convert`` in a separate process (see :func:`convert_megatron`); a training run's
  checkpoint (``runs/x/checkpoints/iter_N``; ``runs/x/checkpoints`` or ``runs/x``: its latest) by the
  converter's command, LoRA merged (``model``: its base model, default the run's ``model.hf_dir``).

Outputs are written to a temporary directory and renamed when complete (``output_files``), and
marked with what they were made from (``phf_source.json``, written last), so a kill never leaves a
half-written model that a rerun would trust; a rerun reuses a finished one.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from phf_megatron.errors import ConfigError, InputFileError, ReleaseCheckpoint, UserError, write_failure
from phf_megatron.input_files import (
    LATEST_FILE, check_hf_model_dir, check_peft_adapter_dir, checkpoint_names, iter_dir_name, missing_dir, read_json,
    read_latest, saved_checkpoints_dir,
)
from phf_megatron.output_files import atomic_dir, remove, write_json
from phf_megatron.runtime.children import Reaper, run_reaped
from phf_megatron.startup import hf_progress_bars_off
from phf_megatron.tokenizer import has_tokenizer_files, load_qwen3_tokenizer

#: What a finished output was made from (a rerun reuses the output when it matches).
MARKER = "phf_source.json"


def check_hf_config(path: str, what: str = "model") -> None:
    """``path`` is a directory with a ``config.json`` that is a JSON object; else one line naming ``--model``, the
    flag that gave it (or the damaged file). What ``model_context_limit`` reads: checked before a resume's planned
    fingerprint reads it (the eval's, paper_table's), as before a merge."""
    if why := missing_dir(path):
        raise ConfigError("model", why)
    if not os.path.isfile(os.path.join(path, "config.json")):   # a run's output given as the model: say which flag
        hint = "; a training run: give it as --megatron_checkpoint" if is_training_checkpoint(path) else ""
        raise ConfigError("model", f"{path} has no config.json (not a HF {what} directory{hint})")
    if not isinstance(read_json(os.path.join(path, "config.json")), dict):
        raise InputFileError(os.path.join(path, "config.json"), "expected a JSON object")


def check_hf_dir(path: str, what: str = "model") -> str:
    """``path`` is a HF model directory; else one line naming ``--model``, the flag that gave it."""
    check_hf_config(path, what)
    check_hf_model_dir(path, weights=True)  # a damaged or missing file is named before an engine loads it
    return path


def model_context_limit(model_dir: str) -> int | None:
    """The model's ``max_position_embeddings`` (config.json), None if it does not say."""
    with open(os.path.join(model_dir, "config.json")) as f:
        limit = json.load(f).get("max_position_embeddings")
    return int(limit) if limit else None


def _reusable(final: str, marker: dict) -> bool:
    path = os.path.join(final, MARKER)
    if not os.path.isfile(path):
        return False
    try:
        return read_json(path) == marker
    except InputFileError:   # damaged (was a JSONDecodeError traceback): the output is made again
        return False


def _say(what: str) -> None:
    """A step that takes minutes at 8B, said before it starts (stderr: stdout is the table)."""
    print(f"eval: {what}", file=sys.stderr, flush=True)


def _save_tokenizer(src_dirs: list[str], out_dir: str) -> None:
    """The first source directory holding tokenizer files (``has_tokenizer_files``), else the shipped Qwen3 tokenizer."""
    for d in src_dirs:
        if has_tokenizer_files(d):
            load_qwen3_tokenizer(d).save_pretrained(out_dir)
            return
    load_qwen3_tokenizer().save_pretrained(out_dir)


def merged_model_dir(run_dir: str) -> str:
    """Where ``merge_adapter`` writes the merged model (the eval's model directory with an adapter)."""
    return os.path.join(run_dir, "merged_model")


#: ``merge_inputs`` reads a base model's weight file at this many evenly spaced offsets, this many bytes each.
SAMPLES, SAMPLE_BYTES = 16, 1 << 16


def _files_digest(paths: list[str], *, sampled: bool) -> str:
    """16 hex digits of sha256 over each file's name, size and bytes; ``sampled``: a file over SAMPLES x
    SAMPLE_BYTES contributes those SAMPLES chunks only (a few MiB read for a multi-GB model)."""
    h = hashlib.sha256()
    for path in filter(os.path.isfile, paths):
        size = os.path.getsize(path)
        h.update(f"{os.path.basename(path)}:{size};".encode())
        with open(path, "rb") as f:
            if sampled and size > SAMPLES * SAMPLE_BYTES:
                for i in range(SAMPLES):
                    f.seek(i * (size - SAMPLE_BYTES) // (SAMPLES - 1))
                    h.update(f.read(SAMPLE_BYTES))
            else:
                for block in iter(lambda: f.read(1 << 24), b""):
                    h.update(block)
    return h.hexdigest()[:16]


def merge_inputs(base_dir: str, adapter_dir: str) -> dict:
    """What a merged model is made from, as the eval's resume compares it (``base_digest``, ``adapter_digest``):
    the adapter's ``adapter_config.json`` and weights read whole (a LoRA is ~1% of its base: what is retrained in
    place), the base's ``config.json``, weight index and weight files by name, size and sampled bytes (training
    changes nearly every tensor; no multi-GB read on each resume)."""
    adapter = [os.path.join(adapter_dir, n) for n in ("adapter_config.json", "adapter_model.safetensors",
                                                      "adapter_model.bin")]
    return {"base_digest": model_digest(base_dir), "adapter_digest": _files_digest(adapter, sampled=False)}


def model_digest(model_dir: str) -> str:
    """A HF model directory's ``config.json``, weight index and weight files by name, size and sampled bytes
    (``_files_digest``): what the eval's resume compares of a plain ``--model`` (``model_digest``) and of an
    adapter's base (``base_digest``), retrained or overwritten in place."""
    return _files_digest([os.path.join(model_dir, n) for n in sorted(os.listdir(model_dir))
                          if n == "config.json" or n.endswith((".safetensors", ".bin", ".index.json"))], sampled=True)


def merged_inputs(model_dir: str) -> dict:
    """The ``merge_inputs`` ``merge_adapter`` made ``model_dir`` from (its marker)."""
    marker = read_json(os.path.join(model_dir, MARKER))
    return {key: marker[key] for key in ("base_digest", "adapter_digest")}


def merge_adapter(base_dir: str, adapter_dir: str, run_dir: str, *, dtype: str = "bfloat16",
                  inputs: dict | None = None) -> str:
    """Merge a PEFT adapter into its base; returns ``<run_dir>/merged_model``. ``inputs``: their ``merge_inputs``
    when the caller has read them already (the eval's resume check), else read here."""
    check_hf_dir(base_dir, "base model")
    if why := missing_dir(adapter_dir):
        raise ConfigError("adapter", why)
    if not os.path.isfile(os.path.join(adapter_dir, "adapter_config.json")):
        export = os.path.join(adapter_dir, "export", "peft_adapter")
        hint = (f"; a training run: did you mean {export}?" if os.path.isdir(export) else
                "; a training checkpoint: give it as --megatron_checkpoint" if is_training_checkpoint(adapter_dir)
                else "")
        raise ConfigError("adapter", f"{adapter_dir} has no adapter_config.json (not a PEFT adapter directory{hint})")
    check_peft_adapter_dir(adapter_dir)   # a damaged or missing file is named before peft loads it
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    final = merged_model_dir(run_dir)
    marker = {"base": os.path.abspath(base_dir), "adapter": os.path.abspath(adapter_dir), "dtype": dtype,
              **(inputs or merge_inputs(base_dir, adapter_dir))}   # a retrained adapter or base in place: merged again
    if _reusable(final, marker):
        return final
    _say(f"merging {adapter_dir} into {base_dir} in {final} (a rerun reuses it)")
    with hf_progress_bars_off():   # that line says it, not transformers' "Loading weights" / "model shards" bars
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=getattr(torch, dtype), local_files_only=True)
        try:
            merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
        except RuntimeError as err:           # "Error(s) in loading state_dict ... size mismatch for ..."
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            shown = next((line for line in lines if "mismatch" in line), lines[0] if lines else type(err).__name__)
            more = sum("mismatch" in line for line in lines) - 1
            raise InputFileError(adapter_dir, f"does not fit the base model {base_dir}: {shown}"
                                              + (f" (and {more} more)" if more > 0 else "")) from None
        with atomic_dir(final) as tmp:
            merged.save_pretrained(tmp)
            _save_tokenizer([adapter_dir, base_dir], tmp)
            write_json(os.path.join(tmp, MARKER), marker, indent=1)
    return final


def _convert_entry(mcore_dir: str, out_dir: str, tokenizer_dir: str | None, errors) -> None:
    from ..runtime.process_group import RENDEZVOUS_VARS

    for name in RENDEZVOUS_VARS:          # a group of its own, not the parent's (whose port is taken)
        os.environ.pop(name, None)
    try:
        from phf_megatron.convert.checkpoints import convert_mcore_to_hf
        convert_mcore_to_hf(mcore_dir, out_dir, tokenizer_dir=tokenizer_dir)   # its bar: the parent's stderr
    except BaseException as exc:          # report to the parent, then fail the process
        user = exc if isinstance(exc, (UserError, FileNotFoundError, FileExistsError)) else write_failure(exc)
        if user is None:                  # a bug: its traceback stays
            errors.put((False, f"{type(exc).__name__}: {exc}"))
            raise
        errors.put((True, user.line if isinstance(user, UserError) else str(user)))
        sys.exit(2)                       # a user's error: the parent names it, no traceback here


def _convert_training_checkpoint(ckpt_dir: str, out_dir: str, *, base_model: str | None) -> None:
    """A checkpoint of ``phf_megatron.train`` -> the merged HF model, by the converter's command
    (``tools/convert/mcore_to_hf.py``: the run's config, base model and adapters); its one-line
    errors stay one line."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "phf_megatron.tools.mcore_to_hf", "--mcore_dir", ckpt_dir, "--out_dir", out_dir,
           *(["--base_model", base_model] if base_model else [])]
    from ..runtime.process_group import standalone_environ

    proc = run_reaped(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=standalone_environ())
    if proc.returncode == 2:
        why = proc.stderr.strip().splitlines()[-1].removeprefix("error: ")
        raise UserError(f"--megatron_checkpoint: a training checkpoint; tools/convert/mcore_to_hf.py says: {why}")
    if proc.returncode:
        raise RuntimeError(f"converting the training checkpoint {ckpt_dir!r} to HF failed (exit code "
                           f"{proc.returncode}):\n{proc.stderr[-3000:]}")


def is_training_checkpoint(path: str) -> bool:
    """``path`` is what --megatron_checkpoint takes of a training run: one ``iter_N``, its checkpoints directory
    or the run directory (a latest iteration found)."""
    return os.path.isfile(os.path.join(path, "meta.json")) or latest_checkpoint(path) != path


def latest_checkpoint(path: str) -> str:
    """A training run's checkpoints directory (``latest_checkpointed_iteration.txt``), or the run
    directory above it (its checkpoints where its ``config.yaml``'s ``checkpoint.save`` put them, as
    ``mcore_to_hf`` finds them): its latest ``iter_N``, as Megatron resumes from it; any other path as given
    (one whose latest file says ``release`` too: Megatron-LM's base model, no run's, which ``read_latest``
    refuses naming the trainer's flag)."""
    save_dir = path if os.path.isfile(os.path.join(path, LATEST_FILE)) else (
        saved_checkpoints_dir(path) or os.path.join(path, "checkpoints"))
    try:
        iteration = read_latest(save_dir)
    except ReleaseCheckpoint:
        return path
    return path if iteration is None else os.path.join(save_dir, iter_dir_name(iteration))


def convert_megatron(mcore_dir: str, run_dir: str, *, tokenizer_dir: str | None = None) -> str:
    """Convert a Megatron-Core checkpoint to HF in ``<run_dir>/converted_model``.

    Runs ``phf_megatron.convert.checkpoints.convert_mcore_to_hf`` (what
    ``tools/convert/mcore_to_hf.py`` runs) in a spawned process: it sets up a process group,
    Megatron's parallel state and, on CPU, process-wide CUDA shims, none of which may leak into
    the evaluator's process (vLLM starts its own distributed state there).
    """
    import multiprocessing as mp

    if why := missing_dir(mcore_dir):
        raise ConfigError("megatron_checkpoint", why)
    if (latest := latest_checkpoint(mcore_dir)) != mcore_dir:   # converted, and reused, as that iteration
        if missing_dir(latest):
            there = checkpoint_names(os.path.dirname(latest))
            raise ConfigError("megatron_checkpoint", f"{mcore_dir}: its latest checkpoint {missing_dir(latest)} "
                                                     f"(checkpoints there: {there})")
        mcore_dir = latest
    from ..convert.mcore_checkpoint import METADATA_FILE, training_checkpoint_error

    if not os.path.isfile(os.path.join(mcore_dir, METADATA_FILE)) and training_checkpoint_error(mcore_dir) is None:
        run = os.path.isdir(os.path.join(mcore_dir, "checkpoints"))   # was the converter's "mcore_dir: ... --hf_config"
        raise ConfigError("megatron_checkpoint", f"{mcore_dir} is neither hf_to_mcore's output (no {METADATA_FILE}) "
                          "nor a training checkpoint" + (f" (a run: give {os.path.join(mcore_dir, 'checkpoints')}"
                                                         "/iter_N)" if run else ""))
    final = os.path.join(run_dir, "converted_model")
    marker = {"megatron_checkpoint": os.path.abspath(mcore_dir)}
    if _reusable(final, marker):
        return final
    remove(final)                                     # another checkpoint's, or unfinished
    os.makedirs(run_dir, exist_ok=True)               # the converters refuse an out_dir whose parent is missing
    _say(f"converting {mcore_dir} to HF into {final} (minutes at 8B; a rerun reuses it)")
    if training_checkpoint_error(mcore_dir) is not None:   # a training run's: its student, LoRA merged
        _convert_training_checkpoint(mcore_dir, final, base_model=tokenizer_dir)
        write_json(os.path.join(final, MARKER), marker, indent=1)
        return final
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    proc = ctx.Process(target=_convert_entry, args=(mcore_dir, final, tokenizer_dir, errors), name="mcore_to_hf")
    proc.start()
    reaper = Reaper([proc.pid])   # a SIGKILLed evaluator takes the conversion along
    proc.join()
    reaper.close()
    if proc.exitcode != 0:
        user, why = errors.get() if not errors.empty() else (False, f"exit code {proc.exitcode}")
        message = f"converting the Megatron checkpoint {mcore_dir!r} to HF failed: {why}"
        raise UserError(message) if user else RuntimeError(message)
    write_json(os.path.join(final, MARKER), marker, indent=1)  # last: an output without it is never reused
    return final


def converted_checkpoint(model_dir: str) -> str:
    """The checkpoint ``convert_megatron`` made ``model_dir`` from (its marker): for a run or its checkpoints
    directory the iteration that was its latest then, which a run still training moves on from."""
    return read_json(os.path.join(model_dir, MARKER))["megatron_checkpoint"]


def resolve_model_dir(*, model: str | None, adapter: str | None, megatron_checkpoint: str | None,
                      run_dir: str, dtype: str = "bfloat16", merged_from: dict | None = None) -> str:
    """The HF directory to evaluate (see the module docstring); ``merged_from``: the adapter's and the base's
    ``merge_inputs`` when read already."""
    if megatron_checkpoint is not None:
        if adapter is not None:
            raise ConfigError("adapter", "not supported with megatron_checkpoint (merge LoRA before saving)")
        return convert_megatron(megatron_checkpoint, run_dir, tokenizer_dir=model)
    if model is None:
        raise ConfigError("model", "give a HF model directory (or megatron_checkpoint)")
    if adapter is not None:
        return merge_adapter(model, adapter, run_dir, dtype=dtype, inputs=merged_from)
    return check_hf_dir(model)
