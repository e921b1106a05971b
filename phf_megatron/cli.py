"""The command lines' shared parser: flags generated from a config dataclass, ``--help`` from its
field docstrings, every wrong flag or value a ``UsageError`` / ``ConfigError`` naming it (running a
command, with those errors as one line: ``commands``).

A config is a dataclass whose fields are settings or nested dataclasses (sections): the trainer's
``TrainConfig`` (``--section.field=value``), the eval tool's ``EvalConfig`` and the converters'
argument classes (``--field=value``). Also accepted: ``--key value``; ``-`` for ``_``
(``--out-dir``); a bare field name that is unique across sections (``--lr``); a bool flag alone
(true) or as ``--no-field`` (false); several values after a tuple flag (``--benchmarks a b``).
Imports nothing heavy, so ``--help`` and a bad flag are answered before torch loads.

    settings = Settings(EvalConfig)
    if wants_help(argv):
        print(settings.help(__doc__))
    config = settings.build(settings.parse(argv))
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import math
import textwrap
import types
import typing
from typing import Any, Sequence

from .errors import ConfigError, UsageError, UserError, as_config_error

HELP_FLAGS = ("-h", "--help")


def wants_help(argv: Sequence[str]) -> bool:
    return any(a in HELP_FLAGS for a in argv)


# ----------------------------------------------------------------------------- the schema


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (``x: int = 1`` then ``\"\"\"...\"\"\"``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (a frozen app): no docs
        return {}
    body = tree.body[0].body
    docs = {}
    for node, following in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[node.target.id] = " ".join(inspect.cleandoc(following.value.value).split())
    return docs


@dataclasses.dataclass(frozen=True)
class Setting:
    """One flag: ``key`` (``field`` or ``section.field``), its type, default and docstring."""

    key: str
    type: Any
    default: Any
    doc: str

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def did_you_mean(key: str, known: Sequence[str], bare: bool = True) -> str:
    """``"; did you mean a, b?"`` listing the known keys close to ``key`` (or ``""``). ``bare``: a
    close field name may be offered alone (a flag: ``--lr``); False (a YAML file, where only the
    dotted keys are valid): as the dotted keys that end in it (``optimizer.lr``)."""
    leaf_names = sorted({k.rsplit(".", 1)[-1] for k in known})
    matches = difflib.get_close_matches(key, known, n=4, cutoff=0.6)
    for leaf in difflib.get_close_matches(key.rsplit(".", 1)[-1], leaf_names, n=4, cutoff=0.6):
        full = [leaf] if bare else [k for k in known if k.rsplit(".", 1)[-1] == leaf]
        matches += [m for m in full if m not in matches]
    return f"; did you mean {', '.join(matches)}?" if matches else ""


def resolve_key(key: str, types_: dict[str, Any], options: Sequence[str] = ()) -> str:
    """The full key for a dotted or unique bare key; ``UsageError`` naming the flag otherwise (``options``: the
    command's own flags besides the settings, ``config`` or ``verbose``, offered as close matches too)."""
    if key in types_:
        return key
    owners = [k for k in types_ if k.rsplit(".", 1)[-1] == key]
    if len(owners) == 1:
        return owners[0]
    if len(owners) > 1:
        raise UsageError(f"--{key}: ambiguous, it names {', '.join(owners)}; use the dotted form")
    known = [*types_, *options]
    raise UsageError(f"--{key}: unknown setting{did_you_mean(key, known) or _valid_flags(known)}")


def _valid_flags(known: Sequence[str]) -> str:
    """What an unknown flag's line says when no known one is close: a tool's flags (a handful), or where the
    trainer's (sections of them) are listed. Was "unknown setting" alone (``paper_table.py --verbose``)."""
    if any("." in k for k in known):
        return "; --help lists every setting"
    return f"; the flags: {', '.join(f'--{k}' for k in known)}"


# ----------------------------------------------------------------------------- values


def _parse_scalar(text: str, tp: type, key: str):
    if tp is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ConfigError(key, f"expected true/false, got {text!r}")
    if tp is dict:
        value = _yaml_value(text, key) if text.strip() else {}
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping like {{name: value}}, got {text!r}")
        return value
    try:
        value = tp(text)
    except ValueError:
        raise ConfigError(key, f"expected {tp.__name__}, got {text!r}") from None
    return coerce(value, tp, key) if tp is float else value   # float: refuses nan and inf


def _yaml_value(text: str, key: str) -> Any:
    """A flag's YAML value (``{name: value}``, ``[1, 2]``); broken YAML is one line naming the flag."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:   # was a traceback of the YAML parser
        where = f" (line {err.problem_mark.line + 1}, column {err.problem_mark.column + 1}: {err.problem})" \
            if getattr(err, "problem_mark", None) is not None else ""
        raise ConfigError(key, f"not valid YAML: {text!r}{where}") from None


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML or command-line value to the annotated type (``X | None``, ``tuple[T, ...]``;
    ``int | str``: the first member that takes the value)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if type(None) in args and (value is None or (isinstance(value, str) and
                                                     value.strip().lower() in ("none", "null", "~", ""))):
            return None
        for member in inner[:-1]:
            try:
                return coerce(value, member, key)
            except ConfigError:
                pass
        return coerce(value, inner[-1], key)
    if origin is tuple:
        if isinstance(value, str):
            if value.strip().startswith("["):
                value = _yaml_value(value, key)
            else:
                value = value.split(",")
        if not isinstance(value, (list, tuple)):
            value = [value]
        return tuple(coerce(v.strip() if isinstance(v, str) else v, args[0], key) for v in value)
    if origin is dict:
        tp = dict
    if tp is dict and not isinstance(value, (dict, str)):   # a YAML file's scalar or list
        raise ConfigError(key, f"expected a mapping like {{name: value}}, got {value!r}")
    if isinstance(value, str):
        return _parse_scalar(value, tp, key)
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):   # nan passes every "> 0" check; inf makes no setting meaningful
            raise ConfigError(key, f"expected a finite number, got {value}")
        return float(value)
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(key, f"expected {getattr(tp, '__name__', tp)}, got {value!r}")
    return value


def _takes_several(tp: Any) -> bool:
    """A tuple setting (``tuple[T, ...]`` or ``tuple[T, ...] | None``): several values may follow its flag."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(_takes_several(a) for a in typing.get_args(tp))
    return typing.get_origin(tp) is tuple


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is tuple:
        return f"{_type_name(args[0])},..."
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))


def _show(value: Any) -> str:
    """A value as the command line spells it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        return ",".join(_show(v) for v in value)
    return str(value)


# ----------------------------------------------------------------------------- one config class


class Settings:
    """The flags of one config dataclass: parse a command line, build the config, describe it."""

    def __init__(self, cls: type, options: Sequence[str] = ()):
        self.cls = cls
        #: The command's own flags besides the settings (``--config``, ``--verbose``): parsed by the command, named
        #: by "did you mean" here (``--confg`` was "unknown setting" alone).
        self.options = tuple(o.removeprefix("--").replace("-", "_") for o in options)
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        #: ``(section name or None, section docstring, settings)``; top-level settings first.
        self.sections: list[tuple[str | None, str, list[Setting]]] = [(None, "", [])]
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                sub_hints, sub_docs = typing.get_type_hints(tp), field_docs(tp)
                doc = inspect.cleandoc(tp.__doc__ or "").split("\n\n")[0].replace("\n", " ")
                self.sections.append((f.name, doc, [
                    Setting(f"{f.name}.{g.name}", sub_hints[g.name], _default(g), sub_docs.get(g.name, ""))
                    for g in dataclasses.fields(tp)]))
            else:
                self.sections[0][2].append(Setting(f.name, tp, _default(f), docs.get(f.name, "")))
        self.settings = {s.key: s for _, _, group in self.sections for s in group}
        self.types = {key: s.type for key, s in self.settings.items()}
        self.nested = len(self.sections) > 1

    @property
    def flag_form(self) -> str:
        return "--section.field=value" if self.nested else "--field=value"

    def resolve(self, key: str) -> str:
        return resolve_key(key.replace("-", "_"), self.types, self.options)

    def parse(self, argv: Sequence[str]) -> dict[str, str | bool | list[str]]:
        """Command-line flags -> ``{full key: raw value}`` (converted to the field types by ``build``)."""
        out: dict[str, Any] = {}
        args = list(argv)
        i = 0
        while i < len(args):
            arg = args[i]
            if not arg.startswith("--") or arg == "--":
                raise UsageError(f"unexpected argument {arg!r}: flags look like {self.flag_form}")
            key, eq, value = arg[2:].partition("=")
            key = key.replace("-", "_")
            if eq and key in self.options:   # --verbose=true: was "unknown setting; did you mean verbose?"
                raise UsageError(f"--{key}: takes no value (the command's own switch: give it alone)")
            negated = self._negated_bool(key) if not eq else None
            if negated:
                out[negated] = False
                i += 1
                continue
            full = self.resolve(key)
            if not eq:
                following = []
                while i + 1 < len(args) and not args[i + 1].startswith("--"):
                    following.append(args[i + 1])
                    i += 1
                    if not _takes_several(self.types[full]):
                        break
                if following:
                    value = following if len(following) > 1 else following[0]
                elif self.types[full] is bool:
                    value = True
                elif i + 1 < len(args) and self.types[full] is str:   # --eval_args "--limit 5": a flag's look
                    raise UsageError(f"--{key}: missing a value (one that starts with -- goes as --{key}=VALUE)")
                else:
                    raise UsageError(f"--{key}: missing a value")
            out[full] = value
            i += 1
        return out

    def _negated_bool(self, key: str) -> str | None:
        """The bool setting ``--no-<key>`` (or ``--section.no-<field>``) turns off, if ``key`` is one."""
        if key in self.types:
            return None
        section, dot, name = key.rpartition(".")
        candidates = [key[3:]] if key.startswith("no_") else []
        candidates += [f"{section}{dot}{name[3:]}"] if name.startswith("no_") and section else []
        for candidate in candidates:
            try:
                full = self.resolve(candidate)
            except UsageError:
                continue
            if self.types[full] is bool:
                return full
        return None

    def build(self, values: dict[str, Any]):
        """The config from flat ``{key: raw value}``; every error names the setting (``ConfigError``)."""
        grouped: dict[str | None, dict[str, Any]] = {name: {} for name, _, _ in self.sections}
        for key, raw in values.items():
            full = self.resolve(key)
            section, _, name = full.rpartition(".")
            grouped[section or None][name] = coerce(raw, self.types[full], full)
        for name, _, group in self.sections:
            for s in group:
                if s.required and s.key.rpartition(".")[2] not in grouped[name]:
                    raise ConfigError(s.key, "is required")
        hints = typing.get_type_hints(self.cls)
        built = {name: _construct(hints[name], grouped[name], name) for name, _, _ in self.sections[1:]}
        return _construct(self.cls, {**grouped[None], **built}, None)

    def help(self, description: str, options: Sequence[tuple[str, str]] = (), defaults: dict[str, Any] | None = None,
             source: str = "") -> str:
        """``--help``: the description, the extra options, then every setting grouped by section
        with its type, default and docstring. ``defaults``: ``{key: value}`` shown as the defaults instead of
        the code's (a preset's), marked ``from <source>`` where they differ from the code's."""
        width = 100
        lines = [description.strip(), ""]
        if options:
            lines.append("options:")
            lines += [f"  {flag:<22}{text}" for flag, text in [*options, ("-h, --help", "show this text and exit")]]
            lines.append("")
        bare = [k for k in self.types if "." in k and sum(o.endswith("." + k.split(".")[-1]) for o in self.types) == 1]
        alone = f"; a field no other section has may go alone (--{bare[0].split('.')[-1]} for --{bare[0]})" if bare else ""
        lines.append(textwrap.fill(f"settings ({self.flag_form} or {self.flag_form.split('=')[0]} value; - may "
                                   f"stand for _; a bool flag alone means true, --no-<field> false{alone}):", width))
        for name, doc, group in self.sections:
            if not group:
                continue
            lines.append("")
            if name is not None:
                lines.append(f"{name}: {doc}" if doc else f"{name}:")
            elif self.nested:
                lines.append("top level:")
            for s in group:
                default = "required" if s.required else f"default: {_show(s.default)}"
                if defaults is not None and s.key in defaults and (s.required or defaults[s.key] != s.default):
                    default = f"default: {_show(defaults[s.key])} from {source}"
                lines.append(f"  --{s.key}=<{_type_name(s.type)}>  ({default})")
                if s.doc:
                    lines.append(textwrap.fill(s.doc, width, initial_indent=" " * 6, subsequent_indent=" " * 6))
        return "\n".join(lines) + "\n"


def _construct(cls: type, kwargs: dict[str, Any], section: str | None):
    """``cls(**kwargs)``; a plain ``ValueError("field: ...")`` from its checks becomes a ``ConfigError``."""
    try:
        return cls(**kwargs)
    except UserError:
        raise
    except ValueError as err:
        named = as_config_error(err, {f.name for f in dataclasses.fields(cls)}, section)
        if named is None:
            raise
        raise named from None
