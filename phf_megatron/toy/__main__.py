"""The toy task's command line (used by ``examples/train_phf_tiny.sh``).

    python -m phf_megatron.toy prepare --out runs/phf_tiny/toy          # warmed-up model + data
    python -m phf_megatron.toy evaluate --hf-dir runs/phf_tiny/toy/hf \\
        [--adapter runs/phf_tiny/export/peft_adapter] [--json OUT.json]  # held-out accuracy table
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..commands import command


class _Parser(argparse.ArgumentParser):
    """argparse with the other commands' errors: one line naming the flag, exit code 2 (was the usage, then the
    error: two lines and more)."""

    def error(self, message: str):
        from ..errors import UsageError

        raise UsageError(message.removeprefix("argument "))


def _parser() -> argparse.ArgumentParser:
    """The command line: ``prepare`` and ``evaluate``, each flag with its help and default; ``_`` may stand for
    ``-`` (``--hf_dir``), as in every other command."""
    p = _Parser(prog="python -m phf_megatron.toy", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="build the warmed-up tiny model and the toy data")
    prep.add_argument("--out", required=True, help="a new directory (or one a stopped prepare left): train.jsonl, "
                                                   "heldout.jsonl, hf/ (the model); one holding hf/ is refused")
    prep.add_argument("--seed", type=int, default=0, help="the split, init and warm-up seed (default: %(default)s)")
    prep.add_argument("--warmup-steps", "--warmup_steps", type=int, default=300,
                      help="supervised warm-up steps of the tiny model (default: %(default)s)")
    ev = sub.add_parser("evaluate", help="greedy held-out accuracy, with and without the reference")
    ev.add_argument("--hf-dir", "--hf_dir", required=True, help="the toy's model (prepare's <out>/hf)")
    ev.add_argument("--adapter", default=None, help="a PEFT adapter directory to apply first")
    ev.add_argument("--seed", type=int, default=0, help="the split seed used by prepare (default: %(default)s)")
    ev.add_argument("--json", default=None, help="also write the table here")
    return p


def _body(argv: list[str], quiet: bool) -> int:
    """The command (``quiet`` is unused: its start prints nothing of a third party's but the bars it turns off)."""
    args = _parser().parse_args(argv)
    from ..errors import ConfigError
    from ..input_files import check_hf_model_dir, check_peft_adapter_dir, missing_dir

    if args.command == "prepare":   # was a FileExistsError traceback
        given = [("--out", args.out)] if os.path.exists(args.out) else []
        if os.path.exists(hf := os.path.join(args.out, "hf")):   # was warmed up again and replaced, in silence
            raise ConfigError("out", f"{hf} already exists (a prepared toy: remove it or choose another)")
    else:   # was "<path>: not a directory" for either flag, a missing one too
        given = [("--hf-dir", args.hf_dir)] + ([("--adapter", args.adapter)] if args.adapter else [])
    for flag, path in given:
        if why := missing_dir(path):   # one line naming the flag, as the other commands
            raise ConfigError(flag.removeprefix("--"), why)
    if args.command == "evaluate":   # was transformers' OSError traceback for a directory without a model
        try:
            check_hf_model_dir(args.hf_dir, weights=True)
        except FileNotFoundError as err:
            raise ConfigError("hf-dir", str(err)) from None
        if args.adapter and not os.path.isfile(os.path.join(args.adapter, "adapter_config.json")):
            raise ConfigError("adapter", f"{args.adapter} has no adapter_config.json (not a PEFT adapter directory)")
        if args.adapter:   # a damaged or missing file named (was PEFT's traceback: JSONDecodeError, SafetensorError)
            check_peft_adapter_dir(args.adapter)

    from ..startup import hf_progress_bars_off

    with hf_progress_bars_off():   # its bars between our log lines; the command's own scope, not the library's
        return _run(args)


def _run(args) -> int:
    from ..data.toy import make_toy_split

    if args.command == "prepare":
        from .model import prepare_toy

        paths = prepare_toy(args.out, seed=args.seed, warmup_steps=args.warmup_steps,
                            log=lambda r: print(json.dumps(r), flush=True))
        print(json.dumps(paths))
        return 0
    from .evaluate import toy_report

    report = toy_report(args.hf_dir, make_toy_split(args.seed), args.adapter)
    print("held-out greedy accuracy:  " + "  ".join(f"{k} {v:.3f}" for k, v in report.items()))
    if args.json:
        from ..output_files import write_json

        write_json(args.json, report, indent=1)
    return 0


#: ``main(argv=None) -> exit code``: a user's error (a path, a full disk, Ctrl-C) is one line (``commands.command``).
main = command(_body)


if __name__ == "__main__":
    sys.exit(main())
