"""The ``fedsched`` command line.

Subcommands are small modules of this package registered in ``SUBCOMMANDS`` (name ->
"module:attribute" of a ``register(subparsers)`` function) and imported only when used, so
``fedsched evaluate`` never pays for torch or Flower.

May import: the standard library; the subcommand modules of ``fedsched.cli`` by name.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS: dict[str, str] = {
    "evaluate": "fedsched.cli.evaluate:register",
    "train": "fedsched.cli.train:register",
    "federate": "fedsched.cli.federate:register",
    "export": "fedsched.cli.export:register",
    "certs": "fedsched.cli.certs:register",
    "serve": "fedsched.cli.serve:register",
    "evidence": "fedsched.cli.evidence:register",
    "record": "fedsched.cli.record:register",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedsched", description="Federated RL scheduling for Kubernetes fleets.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, target in SUBCOMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=f"(see fedsched {name} --help)")
            continue
        module, attr = target.split(":")
        getattr(importlib.import_module(module), attr)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    wanted = next((a for a in argv if a in SUBCOMMANDS), None)
    parser = build_parser(only=wanted)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as e:  # bad input, a file or port it cannot use: one line, no traceback
        print(f"fedsched {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
