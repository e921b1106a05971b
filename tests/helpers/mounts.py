"""Real file-system faults for the tests: a full disk and a read-only directory.

``small_tmpfs(path, size)`` mounts a tmpfs of ``size`` at ``path`` (root, as here and in CI; the
test is skipped with the reason where mounting is refused); ``read_only_dir(path)`` is a
read-only tmpfs for root (a mode of 0o555 does not stop root) and a 0o555 directory otherwise.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Iterator

import pytest


@contextlib.contextmanager
def small_tmpfs(path: str, size: str = "64k", read_only: bool = False) -> Iterator[str]:
    os.makedirs(path, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs (needs root): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


@contextlib.contextmanager
def read_only_dir(path: str) -> Iterator[str]:
    if os.geteuid() == 0:
        with small_tmpfs(path, read_only=True):
            yield path
        return
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o555)
    try:
        yield path
    finally:
        os.chmod(path, 0o755)
