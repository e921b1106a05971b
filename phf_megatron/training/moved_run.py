"""A run's own ``config.yaml`` (``config_io.save_run_config``'s) given as ``--config`` in another run directory than
the one it records (``moved_run``): the run directory moved or copied with the run's outputs (the same run, there
now), or the file copied alone, or another ``--run_dir`` (a new run there with the file's settings).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..input_files import METRICS_FILE, RUN_CONFIG_FILE, below, run_checkpoints_dir

#: The settings that name a local file or directory. ``config.yaml`` records them absolute, resolved against the
#: directory the run was launched from, so mcore_to_hf, the eval, paper_table and a run export read the run's
#: files from any directory (written as given, a relative one was read from the reader's directory).
PATH_SETTINGS = ("run_dir", "model.hf_dir", "model.pretrained_checkpoint", "data.path", "checkpoint.save",
                 "checkpoint.load", "logging.tensorboard_dir", "logging.wandb_save_dir")
#: The ``PATH_SETTINGS`` a run reads and never writes: ``moved_run`` moves one only where it is found there.
READ_PATH_SETTINGS = ("model.hf_dir", "model.pretrained_checkpoint", "data.path", "checkpoint.load")
#: The ``PATH_SETTINGS`` where a run writes what another must not share (its checkpoints resumed from, its event
#: files shown as one run): a new run from a run's config.yaml writes its own where they were recorded outside it.
OWN_OUTPUT_SETTINGS = ("checkpoint.save", "logging.tensorboard_dir")
#: The top-level settings every run's own ``config.yaml`` holds (``save_run_config`` writes them all; these since the
#: first, cb42662: method and sft came in a13f4fd, grpo in 97b5b9f): a preset, even one named config.yaml, lists fewer.
RUN_CONFIG_KEYS = ("run_dir", "ablation", "model", "lora", "teacher", "rollout", "data", "optimizer", "training",
                   "objective", "checkpoint", "logging")


def is_run_config(path: str, values: dict[str, Any]) -> bool:
    """Whether the file ``path``, read as ``values``, is a run's own ``config.yaml`` (``save_run_config``'s): so named,
    with every ``RUN_CONFIG_KEYS``. Else it is a preset, read as written."""
    return os.path.basename(path) == RUN_CONFIG_FILE and set(RUN_CONFIG_KEYS) <= {k.split(".")[0] for k in values}


@dataclasses.dataclass(frozen=True)
class MovedRun:
    """A run's own ``config.yaml`` read in another run directory than the one it records (``moved_run``)."""

    path: str
    """The file."""
    old: str
    """The run directory it records."""
    new: str
    """The run directory now: ``--run_dir``, else the file's directory."""
    paths: dict[str, str]
    """``{key: path}``: the path settings recorded in ``old`` that are read in ``new``."""
    given: bool = False
    """``new`` is a ``--run_dir`` other than the file's directory: a new run there with the file's settings."""
    same_run: bool = True
    """``new`` is the file's directory and holds the run's outputs (``holds_run_outputs``), or ``old`` is gone and
    the checkpoints it recorded outside it are there: the run directory moved or copied with them. Else a new run in ``new`` with the file's settings (``given``, or the file copied alone)."""
    others: dict[str, str] = dataclasses.field(default_factory=dict)
    """``{key: path}``: of a new run, the ``OWN_OUTPUT_SETTINGS`` recorded outside ``old`` (that run's own): the new
    run's are their defaults, in ``new``."""

    def settings(self, start: bool) -> dict[str, str | None]:
        """What is read instead of the file's values: ``paths``; to ``start`` a run, ``others`` as their defaults."""
        return {**self.paths, **(dict.fromkeys(self.others) if start else {})}

    def note(self) -> str:
        """One line: which run is in ``new``, and where its paths are."""
        said = [f"note: {self.path} records the run in {self.old}" + (
            "" if self.same_run else f": a new run in {self.new} (--run_dir) with its settings" if self.given else
            f", and {self.new} holds none of its checkpoints or metrics: a new run there with its settings")]
        said += [f"its {', '.join(self.paths)} there are read in {self.new}"] if self.paths else []
        said += [f"its {key} {where}, outside {self.old}, is that run's: this run's is the default, in {self.new}"
                 for key, where in self.others.items()]
        return "; ".join(said) + ("" if self.given else " (give --run_dir for another run directory)")


def holds_run_outputs(run_dir: str, save: str | None) -> bool:
    """Whether ``run_dir`` holds a run's checkpoints (``save``, else the default place) or its metrics."""
    return os.path.isdir(run_checkpoints_dir(run_dir, save)) or os.path.isfile(os.path.join(run_dir, METRICS_FILE))


def moved_run(path: str, values: dict[str, Any], overrides: dict[str, Any]) -> MovedRun | None:
    """A run's own ``config.yaml`` (``save_run_config``'s, its ``run_dir`` absolute) read away from that run_dir or
    given with another ``--run_dir``: the run is there, the file's directory or the one given, and each path setting
    recorded in the old run_dir follows it (as ``input_files.saved_path`` reads a moved run's ``checkpoint.save``;
    one it reads, ``READ_PATH_SETTINGS``, when found there or gone from the old place): nothing is written into the
    old run_dir. The same run when that directory is the file's and holds the run's outputs; else a new run, which
    writes none into the old run's ``OWN_OUTPUT_SETTINGS`` recorded outside the old run_dir either.
    None for a preset (``is_run_config``), a run's config in its place, the settings given as flags."""
    old = values.get("run_dir")
    if not (is_run_config(path, values) and isinstance(old, str) and os.path.isabs(old)):   # a preset: as written
        return None
    new = os.path.abspath(overrides.get("run_dir") or os.path.dirname(os.path.abspath(path)))
    if os.path.realpath(new) == os.path.realpath(old):
        return None
    moved = {key: os.path.normpath(os.path.join(new, inside)) for key in PATH_SETTINGS
             if key not in overrides and isinstance(values.get(key), str)
             and (inside := below(values[key], old)) is not None}
    # what the run reads, not writes, follows only where it is there, or gone from the old place: a new --run_dir
    # started from this file reads the old run's data and model where they still are
    paths = {key: where for key, where in moved.items() if key not in READ_PATH_SETTINGS
             or os.path.exists(where) or not os.path.exists(values[key])}
    given = os.path.realpath(new) != os.path.realpath(os.path.dirname(os.path.abspath(path)))
    # or moved away from its checkpoints recorded outside it (the old run directory gone, they are there): that run
    save = values.get("checkpoint.save")
    same_run = not given and (holds_run_outputs(new, paths.get("checkpoint.save")) or not os.path.exists(old)
                              and isinstance(save, str) and os.path.isdir(save))
    others = {} if same_run else {key: values[key] for key in OWN_OUTPUT_SETTINGS
                                  if key not in overrides and key not in moved and isinstance(values.get(key), str)}
    return MovedRun(path, old, new, paths, given, same_run, others) if paths or others else None
