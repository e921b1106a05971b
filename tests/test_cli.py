"""The command-line machinery (phf_megatron/cli.py, commands.py): flags and --help generated from config
dataclasses, user errors as one line with exit code 2 (once, by rank 0, under torchrun too), other
exceptions with their traceback, and a closed output pipe. Each real command's flags: test_command_lines.py."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from phf_megatron import commands
from phf_megatron.cli import Settings
from phf_megatron.commands import parse_command_line, run_command
from phf_megatron.errors import ConfigError, InputFileError, LostRank, RunStopped, UsageError
from tests.helpers import REPO, python_env

TOOLS = os.path.join(REPO, "tools")


@dataclass
class Inner:
    """An inner section."""

    rate: float = 0.5
    """How fast (paper: 0.5)."""
    on: bool = False
    """A switch."""


@dataclass
class Outer:
    """A config with a top-level field and a section."""

    name: str = "x"
    """The name."""
    layers: tuple[int, ...] | None = None
    """Some layers; None: all."""
    extra: dict = field(default_factory=dict)
    """Extra fields."""
    inner: Inner = field(default_factory=Inner)

    def __post_init__(self):
        if self.name == "bad":
            raise ValueError("name: must not be 'bad'")


@dataclass
class Flat:
    out_dir: str
    """Where to write."""
    n: int = 2


def test_flags_in_every_spelling():
    s = Settings(Outer)
    cfg = s.build(s.parse(["--name", "y", "--inner.rate=0.25", "--on", "--layers", "1", "2", "3",
                           "--extra={a: 1}"]))
    assert cfg == Outer(name="y", layers=(1, 2, 3), extra={"a": 1}, inner=Inner(rate=0.25, on=True))
    assert s.build(s.parse(["--inner.on=true", "--no-inner.on", "--layers=[4, 5]"])) == Outer(layers=(4, 5))
    assert s.build(s.parse(["--inner.no-on", "--layers=none"])).inner.on is False
    flat = Settings(Flat)
    assert flat.build(flat.parse(["--out-dir", "o", "--n=-3"])) == Flat(out_dir="o", n=-3)


@pytest.mark.parametrize("argv, error, line", [
    (["--nmae=y"], UsageError, "--nmae: unknown setting; did you mean name?"),
    (["--verbose"], UsageError, "--verbose: unknown setting; --help lists every setting"),   # none close: was alone
    (["--inner.rate"], UsageError, "--inner.rate: missing a value"),
    (["y"], UsageError, "unexpected argument 'y': flags look like --section.field=value"),
    (["--inner.rate=fast"], ConfigError, "--inner.rate: expected float, got 'fast'"),
    (["--inner.on=maybe"], ConfigError, "--inner.on: expected true/false, got 'maybe'"),
    (["--inner.rate=nan"], ConfigError, "--inner.rate: expected a finite number, got nan"),   # passed "> 0" checks
    (["--inner.rate=-inf"], ConfigError, "--inner.rate: expected a finite number, got -inf"),
    (["--name=bad"], ConfigError, "--name: must not be 'bad'"),
    (["--extra=[1]"], ConfigError, "--extra: expected a mapping like {name: value}, got '[1]'"),
    # broken YAML in a mapping or list flag (phf-eval's --engine_kwargs, --rollout.vllm_kwargs): was a YAML traceback
    (["--extra={a: 1"], ConfigError,
     "--extra: not valid YAML: '{a: 1' (line 1, column 6: expected ',' or '}', but got '<stream end>')"),
    (["--layers=[1, 2"], ConfigError,
     "--layers: not valid YAML: '[1, 2' (line 1, column 6: expected ',' or ']', but got '<stream end>')"),
])
def test_bad_flags_are_one_line_naming_the_flag(argv, error, line):
    s = Settings(Outer)
    with pytest.raises(error) as err:
        s.build(s.parse(argv))
    assert err.value.line == line


def test_required_field_and_flat_form():
    s = Settings(Flat)
    with pytest.raises(ConfigError) as err:
        s.build(s.parse(["--n=3"]))
    assert err.value.line == "--out_dir: is required"
    with pytest.raises(UsageError, match="flags look like --field=value"):
        s.parse(["o"])
    with pytest.raises(UsageError) as err:   # none close: a tool's flags are listed (was "unknown setting" alone)
        s.parse(["--verbose"])
    assert err.value.line == "--verbose: unknown setting; the flags: --out_dir, --n"


def test_help_lists_every_field_with_type_default_and_docstring():
    text = Settings(Outer).help("Describe me.", [("--print-config", "print it")])
    assert text.startswith("Describe me.") and "--print-config" in text
    for line in ("  --name=<str>  (default: x)", "      The name.", "  --layers=<int,... | None>  (default: None)",
                 "inner: An inner section.", "  --inner.rate=<float>  (default: 0.5)", "      How fast (paper: 0.5).",
                 "  --inner.on=<bool>  (default: false)"):
        assert line in text.splitlines(), line
    assert "  --out_dir=<str>  (required)" in Settings(Flat).help("").splitlines()


def test_run_command_prints_user_errors_as_one_line_and_keeps_other_tracebacks(capsys, monkeypatch):
    def fail(err):
        def body():
            raise err
        return body

    monkeypatch.delenv("RANK", raising=False)
    assert run_command(fail(ConfigError("a.b", "too big"))) == 2
    assert run_command(fail(InputFileError("x.jsonl:3", "invalid JSON"))) == 2
    assert run_command(fail(FileNotFoundError("config file 'c.yaml' does not exist"))) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --a.b: too big", "error: x.jsonl:3: invalid JSON", "error: config file 'c.yaml' does not exist"]
    with pytest.raises(RuntimeError, match="a bug"):
        run_command(fail(RuntimeError("a bug")))
    with pytest.raises(ValueError, match="plain"):  # a ValueError that names no setting is not a user error
        run_command(fail(ValueError("plain")))
    def grade():  # the eval's grader on a machine without math-verify (seen on a GPU machine)
        import math_verify  # noqa: F401

    monkeypatch.setitem(sys.modules, "math_verify", None)   # its import fails as an absent package's does
    assert run_command(grade) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: a dependency is not installed: no module named 'math_verify' (pip install math-verify; "
        "the README's install command installs them all)"]
    with pytest.raises(ModuleNotFoundError, match="phf_megatron.no_such_module"):   # our own module: a bug
        run_command(lambda: __import__("phf_megatron.no_such_module"))
    def interrupted():
        raise KeyboardInterrupt("during step 3 of 9; no checkpoint was saved")

    assert run_command(interrupted) == commands.INTERRUPTED_EXIT == 130   # Ctrl-C: one line, the shell's code for SIGINT
    assert capsys.readouterr().err.splitlines() == ["error: interrupted during step 3 of 9; no checkpoint was saved"]
    monkeypatch.setattr(commands, "SILENT_RANK_WAIT_S", 0.0)
    monkeypatch.setenv("RANK", "1")  # settings are the same on every rank: only rank 0 reports them
    assert run_command(fail(ConfigError("a.b", "too big"))) == 2
    assert run_command(fail(InputFileError("shard.pt", "truncated"))) == 2
    assert capsys.readouterr().err.splitlines() == ["error: [rank 1] shard.pt: truncated"]
    # a stop raised on every rank together: rank 0 says it; a lost rank may be rank 0: every rank left says it
    assert run_command(fail(RunStopped("rollout engine 0 (host rank 0): died"))) == 1
    assert run_command(fail(LostRank("lost contact with another rank (step 3 of 9: ...)"))) == 1
    assert capsys.readouterr().err.splitlines() == ["error: [rank 1] lost contact with another rank (step 3 of 9: ...)"]
    lost = LostRank("lost contact with another rank (starting: ...)")
    commands.report_stop(lost)  # said as it is raised, before the run's cleanup: the command line does not repeat it
    assert run_command(fail(lost)) == 1
    assert capsys.readouterr().err.splitlines() == ["error: [rank 1] lost contact with another rank (starting: ...)"]


def test_tool_switches_and_help(capsys):
    assert parse_command_line(Flat, ["--help"], "Flat tool.", {"--verbose": "louder"}) == (None, set())
    assert "--verbose             louder" in capsys.readouterr().out
    assert parse_command_line(Flat, ["--out_dir=o", "--verbose"], "", {"--verbose": ""}) == (Flat("o"), {"--verbose"})
    with pytest.raises(UsageError) as err:   # a misspelt switch: was "unknown setting" alone
        parse_command_line(Flat, ["--out_dir=o", "--verbos"], "", {"--verbose": ""})
    assert err.value.line == "--verbos: unknown setting; did you mean verbose?"
    with pytest.raises(UsageError) as err:   # a switch given a value: was "unknown setting; did you mean verbose?"
        parse_command_line(Flat, ["--out_dir=o", "--verbose=true"], "", {"--verbose": ""})
    assert err.value.line == "--verbose: takes no value (the command's own switch: give it alone)"


# ----------------------------------------------------------------------------- a closed output pipe

COMMANDS = [["-m", "phf_megatron.train"], [os.path.join(TOOLS, "convert", "hf_to_mcore.py")],
            [os.path.join(TOOLS, "convert", "mcore_to_hf.py")], [os.path.join(TOOLS, "eval_avg_at_k.py")],
            [os.path.join(TOOLS, "plot_run.py")]]


def _with_closed_stdout(args: list[str]) -> tuple[int, str]:
    """Run ``python ARGS`` whose stdout pipe has no reader from the start (every write fails with
    EPIPE, as after ``| head -1`` took its line): exit code and stderr."""
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=python_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: os.path.basename(a[-1]))
def test_help_into_a_closed_pipe_exits_quietly_with_0(args):
    """``phf-* --help | head -1``: no BrokenPipeError traceback, exit code 0 (was 1 or 120, by chance)."""
    code, err = _with_closed_stdout([*args, "--help"])
    assert (code, err) == (0, "")


def test_help_piped_to_head_has_exit_status_0_in_the_shell():
    script = " ".join(f"{sys.executable} {' '.join(a)} --help | head -1 >/dev/null; echo ${{PIPESTATUS[0]}};"
                      for a in COMMANDS)
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, env=python_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.stdout.split() == ["0"] * len(COMMANDS) and proc.stderr == "", proc.stderr


def test_a_run_cut_short_by_a_closed_pipe_is_quiet_but_no_success():
    """Output that fails mid-command (not --help, not the final flush): exit code 141, like SIGPIPE."""
    code = ("import sys\nfrom phf_megatron.commands import command\n"
            "def body(argv, quiet):\n    for _ in range(1000):\n        print('x' * 1000, flush=True)\n"
            "sys.exit(command(body)())")
    exit_code, err = _with_closed_stdout(["-c", code])
    assert (exit_code, err) == (141, "")
