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


class NonFiniteError(UserError):
    """A NaN or inf where a run needs finite numbers: ``training.max_nonfinite_steps`` consecutive
    steps with a non-finite loss or gradient (``training.nonfinite``), or a tensor about to be
    written into a checkpoint or an export, which is then not written (``output_files.first_nonfinite``)."""

    @classmethod
    def not_written(cls, path: str, found: str) -> "NonFiniteError":
        """``<path>: not written: <found>`` (``found``: what ``output_files.first_nonfinite`` said)."""
        return cls(f"{path}: not written: {found} (the previous output, if any, is intact)")


def as_config_error(err: ValueError, keys, section: str | None = None) -> ConfigError | None:
    """A plain ``ValueError("field: detail")`` raised by the checks of a config with fields ``keys``,
    as a ``ConfigError`` naming ``section.field``; None when the message names no such field."""
    if isinstance(err, ConfigError):
        return err
    name, colon, detail = str(err).partition(":")
    if not colon or name not in keys:
        return None
    return ConfigError(f"{section}.{name}" if section else name, detail.strip())
