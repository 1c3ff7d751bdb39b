'''Command-line flags from a dataclass's fields: names, types, defaults and help have one source.

A hyper-parameter dataclass documents each field with a docstring line directly under it, as
CleanRL's ``Args`` does::

    @dataclass
    class PPOConfig:
        learning_rate: float = 3e-4
        """Adam step size at the start"""

:func:`add_dataclass_flags` gives each field a flag ``--{prefix}-{field-name}`` (underscores
become dashes; the prefix keeps two dataclasses' ``seed`` apart), whose help is that docstring
(a field without one falls back to its trailing ``# comment``) followed by the dataclass's
default. The type comes from the annotation:

- ``int``, ``float``, ``str``, ``Path``: parsed as such; ``Literal["a", "b"]``: a choice;
- ``bool``: ``--x`` / ``--no-x`` (``argparse.BooleanOptionalAction``);
- ``X | None``: as ``X``; where the default is not ``None``, the word ``none`` gives ``None``;
- ``tuple[X, ...]``: one or more values; ``tuple[X, Y]``: exactly two.

Other types (nested dataclasses, dicts, arrays) raise ``TypeError``: exclude those fields, or
give them flags of their own (a nested dataclass with its own prefix).

Defaults stay in the dataclass. The flags default to ``argparse.SUPPRESS``, so the parsed
namespace holds only the flags that were given: :func:`given` returns those fields, and
:func:`build` makes the dataclass from them, the remaining fields keeping their defaults.
When a second flag also sets a field (a shared ``--seed`` beside ``--ppo-seed``), pass its
value in ``build(..., defaults=...)``: the precedence is the field's own flag, then
``defaults``, then the dataclass default.

Used by the ``fedsched`` subcommands (``fedsched.cli``) and by scripts with their own flags.

May import: the standard library only.
'''

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

NONE_WORD = "none"  # the value that sets an optional field (``X | None``) to None


def field_help(cls: type) -> dict[str, str]:
    """Each field's attribute docstring, else its trailing ``# comment`` (base classes first,
    so a subclass's text wins). Fields with neither are absent."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # defined in a REPL or generated: no source to read
            continue
        comments = {tok.start[0]: tok.string.lstrip("#").strip()
                    for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                    if tok.type == tokenize.COMMENT}
        node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
        body = node.body
        for stmt, after in zip(body, [*body[1:], None], strict=True):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            name = stmt.target.id
            if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[name] = " ".join(inspect.cleandoc(after.value.value).split())
            elif comments.get(stmt.end_lineno or stmt.lineno):
                docs[name] = comments[stmt.end_lineno or stmt.lineno]
    return docs


def flag_name(name: str, prefix: str = "") -> str:
    """``--{prefix}-{name}`` with dashes: ``flag_name("learning_rate", "ppo")`` is ``--ppo-learning-rate``."""
    return "--" + "-".join(p for p in (prefix, name) if p).replace("_", "-")


def dest_name(name: str, prefix: str = "") -> str:
    """The namespace attribute of a field's flag (``ppo_learning_rate``)."""
    return "_".join(p for p in (prefix.replace("-", "_"), name) if p)


def default_of(f: dataclasses.Field) -> Any:
    """A field's default (calling its ``default_factory``); ``dataclasses.MISSING`` if it has none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _resolve(cls: type, f: dataclasses.Field) -> Any:
    if not isinstance(f.type, str):
        return f.type
    namespace = dict(vars(sys.modules[cls.__module__]))
    namespace.setdefault("typing", typing)
    try:
        return eval(f.type, namespace)  # the class's own annotation, in its own module
    except Exception as e:
        raise TypeError(f"{cls.__name__}.{f.name}: cannot resolve the annotation {f.type!r} ({e})") from e


def _optional(conv: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.strip().lower() == NONE_WORD else conv(text)

    parse.__name__ = getattr(conv, "__name__", "value")  # argparse names it in "invalid int value"
    return parse


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return " ".join(map(_show, value))
    return str(value)


def _argument(cls: type, f: dataclasses.Field) -> dict[str, Any]:
    """argparse keywords (type, nargs, choices, action, metavar) for one field."""
    tp = _resolve(cls, f)
    optional = False
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1 or len(args) == len(typing.get_args(tp)):
            raise TypeError(f"{cls.__name__}.{f.name}: only X | None unions become flags, not {tp}")
        tp, optional, origin = args[0], True, typing.get_origin(args[0])
    if tp is bool:
        if optional:
            raise TypeError(f"{cls.__name__}.{f.name}: bool | None has no flag form; use a bool")
        return {"action": argparse.BooleanOptionalAction}
    kw: dict[str, Any] = {}
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        kw.update(type=type(choices[0]), choices=choices)
    elif origin is tuple:
        items = typing.get_args(tp)
        if len(items) == 2 and items[1] is Ellipsis:
            kw.update(type=items[0], nargs="+")
        elif items and len(set(items)) == 1 and items[0] in (int, float, str, Path):
            kw.update(type=items[0], nargs=len(items))
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported tuple type {tp}")
        if kw["type"] not in (int, float, str, Path):
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported tuple item type {kw['type']}")
        kw["metavar"] = kw["type"].__name__.upper()
    elif tp in (int, float, str, Path):
        kw.update(type=tp, metavar=tp.__name__.upper())
    else:
        raise TypeError(f"{cls.__name__}.{f.name}: type {tp} has no flag form; exclude the field "
                        "or give it a flag of its own")
    if optional and default_of(f) is not None:
        if "nargs" in kw:
            raise TypeError(f"{cls.__name__}.{f.name}: an optional tuple needs the default None")
        kw["type"] = _optional(kw["type"])
        if "metavar" in kw:
            kw["metavar"] += f"|{NONE_WORD}"
    return kw


def _fields(cls: type, exclude: Iterable[str]) -> list[dataclasses.Field]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    skip = set(exclude)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = skip - names
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
    return [f for f in dataclasses.fields(cls) if f.init and f.name not in skip]


def add_dataclass_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, *,
                        prefix: str = "", exclude: Iterable[str] = (),
                        aliases: Mapping[str, str | Sequence[str]] | None = None,
                        title: str | None = None, description: str | None = None) -> list[str]:
    """Add one flag per field of the dataclass ``cls`` (see the module docstring); returns the
    names of the fields that got one.

    ``aliases`` maps a field to further option strings (e.g. ``{"num_steps": "--num-steps"}``
    beside ``--ppo-num-steps``); with ``title``, the flags form an argument group of that title.
    """
    aliases = dict(aliases or {})
    unknown = set(aliases) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"aliases for unknown field(s) of {cls.__name__}: {sorted(unknown)}")
    target = parser.add_argument_group(title, description) if title is not None else parser
    docs = field_help(cls)
    added = []
    for f in _fields(cls, exclude):
        kw = _argument(cls, f)
        default = default_of(f)
        text = docs.get(f.name, "")
        if default is dataclasses.MISSING:
            kw["required"] = True
        elif default is not None:
            text = f"{text} (default: {_show(default)})" if text else f"default: {_show(default)}"
        extra = aliases.get(f.name, ())
        names = [flag_name(f.name, prefix), *([extra] if isinstance(extra, str) else extra)]
        target.add_argument(*names, dest=dest_name(f.name, prefix), default=argparse.SUPPRESS,
                            help=text.replace("%", "%%"), **kw)
        added.append(f.name)
    return added


def given(cls: type, ns: argparse.Namespace, *, prefix: str = "",
          exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The fields of ``cls`` whose flags were given, by field name (tuples as tuples)."""
    out = {}
    for f in _fields(cls, exclude):
        dest = dest_name(f.name, prefix)
        if hasattr(ns, dest):
            value = getattr(ns, dest)
            out[f.name] = tuple(value) if isinstance(value, list) else value
    return out


def build(cls: type, ns: argparse.Namespace, *, prefix: str = "", exclude: Iterable[str] = (),
          defaults: Mapping[str, Any] | None = None) -> Any:
    """The dataclass from the parsed flags: a given flag, else ``defaults[field]``, else the
    dataclass default. Excluded fields (no flags) are set through ``defaults`` only."""
    values = dict(defaults or {})
    values.update(given(cls, ns, prefix=prefix, exclude=exclude))
    return cls(**values)


def to_argv(obj: Any, *, prefix: str = "", exclude: Iterable[str] = ()) -> list[str]:
    """The flags that rebuild ``obj`` (a dataclass instance) through :func:`build`: the inverse,
    for the fields with flags (a round trip: ``build(type(obj), parse(to_argv(obj))) == obj``)."""
    cls = type(obj)
    argv: list[str] = []
    for f in _fields(cls, exclude):
        value, name = getattr(obj, f.name), flag_name(f.name, prefix)
        if isinstance(value, bool):
            argv.append(name if value else "--no-" + name[2:])
        elif value is None:
            if default_of(f) is not None:
                argv += [name, NONE_WORD]
        elif isinstance(value, tuple):
            argv += [name, *map(str, value)]
        else:
            argv += [name, repr(value) if isinstance(value, float) else str(value)]
    return argv
