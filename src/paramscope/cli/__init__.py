"""The command line: parse arguments, call the library, print a renderer's output. Nothing else.

Each command is a module of this package with `add_parser(subparsers)` and `run(args) -> int`; this module only
builds the parser from them and turns errors into one line: every ParamscopeError becomes one line on stderr and
its exit code; --debug shows the traceback.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from typing import Sequence

from .._version import __version__
from ..errors import ParamscopeError
from ._common import flag_of
from . import audit, compare, diff, flops, formula, inspect, memory, plan, presets, serve

EXIT_INTERNAL = 1
DEFAULT_COMMAND = "inspect"  # `paramscope bert-base-uncased` is `paramscope inspect bert-base-uncased`

# In the order `paramscope --help` lists them.
COMMANDS = {"inspect": inspect, "presets": presets, "formula": formula, "diff": diff, "compare": compare,
            "audit": audit, "memory": memory, "flops": flops, "serve": serve, "plan": plan}


class _UsageError(Exception):
    """argparse's complaint, raised to main, which words it with the command line at hand (usage_message)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str):
        super().__init__(message)
        self.parser = parser
        self.message = message


class _OneLineParser(argparse.ArgumentParser):
    """argparse with the project's error form: one line naming the bad value, exit 2 (no usage dump)."""

    def error(self, message: str):  # type: ignore[override]
        raise _UsageError(self, message)


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
    argv = joined_values(sys.argv[1:] if argv is None else list(argv))
    mistaken = unknown_command(argv, parser)
    if mistaken is not None:
        print(f"paramscope: error: {mistaken}", file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(with_default_command(argv))
    except _UsageError as err:
        print(f"paramscope: error: {usage_message(err, with_default_command(argv), parser)}", file=sys.stderr)
        return 2
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
        print(f"paramscope: error: {err.spelled(flag_of)}{_command_hint(argv, err)}", file=sys.stderr)
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


def _first_word(argv: list[str]) -> int | None:
    """The index of the first argument that is no option (the command, or the model of an implied inspect)."""
    for index, arg in enumerate(argv):
        if arg == "--":
            return None
        if not arg.startswith("-") or arg == "-":
            return index
    return None


def _close_command(word: str, cutoff: float) -> str | None:
    found = difflib.get_close_matches(word.lower(), list(COMMANDS), n=1, cutoff=cutoff)
    return found[0] if found else None


def _may_be_model(word: str) -> bool:
    """A path, a hub id or a preset: never taken for a misspelled command."""
    from ..presets import find_preset

    return ("/" in word or os.sep in word or word.startswith(".") or word.endswith(".json")
            or os.path.exists(word) or find_preset(word) is not None)


def unknown_command(argv: list[str], parser: argparse.ArgumentParser) -> str | None:
    """The one-line message when the first word is meant as a command but names none, else None.

    `paramscope bert-base-uncased` is inspect: a first word that is no command is a model. But a word that is not a
    model (no path, hub id or preset) and is followed by another argument inspect would not take (`paramscope
    explode gpt2`, `paramscope inpsect gpt2`) was meant as a command: without this, argparse blamed the model
    ("unrecognized arguments: gpt2")."""
    index = _first_word(argv)
    if index is None:
        return None
    word = argv[index]
    following = _another_positional(argv[index + 1:], parser)
    if word in COMMANDS or following is None:
        return None
    from ..errors import short_repr

    if _may_be_model(word):
        return (f"inspect takes one model, got {short_repr(word, 60)} and then {short_repr(following, 60)} "
                "(several models: `paramscope compare A B …`)")
    close = _close_command(word, 0.6)
    hint = f"did you mean {close!r}?" if close else "the commands are " + ", ".join(COMMANDS) + " (see --help)"
    return f"unknown command {short_repr(word, 60)}; {hint}"


def _another_positional(rest: list[str], parser: argparse.ArgumentParser) -> str | None:
    """The first positional argument in `rest` (what follows the first word), skipping inspect's option values
    (`--depth 2`), or None."""
    actions = _subparser(parser, DEFAULT_COMMAND)._option_string_actions
    skip = False
    for arg in rest:
        if skip:
            skip = False
            continue
        if arg == "--":
            return None
        if arg.startswith("-") and arg != "-":
            action = actions.get(arg)
            skip = "=" not in arg and action is not None and action.nargs != 0
            continue
        return arg
    return None


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def _command_hint(argv: list[str], err: ParamscopeError) -> str:
    """For `paramscope inpsect` alone (taken for a model, as a first word that is no command is): the unknown-model
    error also names the command it resembles."""
    index = _first_word(argv)
    if index is None or argv[index] in COMMANDS or not str(err).startswith("unknown model"):
        return ""
    close = _close_command(argv[index], 0.75)
    return f"; or the command {close!r}? (`paramscope {close} …`)" if close else ""


def usage_message(err: _UsageError, argv: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's message in the project's words: the flag and the bad value first, a name beginning with '-'
    explained, a misspelled option's closest spelling; never longer than a line."""
    from ..errors import short_repr

    index = _first_word(argv)
    command = argv[index] if index is not None and argv[index] in COMMANDS else None
    sub = _subparser(parser, command) if command else parser
    options = sorted(option for option in sub._option_string_actions if option.startswith("--"))
    message = err.message
    typed = re.match(r"argument (\S+?)(?:/\S+)?: invalid (int|float) value: (.*)$", message, re.S)
    if typed:
        what = "a whole number" if typed.group(2) == "int" else "a number"
        message = f"{typed.group(1)} must be {what}, got {short_repr(_unquoted(typed.group(3)), 60)}"
    dashed = [arg for arg in argv[0 if index is None else index + 1:] if arg.startswith("-") and arg != "-" and not arg.startswith("--")
              and arg.split("=")[0] not in sub._option_string_actions and not _number(arg)]
    if message.startswith("the following arguments are required") and dashed:
        message += (f"; {short_repr(dashed[0], 60)} was read as an option: a name beginning with '-' needs `--` "
                    f"before it (paramscope {command or DEFAULT_COMMAND} -- {short_repr(dashed[0], 60)[1:-1]})")
    elif message.startswith("unrecognized arguments:"):
        unknown = message.split(":", 1)[1].split()
        first = unknown[0] if unknown else ""
        close = difflib.get_close_matches(first.split("=")[0], options, n=1, cutoff=0.7) if first[:2] == "--" else []
        message = f"unrecognized arguments: {short_repr(' '.join(unknown), 100)[1:-1]}"
        if close:
            message += f"; did you mean {close[0]}?"
        elif first in dashed:
            message += (f" (a name beginning with '-' needs `--` before it: paramscope {command or DEFAULT_COMMAND}"
                        f" -- {short_repr(first, 60)[1:-1]})")
    message = " ".join(message.split())
    if len(message) > 400:
        message = message[:397] + "..."
    return f"{message} (see `paramscope {command + ' ' if command else ''}--help`)"


def _unquoted(text: str) -> str:
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == "'" else text


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
