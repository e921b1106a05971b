"""The errors a user can fix: a setting, the command line, an input file.

The command lines (``phf_megatron.cli.run_command``) print these as one line, ``error: ...``,
and exit with code 2; every other exception keeps its traceback. All are ``ValueError``s, so
library callers catch them as before. Imports nothing heavy.
"""

from __future__ import annotations


class UserError(ValueError):
    """Base class: ``line`` is what a command line prints after ``error: ``."""

    @property
    def line(self) -> str:
        return str(self)


class ConfigError(UserError):
    """A setting's value is wrong. ``key`` is the setting (``model.hf_dir``, ``n``) and ``detail``
    what is wrong; the message also says which flag changes it, and the one-line form leads with
    the flag: ``--model.hf_dir: is required``."""

    def __init__(self, key: str, detail: str):
        super().__init__(f"{key}: {detail} (change it with --{key}=...)")
        self.key, self.detail = key, detail

    @property
    def line(self) -> str:
        return f"--{self.key}: {self.detail}"


class UsageError(UserError):
    """The command line itself is wrong (an unknown flag, a flag without its value); the message
    names the flag as typed."""


class InputFileError(UserError):
    """A file the run reads is missing a piece, truncated or malformed; the message starts with
    its path (``train.jsonl:17: ...``, ``model.safetensors: ...``)."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"{path}: {detail}")
        self.path, self.detail = path, detail


class OutputFileError(UserError):
    """An output cannot be written: the disk is full, the file system is read-only, no permission.
    The message starts with the path and names the cause as the system does ("No space left on
    device"); whatever was half-written has been removed."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"{path}: {detail}")
        self.path, self.detail = path, detail


def as_config_error(err: ValueError, keys, section: str | None = None) -> ConfigError | None:
    """A plain ``ValueError("field: detail")`` raised by the checks of a config with fields ``keys``,
    as a ``ConfigError`` naming ``section.field``; None when the message names no such field."""
    if isinstance(err, ConfigError):
        return err
    name, colon, detail = str(err).partition(":")
    if not colon or name not in keys:
        return None
    return ConfigError(f"{section}.{name}" if section else name, detail.strip())
