"""Writers that never leave a half-written output: a crash, a kill or an error mid-write leaves the
old file or directory as it was (or nothing, where there was none), never a truncated one.

One file: ``atomic_file(path)`` writes a temp file beside ``path`` (``.tmp-<pid>-<random>-<name>``
in the same directory, so the rename stays on one file system; a kill leaves it, never read),
flushes and fsyncs it, renames it over ``path`` (POSIX ``rename`` is atomic) and fsyncs the
directory, so the new name survives a power cut too. On an exception the temp file is removed and
``path`` is untouched. ``write_text`` / ``write_json`` / ``write_jsonl`` are the one-liners.

One directory: ``atomic_dir(final)`` hands out ``<final>.tmp`` (a leftover of a killed run is
removed first), gives every file in it the outputs' mode (``output_modes``), fsyncs them on success
and renames it to ``final``
(``replace_dir``); an existing ``final`` is swapped out and deleted only after the new one is in
place. On an exception ``<final>.tmp`` is removed. Collective writers (every rank writes into
one temp directory) call ``fresh_dir`` and ``replace_dir`` themselves.

No tensor that is not finite is ever written: the writers of tensors (checkpoints, exports) ask
``first_nonfinite`` before the rename and raise ``errors.NonFiniteError`` naming the tensor, so a
NaN or inf leaves the old output in place.

A write that fails for a reason the user can fix (a full disk, a read-only file system, no
permission) is an ``OutputFileError`` naming the path and the cause (``errors.write_failure``), raised
after the temporary file or directory is removed: one line from the command lines.

The readers that name a damaged file are ``input_files``'s; these are their counterpart.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from typing import IO, Any, Iterable, Iterator

from .errors import write_failure

@contextlib.contextmanager
def writing(path: str, cleanup: str | None = None) -> Iterator[None]:
    """Around a write into ``path``: a failure the user can fix (``write_failure``) becomes an
    ``OutputFileError``; ``cleanup`` (the temporary output) is removed on any failure."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        if cleanup is not None:
            remove(cleanup)
        raise
    except BaseException as err:  # torch's CheckpointException is a BaseException
        failure = write_failure(err, cleanup or path)
        if cleanup is not None:
            remove(cleanup)
        if failure is not None and failure is not err:
            raise failure from err
        raise


def fsync_dir(path: str) -> None:
    """Make the entries of directory ``path`` (a rename into it, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str) -> None:
    """fsync every file and directory below ``root`` (and ``root``)."""
    for directory, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(directory, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(directory)


def output_mode() -> int:
    """The mode of every output file: 0o666 less the process's umask (what ``open`` gives)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def output_modes(root: str) -> None:
    """Give every file below ``root`` the outputs' mode (``output_mode``): writers that create files
    owner-only (safetensors' ``save_file``, hence ``save_pretrained``: 0o600) get the same
    permissions as every other output (a weight file others cannot read is no shared model)."""
    mode = output_mode()
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, mode)


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "w", *, encoding: str | None = "utf-8") -> Iterator[IO]:
    """``with atomic_file(path) as f: f.write(...)``: ``path`` holds all of it or its old content.

    ``mode``: ``"w"`` (text, ``encoding``) or ``"wb"``. The parent directory is created if needed.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode: 'w' or 'wb', got {mode!r}")
    directory = os.path.dirname(os.path.abspath(path))
    # a unique name; the mode follows the umask (mkstemp would make every output owner-only)
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{secrets.token_hex(4)}-{os.path.basename(path)}")
    with writing(path):
        os.makedirs(directory, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with writing(path, cleanup=tmp):
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    fsync_dir(directory)


def nonfinite_summary(tensor) -> str | None:
    """``"3 NaN, 1 inf of 4096 values"`` for a float tensor holding NaN or inf, else None (one
    reduction, no temporary the size of the tensor unless something is found)."""
    import torch

    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tensor.numel() == 0:
        return None
    t = tensor.detach()
    if torch.isfinite(torch.linalg.vector_norm(t, float("inf"))):
        return None
    nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    return ", ".join(f"{n} {kind}" for n, kind in ((nan, "NaN"), (inf, "inf")) if n) + f" of {t.numel()} values"


def first_nonfinite(named: Iterable[tuple[str, Any]]) -> str | None:
    """``"<name> holds 3 NaN of 4096 values"`` for the first tensor of ``(name, tensor)`` pairs that
    is not finite, else None."""
    for name, tensor in named:
        summary = nonfinite_summary(tensor)
        if summary is not None:
            return f"{name} holds {summary}"
    return None


def write_text(path: str, text: str) -> None:
    """``path`` := ``text``, atomically."""
    with atomic_file(path) as f:
        f.write(text)


def write_json(path: str, obj: Any, **dump_kwargs) -> None:
    """``path`` := ``json.dump(obj, **dump_kwargs)``, atomically (an unserializable ``obj`` leaves
    the old file)."""
    with atomic_file(path) as f:
        json.dump(obj, f, **dump_kwargs)


def write_jsonl(path: str, records: Iterable[Any]) -> None:
    """``path`` := one JSON line per record, atomically."""
    with atomic_file(path) as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def remove(path: str) -> None:
    """Delete a file or a directory tree; nothing if it does not exist."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def new_dir_problem(path: str) -> str | None:
    """What keeps ``path`` from being made as a new output directory (``"<path> already exists ..."``, ``"parent
    directory <dir> does not exist"``), for the caller to prefix with its setting; None when it can be. Cheap: the
    converters ask it as they parse their flags, before torch loads (``input_files.missing_dir``'s counterpart)."""
    if os.path.exists(path):
        return f"{path} already exists (remove it or choose another)"
    parent = os.path.dirname(os.path.abspath(path))
    return None if os.path.isdir(parent) else f"parent directory {parent} does not exist"


def fresh_dir(path: str) -> str:
    """An empty directory at ``path`` (a leftover there is deleted; parents are created)."""
    remove(path)
    os.makedirs(path)
    return path


def replace_dir(tmp: str, final: str, *, replace: bool = True, trash: str | None = None) -> str:
    """Rename the complete directory ``tmp`` to ``final``; fsync the parent. Returns ``final``.

    An existing ``final``: ``replace=False`` raises ``FileExistsError`` naming it (``tmp`` kept);
    otherwise it is renamed to ``trash`` (default ``<final>.old``) before the rename and deleted
    after it. ``final`` never holds a partial directory; a crash between the two renames leaves
    the old one under ``trash``.
    """
    final = os.path.abspath(final)
    old = None
    if os.path.lexists(final):
        if not replace:
            raise FileExistsError(f"{final}: already exists")
        old = trash or f"{final}.old"
        remove(old)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(os.path.dirname(final))
    if old is not None:
        remove(old)
    return final


@contextlib.contextmanager
def atomic_dir(final: str, *, replace: bool = True, fsync: bool = True) -> Iterator[str]:
    """``with atomic_dir(out) as tmp: <write into tmp>``: ``out`` appears complete or not at all.

    ``replace=False`` refuses an existing ``final`` before anything is written. ``fsync``: fsync
    every file before the rename (off only for outputs a rerun can rebuild).
    """
    final = os.path.abspath(final)
    if not replace and os.path.lexists(final):
        raise FileExistsError(f"{final}: already exists")
    with writing(final):
        os.makedirs(os.path.dirname(final), exist_ok=True)
        tmp = fresh_dir(f"{final}.tmp")
    with writing(final, cleanup=tmp):
        yield tmp
        output_modes(tmp)
        if fsync:
            fsync_tree(tmp)
        replace_dir(tmp, final, replace=replace)
