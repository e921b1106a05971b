"""Read the files a run is given; a damaged one is an ``InputFileError`` that names it.

Truncated or corrupt safetensors, a ``config.json`` that is not JSON, a torch file cut short by a
full disk: the libraries' own errors ("invalid header length", "PytorchStreamReader failed") do
not say which file. These readers add the path and say what the file should have been, and the
command lines print the result as one line (``phf_megatron.commands.run_command``).

    config = read_json(os.path.join(hf_dir, "config.json"))
    lines = read_lines("metrics.jsonl")   # a line that is not UTF-8 named; a torn last one kept for the caller
    with open_safetensors(path) as f: ...
    check_hf_model_dir(hf_dir)   # config.json and every safetensors header, before an engine loads it
    read_latest(save_dir)        # Megatron's latest_checkpointed_iteration.txt (the trainer's, the evaluator's)
"""

from __future__ import annotations

import codecs
import json
import os
import pickle
import re
from typing import IO, Any, Iterator

from .errors import InputFileError, ReleaseCheckpoint


def read_json(path: str, what: str = "JSON") -> Any:
    """``json.load`` of ``path``; a file that is not valid JSON raises ``InputFileError``."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return json.loads(data)
    except UnicodeDecodeError as err:
        raise InputFileError(path, f"not valid {what} (not UTF-8 text at byte {err.start})") from None
    except json.JSONDecodeError as err:
        empty = " (the file is empty)" if not data.strip() else ""
        msg = err.msg.removesuffix(" at")   # "Unterminated string starting at" + " at line": one "at"
        raise InputFileError(path, f"not valid {what}{empty}: {msg} at line {err.lineno} column {err.colno}") from None


def load_yaml(path: str) -> Any:
    """``yaml.safe_load`` of ``path``; a file that is not valid YAML (or not UTF-8 text) raises ``InputFileError``."""
    import yaml

    with open(path, "rb") as f:   # bytes that are not UTF-8: a YAMLError (in text mode a UnicodeDecodeError)
        try:
            return yaml.safe_load(f)
        except yaml.YAMLError as err:
            raise InputFileError(path, f"not valid YAML ({' '.join(str(err).split())})") from None


def read_lines(path: str) -> list[str]:
    """The ``"\\n"``-separated lines of a UTF-8 text file that is appended to line by line (a JSONL log;
    the last item is ``""`` when the file ends with a newline). A line that is not UTF-8 raises
    ``InputFileError`` naming ``path:line``, except the last one: a write cut by a crash may end inside
    a multi-byte character, so its cut bytes are decoded as U+FFFD for the caller's torn-last-line rule
    (such a line is no complete JSON record)."""
    with open(path, "rb") as f:
        raw = f.read().split(b"\n")
    lines = []
    for number, line in enumerate(raw, start=1):
        try:
            lines.append(utf8_line(line))
        except ValueError as err:
            if number < len(raw):
                raise InputFileError(f"{path}:{number}", str(err)) from None
            lines.append(line.decode("utf-8", errors="replace"))
    return lines


def numbered_lines(f: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(1-based number, bytes)`` per line of a text file opened in binary, a UTF-8 byte order mark at the
    start of the file dropped (a file saved by Windows Notepad or Excel: ``json.loads`` refuses it with
    "Unexpected UTF-8 BOM"); one anywhere else is the line's data."""
    for number, line in enumerate(f, start=1):
        yield number, line.removeprefix(codecs.BOM_UTF8) if number == 1 else line


def utf8_line(line: bytes) -> str:
    """One line of a text file read in binary, decoded; bytes that are not UTF-8 raise
    ``ValueError("not UTF-8 text at byte N of the line")`` (the caller names the file and line)."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 text at byte {err.start} of the line") from None


def open_safetensors(path: str, framework: str = "pt"):
    """``safetensors.safe_open(path)``; a truncated or corrupt file raises ``InputFileError``."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(path, framework)
    except SafetensorError as err:
        raise InputFileError(path, f"not a readable safetensors file, truncated or corrupt ({err}); "
                                   f"size {os.path.getsize(path)} bytes") from None


def load_torch_file(path: str, **kwargs) -> Any:
    """``torch.load(path)``; a truncated or corrupt file raises ``InputFileError``."""
    import torch

    try:
        return torch.load(path, **kwargs)
    except (FileNotFoundError, PermissionError):
        raise
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, ValueError) as err:  # OSError: a cut zip
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputFileError(path, f"not a readable torch file, truncated or corrupt ({first}); "
                                   f"size {os.path.getsize(path)} bytes") from None


def missing_dir(path: str) -> str | None:
    """What keeps ``path`` from being a directory to read (``"<path> does not exist"``, ``"<path> is
    not a directory"``), for the caller to prefix with its setting; None when it is one."""
    if os.path.isdir(path):
        return None
    return f"{path} {'is not a directory' if os.path.exists(path) else 'does not exist'}"


def missing_file(path: str) -> str | None:
    """``missing_dir``'s words for a file to read (``"<path> is not a file"``); None when it is one."""
    if os.path.isfile(path):
        return None
    return f"{path} {'is not a file' if os.path.exists(path) else 'does not exist'}"


def missing_hf_config(path: str) -> str | None:
    """``missing_dir``'s words, or ``"no config.json in <path>"``: what keeps ``path`` from being a HF model
    directory at first sight (the converters ask before torch loads, in ~0.2 s not ~5 s); None when it has one."""
    if why := missing_dir(path):
        return why
    return None if os.path.isfile(os.path.join(path, "config.json")) else f"no config.json in {path}"


def missing_base_model(hf_dir: str | None, named: str | None = None) -> str | None:
    """What keeps ``hf_dir`` from being the base model a run's export rebuilds its student on (``named``: how the
    line names it, ``hf_dir`` itself by default), for ``--base_model``; None when it has a config.json. Asked by the
    export and, before torch loads, by ``mcore_to_hf`` (~0.1 s, not ~5.5 s)."""
    if hf_dir and os.path.isfile(os.path.join(hf_dir, "config.json")):
        return None
    what = "does not exist" if hf_dir and not os.path.exists(hf_dir) else "is not a HF model directory"
    return f"{named or hf_dir} {what} here; give the base model the run was trained from"


# ----------------------------------------------------------------------------- Megatron's checkpoints directory

#: Megatron's tracker file: a checkpoints directory's latest complete iteration (``training.checkpoint``).
LATEST_FILE = "latest_checkpointed_iteration.txt"
#: A complete checkpoint's directory in it (``iter_0000050``).
ITER_RE = re.compile(r"^iter_(\d{7})$")


def iter_dir_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


#: A complete checkpoint's record in its directory (written last: the trainer's checkpoints).
META_FILE = "meta.json"


def checkpoint_saved(save_dir: str, iteration: int) -> bool:
    """Whether ``save_dir`` holds the complete checkpoint of ``iteration`` (its ``META_FILE``)."""
    return os.path.isfile(os.path.join(save_dir, iter_dir_name(iteration), META_FILE))


#: A training run's resolved settings, in its run directory (``training.config_io`` writes it).
RUN_CONFIG_FILE = "config.yaml"
#: A training run's per-step metrics, in its run directory (``training.metrics`` writes it).
METRICS_FILE = "metrics.jsonl"


def run_checkpoints_dir(run_dir: str, save: str | None) -> str:
    """Where a training run saves its checkpoints: its ``checkpoint.save``, else ``<run_dir>/checkpoints``."""
    return save or os.path.join(run_dir, "checkpoints")


def saved_checkpoints_dir(run_dir: str) -> str | None:
    """``run_checkpoints_dir`` of the run whose ``config.yaml`` is in ``run_dir`` (read as plain YAML, for the
    layers below ``training``); None when there is none. One that is not YAML raises ``InputFileError``."""
    path = os.path.join(run_dir, RUN_CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    tree = load_yaml(path)
    section = tree.get("checkpoint") if isinstance(tree, dict) else None
    save = section.get("save") if isinstance(section, dict) else None
    saved_run_dir = tree.get("run_dir") if isinstance(tree, dict) else None
    return run_checkpoints_dir(run_dir, saved_path(path, "checkpoint.save", save if isinstance(save, str) else None,
                                                   run_dir, saved_run_dir if isinstance(saved_run_dir, str) else None))


def saved_path(config_file: str, key: str, value: str | None, run_dir: str | None = None,
               saved_run_dir: str | None = None) -> str | None:
    """A path setting ``key`` read from a run's ``config_file``: absolute as the trainer records it
    (``moved_with_run``), or relative as a ``config.yaml`` written before it did holds it (``launch_relative``)."""
    if not value:
        return value
    if os.path.isabs(value):
        return moved_with_run(config_file, key, value, run_dir, saved_run_dir)
    return launch_relative(config_file, key, value)


def launch_relative(config_file: str, key: str, value: str) -> str:
    """A relative path of a ``config.yaml`` written before the trainer recorded them absolute: relative to the
    launch directory, read from here as before; one that is not here raises ``InputFileError`` saying so."""
    if not os.path.exists(value):
        raise InputFileError(config_file, f"{key} {value!r} is relative to the directory the run was launched from "
                                          f"(written before config.yaml recorded absolute paths) and "
                                          f"{os.path.abspath(value)} does not exist: run this from that directory")
    return value


def moved_with_run(config_file: str, key: str, value: str, run_dir: str | None, saved_run_dir: str | None) -> str:
    """An absolute path ``value`` below ``saved_run_dir`` (the config's ``run_dir``) read below ``run_dir``, where the
    run directory is now (moved or copied: a copy's own, never the original's, as the trainer and ``load_config``
    read it: ``moved_run``); one outside it as recorded; one not there raises ``InputFileError`` in one line."""
    if run_dir and (inside := below(value, saved_run_dir)) is not None:
        value = os.path.normpath(os.path.join(run_dir, inside))
    if os.path.exists(value):
        return value
    raise InputFileError(config_file, f"{key} {value!r} does not exist here (no checkpoint saved yet, or moved "
                                      "since the run wrote this file): give the checkpoints directory as it is now")


def below(path: str, root: str | None) -> str | None:
    """``path`` relative to the absolute directory ``root`` when it lies in it (``.``: ``root`` itself), else None."""
    inside = os.path.relpath(path, root) if root and os.path.isabs(root) and os.path.isabs(path) else ""
    return None if inside in ("", os.pardir) or inside.startswith(os.pardir + os.sep) else inside


def read_latest(save_dir: str) -> int | None:
    """The iteration ``latest_checkpointed_iteration.txt`` names, or None when there is none."""
    path = os.path.join(save_dir, LATEST_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:   # garbage bytes (a damaged disk) are shown, not a UnicodeDecodeError
        text = f.read().decode("utf-8", errors="replace").strip()
    if text == "release":
        raise ReleaseCheckpoint(path, "a 'release' checkpoint is a base model, not a run to resume; "
                                   "pass it as --model.pretrained_checkpoint")
    if not (text.isascii() and text.isdigit()):   # "²".isdigit(), and int() refuses it
        raise InputFileError(path, f"expected an iteration number, found {text!r}")
    return int(text)


def list_checkpoints(save_dir: str) -> list[int]:
    """Iterations of the complete (renamed) checkpoints in ``save_dir``, ascending."""
    if not os.path.isdir(save_dir):
        return []
    return sorted(int(m.group(1)) for m in map(ITER_RE.match, os.listdir(save_dir)) if m)


def checkpoint_names(save_dir: str, most: int = 3) -> str:
    """For an error line, so the user can pick one: the ``iter_N`` directories ``save_dir`` holds,
    the first and the last ``most`` of a longer list (``iter_0000001, ..., iter_0000120 (12 in all)``)."""
    found = [iter_dir_name(i) for i in list_checkpoints(save_dir)]
    if len(found) > most + 1:
        return f"{found[0]}, ..., {', '.join(found[-most:])} ({len(found)} in all)"
    return ", ".join(found) or "none"


def missing_checkpoint_dir(path: str) -> str | None:
    """``missing_dir``'s words for a checkpoint path, with the checkpoints its parent holds when it has some (a
    mistyped or pruned ``iter_N``); None when ``path`` is a directory."""
    if not (why := missing_dir(path)):
        return None
    parent = os.path.dirname(os.path.abspath(path))
    return f"{why} (checkpoints there: {checkpoint_names(parent)})" if list_checkpoints(parent) else why


def refuse_unnamed_checkpoints(save_dir: str) -> None:
    """Raise (one line naming the latest file) when ``save_dir`` holds ``iter_XXXXXXX`` checkpoints but no
    ``latest_checkpointed_iteration.txt``: a run killed as it saved its first checkpoint (between the rename
    and the latest file) leaves it so, and a start from scratch would train again and overwrite them."""
    done = list_checkpoints(save_dir)
    if done and not os.path.isfile(os.path.join(save_dir, LATEST_FILE)):
        raise InputFileError(os.path.join(save_dir, LATEST_FILE), f"missing, but {save_dir} holds checkpoints "
                             f"({checkpoint_names(save_dir)}): write the iteration to resume from into it (the last: "
                             f"{done[-1]}), or use a new --checkpoint.save directory to start afresh")


def kept(save_dir: str, redone: bool = False) -> str:
    """What a stopped run keeps: its last checkpoint, named (``redone``: the resume redoes the steps after it)."""
    done = list_checkpoints(save_dir)
    if not done:
        return "no checkpoint was saved"
    last = f"the last checkpoint is {os.path.join(save_dir, iter_dir_name(done[-1]))}"
    return f"{last}, the steps after it are redone" if redone else last


def check_hf_model_dir(path: str, weights: bool = False) -> None:
    """A HF model directory's ``config.json`` (and ``generation_config.json``) parses, every
    ``*.safetensors`` header reads (cheap: no tensor data) and every shard an index lists is there, so a
    damaged or missing file is named before an engine or model loads it; ``weights``: it must hold
    safetensors weights too."""
    config = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: not a directory (expected a HF model directory)")
    if not os.path.isfile(config):
        raise FileNotFoundError(f"{path}: no config.json (expected a HF model directory)")
    if not isinstance(read_json(config), dict):
        raise InputFileError(config, "expected a JSON object")
    generation = os.path.join(path, "generation_config.json")   # transformers and vLLM skip a damaged one silently
    if os.path.isfile(generation) and not isinstance(read_json(generation), dict):   # (its stop tokens lost)
        raise InputFileError(generation, "expected a JSON object")
    names = sorted(os.listdir(path))
    # PyTorch .bin weights count too: vLLM and transformers load them (an older or TRL-saved model)
    if weights and not any(n.endswith((".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json"))
                           for n in names):
        raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json (expected a HF "
                                "model directory with its weights)")
    for name in names:
        if name.endswith(".safetensors"):
            with open_safetensors(os.path.join(path, name)):
                pass
        elif name.endswith(".safetensors.index.json"):   # every shard it lists is there (a download cut short)
            index = os.path.join(path, name)
            listing = read_json(index)
            weight_map = listing.get("weight_map") if isinstance(listing, dict) else None
            if not isinstance(weight_map, dict):
                raise InputFileError(index, "expected a JSON object with a 'weight_map' object")
            for shard in sorted(set(map(str, weight_map.values()))):
                if not os.path.isfile(os.path.join(path, shard)):
                    raise FileNotFoundError(f"{os.path.join(path, shard)}: missing (listed in {index})")


def check_peft_adapter_dir(path: str) -> None:
    """A PEFT adapter directory's ``adapter_config.json`` parses to an object and its
    ``adapter_model.safetensors`` header reads (or an ``adapter_model.bin`` is there), so a damaged
    or missing file is named before peft loads it (peft's own errors name none, or a Hub repo id)."""
    config = os.path.join(path, "adapter_config.json")
    if not isinstance(read_json(config), dict):
        raise InputFileError(config, "expected a JSON object")
    weights = os.path.join(path, "adapter_model.safetensors")
    if os.path.isfile(weights):
        with open_safetensors(weights):
            pass
    elif not os.path.isfile(os.path.join(path, "adapter_model.bin")):
        raise FileNotFoundError(f"{path}: no adapter_model.safetensors or adapter_model.bin (expected a PEFT "
                                "adapter directory with its weights)")
