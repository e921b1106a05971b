"""May a run directory resume? What an eval refuses to mix with the samples its ``out_dir`` holds.

``run_config.json`` (``RUN_CONFIG``) beside the samples records the settings they were generated with
(``EvalConfig.generation_fingerprint``) and the files of the model they came from (``DIGEST_FLAGS``); a rerun with
other settings, another model's files, or other problem texts under the same ids is refused in one line naming
``--out_dir``. ``planned_resume_refusals`` says the same before any model is merged (``tools/paper_rows.py``).
"""

from __future__ import annotations

import os

from phf_megatron.rollout import resolve_backend

from ..errors import InputFileError
from ..input_files import missing_dir, read_json
from ..output_files import write_json
from .benchmarks import Problem, load_problems
from .config import EvalConfig
from .models import MARKER, check_hf_config, merge_inputs, merged_model_dir, model_context_limit, model_digest
from .records import load_records, other_problems, problem_digest

#: Beside the samples: the settings they were generated with (``_check_fingerprint`` writes it).
RUN_CONFIG = "run_config.json"
#: Fingerprint fields that are paths: compared as the files they name, not as typed.
PATH_KEYS = ("model_dir", "adapter", "megatron_checkpoint")
#: With --adapter: what the merged model was made from (``models.merge_inputs``).
MERGE_KEYS = ("base_digest", "adapter_digest")
#: What the evaluated model's files were (``model_digest`` of a plain --model, ``MERGE_KEYS``), by the flag that
#: names them: a ``run_config.json`` written before it held one resumes as before and is rewritten with it
#: (``_check_fingerprint``).
DIGEST_FLAGS = {"model_digest": "--model", "base_digest": "--model", "adapter_digest": "--adapter"}
#: A path and the digest of the files it names: the same files under another path (a run directory moved or copied,
#: the command given from another directory) resume, as the base model's do; the path decides only without digests.
PATH_DIGESTS = {"adapter": "adapter_digest", "model_dir": "model_digest"}


def _same_path_form(fingerprint: dict, out_dir: str, stored: bool = False) -> dict:
    """``fingerprint`` with its paths resolved (relative, absolute, through a symlink: one form);
    a path inside ``out_dir`` (the merged or converted model) relative to it, so the run directory
    resumes under any name. ``stored``: the fingerprint read back from ``run_config.json``, whose
    relative paths are relative to ``out_dir`` (a new one's are relative to the working directory)."""
    run = os.path.realpath(out_dir)
    out = dict(fingerprint)
    for key in PATH_KEYS:
        if isinstance(out.get(key), str):
            real = os.path.realpath(os.path.join(run, out[key]) if stored else out[key])
            out[key] = os.path.relpath(real, run) if os.path.commonpath([real, run]) == run else real
    return out


def resume_differences(out_dir: str, fingerprint: dict, model_limit: int | None = None) -> dict:
    """``{setting: (old, new)}`` where ``fingerprint`` differs from the settings of the samples in ``out_dir``
    (its ``run_config.json``; ``{}`` without one): what a resume refuses."""
    path = os.path.join(out_dir, RUN_CONFIG)
    if not os.path.isfile(path):
        return {}
    old = read_json(path)   # damaged: named, not a JSONDecodeError traceback
    if not isinstance(old, dict):
        raise InputFileError(path, f"expected a JSON object (the settings of the samples beside it), "
                                   f"got {type(old).__name__}")
    old = _same_path_form(old, out_dir, stored=True)
    if old.get("max_model_len", 0) is None:          # written before the official default: the model's own
        old["max_model_len"] = model_limit
    diff = {k: (old.get(k), v) for k, v in _same_path_form(fingerprint, out_dir).items()
            if old.get(k) != v and (k in old or k not in DIGEST_FLAGS)}
    for key, digest in PATH_DIGESTS.items():   # was refused: {'adapter': (its old path, the new)} of the same files
        if key in diff and digest in old and digest not in diff and fingerprint.get(digest) is not None:
            del diff[key]
    return diff


def other_settings(out_dir: str, diff: dict) -> InputFileError:
    flags = " and ".join(sorted({DIGEST_FLAGS[k] for k in diff if k in DIGEST_FLAGS}, reverse=True))
    changed = f"; {flags}: not the files its samples were made with" if flags else ""   # (retrained in place?)
    return InputFileError(out_dir, f"holds samples generated with other settings {diff} (old, new){changed}; "
                                   "use another --out_dir")


def _check_fingerprint(out_dir: str, fingerprint: dict, model_limit: int | None = None,
                       has_samples: bool = True) -> None:
    """Refuse to mix samples of different generation settings in one run directory (a
    ``run_config.json`` with no sample beside it, left by a failed start, is replaced)."""
    path = os.path.join(out_dir, RUN_CONFIG)
    if os.path.isfile(path) and has_samples:
        if diff := resume_differences(out_dir, fingerprint, model_limit):
            raise other_settings(out_dir, diff)
        if all(k in read_json(path) for k in DIGEST_FLAGS if k in fingerprint):
            return                                  # else written before it held them: upgraded to this model's
    write_json(path, _same_path_form(fingerprint, out_dir), indent=1)


def other_problem_samples(done: dict, problems: dict[str, list[Problem]]) -> str | None:
    """``"aime24 '3' and 2 more"``: the problems whose samples in ``done`` were generated for another problem text
    than ``problems``' under the same ids (``other_problems``; a resume refuses them), None when none."""
    other = other_problems(done, {(p.benchmark, p.id): problem_digest(p.problem)
                                  for ps in problems.values() for p in ps})
    if not other:
        return None
    return f"{other[0][0]} {other[0][1]!r}" + (f" and {len(other) - 1} more" if len(other) > 1 else "")


def planned_fingerprint(config: EvalConfig) -> tuple[dict, int | None]:
    """The fingerprint ``run_eval`` records for ``config``, and the model's context limit, known before any model
    is merged: with an adapter, what the merge will be made from (``merge_inputs``: cheap; the merged model's marker
    holds the same). Not for a ``megatron_checkpoint``, whose iteration is known once converted."""
    model_dir = merged_model_dir(config.out_dir) if config.adapter else config.model
    check_hf_config(config.model, "base model" if config.adapter else "model")   # the eval's line, not a traceback
    limit = model_context_limit(config.model)   # a merged model's: its base's config
    fingerprint = config.generation_fingerprint(model_dir, resolve_backend(config.backend), limit)
    if config.adapter and not missing_dir(config.adapter):   # (a row's adapter not trained yet: its eval checks)
        fingerprint.update(merge_inputs(config.model, config.adapter))
    elif not config.adapter:   # retrained or overwritten in place: its path alone resumed it, mixing two models
        fingerprint["model_digest"] = model_digest(config.model)
    return fingerprint, limit


def planned_resume_refusals(config: EvalConfig) -> tuple[dict, str | None]:
    """What ``run_eval`` will refuse to resume in ``config.out_dir``, told before any model is merged: the
    settings its samples were made with otherwise (``resume_differences`` with ``planned_fingerprint``) and the
    problems they were generated for otherwise (``other_problem_samples``); ``({}, None)``: none there, or they
    resume. Not for a ``megatron_checkpoint``, whose iteration is known once converted (its eval checks)."""
    done = load_records(config.out_dir)[0] if config.megatron_checkpoint is None else {}
    if not done:
        return {}, None
    problems, _ = load_problems(config)
    return resume_differences(config.out_dir, *planned_fingerprint(config)), other_problem_samples(done, problems)


def _converted_before(out_dir: str) -> str | None:
    """The checkpoint ``<out_dir>/converted_model`` was made from, read before this run converts (None: none kept)."""
    path = os.path.join(out_dir, "converted_model", MARKER)
    try:
        held = read_json(path) if os.path.isfile(path) else None
    except InputFileError:   # damaged: converted again, as if none were kept
        return None
    return held.get("megatron_checkpoint") if isinstance(held, dict) else None


def _upgrade_typed_checkpoint(out_dir: str, fingerprint: dict, typed: str, before: str | None) -> None:
    """A ``run_config.json`` written before it held the iteration converted holds --megatron_checkpoint as typed
    (a run or its checkpoints directory), which the same command's fingerprint (the iteration) refused as another
    model: it is rewritten with the iteration its converted model was made from (``before``, read before this run
    converted; the one converted now when none was kept), and the usual check then resumes or refuses it."""
    path = os.path.join(out_dir, RUN_CONFIG)
    old = read_json(path) if os.path.isfile(path) else None
    if not (isinstance(old, dict) and isinstance(old.get("megatron_checkpoint"), str)):
        return
    now, given = (_same_path_form({"megatron_checkpoint": p}, out_dir)["megatron_checkpoint"]
                  for p in (fingerprint["megatron_checkpoint"], typed))
    if now != given == _same_path_form(old, out_dir, stored=True)["megatron_checkpoint"]:
        held = _same_path_form({"megatron_checkpoint": before or now}, out_dir)["megatron_checkpoint"]
        write_json(path, {**old, "megatron_checkpoint": held}, indent=1)
