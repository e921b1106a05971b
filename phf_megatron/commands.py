"""Running a command line: a command's body, with the errors a user can fix printed as one line.

``command(body)`` makes a console script's ``main(argv=None) -> exit code``: a user error
(``errors.UserError``, a missing file, a full disk, a dependency not installed) is one line,
``error: ...``, and exit code 2 (under torchrun: a setting's error by rank 0 only, a file's by
every rank that read it); Ctrl-C is one line and 130; a closed output pipe ends quietly; any other
exception keeps its traceback. ``tool_config`` / ``parse_command_line`` read a tool's flags with
``cli.Settings``. Imports nothing heavy.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Sequence

from .cli import Settings, wants_help
from .errors import (ConfigError, LostRank, RunStopped, StoppedAtStart, UsageError, UserError, missing_dependency,
                     write_failure)


#: Set to 1 by examples/launch_phf.sh once node 0's settings check (``--print-config``) said the settings' notes (a
#: run's config.yaml read elsewhere, a checkpoint's holdout adopted), and for the other nodes' checks: the run's rank
#: 0 then does not repeat them.
NOTES_SAID = "PHF_NOTES_SAID"


def process_rank() -> int:
    """This process's global rank: torch.distributed's once joined, else torchrun's ``RANK``, else 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    rank = os.environ.get("RANK", "0").strip()
    return int(rank) if _whole_number(rank) else 0   # (a RANK that is not a number: ``launch_world`` says so, rank 0 prints)


def _whole_number(text: str) -> bool:
    """Digits ``int()`` reads: ASCII ones ("²".isdigit() is True, and ``int`` refuses it)."""
    return text.isascii() and text.isdigit()


#: What a launcher's variable holds and who sets it: the end of the line that refuses one.
LAUNCHER_INT = "expected a whole number (torchrun sets it: examples/launch_phf.sh)"


def launcher_int(name: str, environ=None, *, why: str = LAUNCHER_INT) -> int:
    """The whole number a launcher set in ``name`` (torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``GROUP_RANK``), 0 when it is not set; a ``UserError`` naming the variable and its value, ending in
    ``why``, when it is not a whole number (a hand-made launch: was a ``ValueError`` traceback)."""
    value = (os.environ if environ is None else environ).get(name)
    if value is None:
        return 0
    if not _whole_number(value.strip()):
        raise UserError(f"{name}={value!r}: {why}")
    return int(value)


def launch_world(environ=None) -> tuple[int, int] | None:
    """``(RANK, WORLD_SIZE)`` as a launcher set them (torchrun, ``examples/launch_phf.sh``), None without ``RANK``
    (a world of one); a ``UserError`` naming the variable when ``WORLD_SIZE`` is missing or either is not a whole
    number (a hand-made launch: was a ``KeyError`` or ``ValueError`` traceback)."""
    env = os.environ if environ is None else environ
    if "RANK" not in env:
        return None
    why = "torchrun sets RANK and WORLD_SIZE (whole numbers, RANK < WORLD_SIZE); unset RANK for a run of one process"
    rank = launcher_int("RANK", env, why=why)
    if "WORLD_SIZE" not in env:
        raise UserError(f"WORLD_SIZE is not set (RANK={env['RANK']!r}): {why}")
    world = launcher_int("WORLD_SIZE", env, why=why)
    if rank >= world:
        raise UserError(f"RANK={rank} is not below WORLD_SIZE={world}: {why}")
    return rank, world


def launch_world_size(environ=None) -> int:
    """The ranks the default process group will have (``runtime.process_group``): ``launch_world``'s
    ``WORLD_SIZE``, 1 without ``RANK`` (a stray ``WORLD_SIZE`` is not read)."""
    world = launch_world(environ)
    return 1 if world is None else world[1]


def require_torchrun_under_srun(environ=None) -> None:
    """A ``UserError`` when several Slurm tasks run the trainer without torchrun (``srun --ntasks-per-node=8 python -m
    phf_megatron.train``): without ``RANK`` each task was a world of one, training alone into the same run directory
    (every task on the first GPU it sees). ``SLURM_STEP_NUM_TASKS`` is srun's, set in a step's tasks only."""
    env = os.environ if environ is None else environ
    tasks = env.get("SLURM_STEP_NUM_TASKS", "").strip()
    if "RANK" not in env and _whole_number(tasks) and int(tasks) > 1:
        raise UserError(srun_tasks_line(tasks))


def srun_tasks_line(tasks: str, nnodes: str | None = None) -> str:
    """The line for srun's ``tasks`` tasks each starting a run of its own: trainers without torchrun
    (``require_torchrun_under_srun``), or, given ``nnodes``, launchers for that many nodes (``examples/launch_phf.sh``
    asks for it: ``python -c``, on that error only). Both checks' wording, here."""
    said = f"SLURM_STEP_NUM_TASKS={tasks}: srun started {tasks}"
    if nnodes is None:
        return (f"{said} trainers without torchrun (no RANK): each would train alone, as one process, into the same "
                "run directory; run one task per node that starts torchrun (examples/launch_phf.sh, "
                "examples/slurm/train_phf_multinode.sbatch)")
    return (f"{said} launchers for NNODES={nnodes}: each would start a run of its own into the same RUN_DIR; run one "
            "task per node (srun --ntasks-per-node=1) with NNODES=<the nodes> and NODE_RANK=$SLURM_NODEID "
            "(examples/slurm/train_phf_multinode.sbatch)")


#: How long a rank other than 0 waits before exiting on an error that only rank 0 reports.
SILENT_RANK_WAIT_S = 10.0


def report_error(err: BaseException) -> None:
    """Print a user error as one line on stderr. Settings and flags are the same on every rank,
    so only rank 0 reports them; a file error may be one rank's own, so every rank reports it."""
    rank = process_rank()
    if rank != 0 and isinstance(err, (ConfigError, UsageError)):
        # rank 0 reports it; a silent rank that exited first would make torchrun stop rank 0 (SIGTERM)
        # before its line is out (seen in CI): give rank 0 the time to print and exit
        time.sleep(SILENT_RANK_WAIT_S)
        return
    line = err.line if isinstance(err, UserError) else str(err)
    print(f"error: {'' if rank == 0 else f'[rank {rank}] '}{line}", file=sys.stderr, flush=True)


def report_stop(err: RunStopped | StoppedAtStart) -> None:
    """Print a stopped run's line on stderr, once: ``error: <err>`` (``error: [rank R] <err>`` off rank 0). A
    ``LostRank`` or a ``StoppedAtStart`` is printed as it is raised, before the run's cleanup
    (``training.distributed.lost_rank``, ``training.stop_signal.stopping_at_once``)."""
    if not err.reported:
        err.reported = True
        rank = process_rank()
        print(f"error: {f'[rank {rank}] ' if rank else ''}{err}", file=sys.stderr, flush=True)


#: Exit code of a command stopped by Ctrl-C: the shell's code for a process killed by SIGINT (128 + 2).
INTERRUPTED_EXIT = 130


def run_command(main: Callable[[], int | None]) -> int:
    """Run a command's body: a user error (``UserError``, a missing or already existing file, an
    ``OSError`` of ``errors.WRITE_ERRNOS``: a full disk, a read-only file system, no
    permission, a dependency that is not installed) prints one line and returns exit code 2; a
    ``RunStopped`` (an engine failed; saved at that step if the weights are pushed after it, else the last
    checkpoint kept; ``LostRank``: another rank died, said by every rank left) one line and 1; a preemption while
    the run starts (``StoppedAtStart``) one line and 128 + the signal's number; Ctrl-C one line and
    ``INTERRUPTED_EXIT``; any other exception keeps its traceback."""
    try:
        return int(main() or 0)
    except (UserError, FileNotFoundError, FileExistsError) as err:
        report_error(err)
        return 2
    except ModuleNotFoundError as err:  # a dependency not installed: named, with what to install
        missing = missing_dependency(err)
        if missing is None:
            raise
        report_error(missing)
        return 2
    except OSError as err:  # a full disk, a read-only file system, no permission: named as such
        failure = write_failure(err)
        if failure is None:
            raise
        report_error(failure)
        return 2
    except RunStopped as err:  # raised on every rank together: rank 0 says what failed and what was kept
        if process_rank() == 0 or isinstance(err, LostRank):  # a lost rank may be rank 0: every survivor says it
            report_stop(err)
        else:
            time.sleep(SILENT_RANK_WAIT_S)  # as for a setting error: rank 0's line goes out before torchrun stops it
        return 1
    except StoppedAtStart as err:  # a preemption while starting: said by rank 0 as it came
        if process_rank() == 0:
            report_stop(err)
        return err.exit_code
    except KeyboardInterrupt as err:  # Ctrl-C reaches every rank: rank 0 says what was kept
        if process_rank() == 0:
            print(f"error: interrupted{f' {err}' if str(err) else ''}", file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT


#: Exit code of a command whose output pipe closed before it finished (``phf-train ... | head``):
#: the shell's code for a process killed by SIGPIPE (128 + 13), as ``yes | head`` reports it.
CLOSED_PIPE_EXIT = 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null: the reader is gone, and Python's final flush must not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def command(body: Callable[[list[str], bool], int | None]) -> Callable[..., int]:
    """A command's ``main(argv=None) -> exit code`` (what ``[project.scripts]`` names) from its
    ``body(argv, quiet)``: ``argv=None`` is this process's command line, whose start is made quiet
    (``quiet=True``; a test passes ``argv`` and keeps the warnings); user errors are one line
    with exit code 2, any other exception keeps its traceback (``run_command``).

    A reader that closes the output pipe early (``--help | head -1``) ends the command quietly, not
    with a ``BrokenPipeError`` traceback: exit code 0 when it was answering ``--help`` or had
    finished (only the last flush failed), else ``CLOSED_PIPE_EXIT`` (a run cut short is no success).
    """

    def main(argv: Sequence[str] | None = None) -> int:
        args = sys.argv[1:] if argv is None else list(argv)
        finished = False
        try:
            code = run_command(lambda: body(args, argv is None))
            finished = True
            sys.stdout.flush()   # here, not at exit: a closed pipe is then caught below
            return code
        except BrokenPipeError:
            _silence_stdout()
            return 0 if finished or wants_help(args) else CLOSED_PIPE_EXIT

    main.__doc__ = f"The command ``{body.__module__}`` (``argv=None``: this process's command line)."
    return main


def parse_command_line(cls: type, argv: Sequence[str], description: str,
                       switches: dict[str, str] | None = None):
    """A tool's command line: ``(config, switches given)``, or ``(None, set())`` after printing
    ``--help``. ``switches``: the tool's own on/off flags besides the config's (``--verbose``)."""
    switches = switches or {}
    settings = Settings(cls, options=list(switches))
    if wants_help(argv):
        print(settings.help(description, list(switches.items())))
        return None, set()
    given = {a for a in argv if a in switches}
    return settings.build(settings.parse([a for a in argv if a not in switches])), given


VERBOSE = {"--verbose": "show third-party warnings, vLLM's INFO/WARNING log and a failed engine start's tracebacks "
                        "(quiet by default)"}


def tool_config(cls: type, argv: Sequence[str], description: str, quiet: bool):
    """A tool's config from its command line, after a quiet start unless ``--verbose``
    (``quiet``: the command is this process's own, not a test calling ``main(argv)``); None after
    printing ``--help``. The start comes first: a config's checks may import torch."""
    if quiet and not wants_help(argv):
        from .startup import quiet_start

        quiet_start("--verbose" in argv)
    return parse_command_line(cls, argv, description, VERBOSE)[0]
