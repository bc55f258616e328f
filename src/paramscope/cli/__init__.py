"""The command line: parse arguments, call the library, print a renderer's output. Nothing else.

Each command is a module of this package with `add_parser(subparsers)` and `run(args) -> int`; this module only
builds the parser from them and turns errors into one line: every ParamscopeError becomes one line on stderr and
its exit code; --debug shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .._version import __version__
from ..errors import ParamscopeError
from ._common import flag_of
from . import audit, compare, diff, flops, formula, inspect, memory, plan, presets

EXIT_INTERNAL = 1
DEFAULT_COMMAND = "inspect"  # `paramscope bert-base-uncased` is `paramscope inspect bert-base-uncased`

# In the order `paramscope --help` lists them.
COMMANDS = {"inspect": inspect, "presets": presets, "formula": formula, "diff": diff, "compare": compare,
            "audit": audit, "memory": memory, "flops": flops, "plan": plan}


class _OneLineParser(argparse.ArgumentParser):
    """argparse with the project's error form: one line naming the bad value, exit 2 (no usage dump)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="paramscope",
        description="Exact, explained parameter counts of transformers models, from a config alone.",
        epilog="`paramscope MODEL …` is short for `paramscope inspect MODEL …`.",
    )
    parser.add_argument("--version", action="version", version=f"paramscope {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS.values():
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(with_default_command(joined_values(sys.argv[1:] if argv is None else list(argv))))
    if args.command is None:
        parser.print_help()
        return 2
    from .. import progress

    progress.enable()  # spinners on stderr for long work, only when stderr is a terminal
    try:
        return COMMANDS[args.command].run(args)
    except ParamscopeError as err:
        if args.debug:
            raise
        print(f"paramscope: error: {err.spelled(flag_of)}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # a bug in paramscope, not bad input: still one line unless --debug
        if args.debug:
            raise
        print(f"paramscope: internal error: {type(err).__name__}: {err} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        progress.disable()


# options whose value may begin with "-" (a negative size): argparse would take "--budget -5GiB" for two options
# and say only "expected one argument"; joined, the option's own check names the bad value
_SIGNED_VALUES = ("--budget", "--reserve", "--seq", "--batch", "--devices", "--num-labels", "--tokens")


def joined_values(argv: list[str]) -> list[str]:
    """`--budget -5GiB` as `--budget=-5GiB`, so that a negative value reaches the check that names it."""
    joined: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        following = argv[index + 1] if index + 1 < len(argv) else ""
        if arg in _SIGNED_VALUES and following[:1] == "-" and following[1:2].isdigit():
            joined.append(f"{arg}={following}")
            index += 2
            continue
        joined.append(arg)
        index += 1
    return joined


def with_default_command(argv: list[str]) -> list[str]:
    """Insert `inspect` before the first positional argument when it names no command: a command name always wins,
    so a model that happens to be called `compare` needs `paramscope inspect compare`."""
    for index, arg in enumerate(argv):
        if arg == "--":
            return argv
        if arg.startswith("-"):
            continue
        return argv if arg in COMMANDS else [*argv[:index], DEFAULT_COMMAND, *argv[index:]]
    return argv
