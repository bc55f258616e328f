"""The command line: parse arguments, call the library, print a renderer's output. Nothing else.

Every ParamscopeError becomes one line on stderr and its exit code; --debug shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from . import __version__
from .errors import ParamscopeError

EXIT_INTERNAL = 1


def _add_model_options(parser: argparse.ArgumentParser, *, remote_code: bool = True) -> None:
    parser.add_argument("--class", dest="model_class", metavar="NAME",
                        help="build this transformers class (default: the config's architectures[0])")
    parser.add_argument("--task", metavar="TASK",
                        help="build the head for a task: text-classification, token-classification, fill-mask, "
                             "question-answering, text-generation, … or sentiment, topic, spam, intent, ner, pos, "
                             "chunking")
    parser.add_argument("--num-labels", type=int, metavar="K", help="number of labels of a classification head")
    if remote_code:
        parser.add_argument("--trust-remote-code", action="store_true",
                            help="allow executing model code named by the config's auto_map (off by default)")
    parser.add_argument("--revision", metavar="REV", help="hub revision (branch, tag or commit)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paramscope",
        description="Exact, explained parameter counts of transformers models, from a config alone.",
    )
    parser.add_argument("--version", action="version", version=f"paramscope {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    inspect = commands.add_parser("inspect", help="anatomy, roles, ties and totals of one model",
                                  description="Anatomy, roles, ties and totals of one model.")
    inspect.add_argument("model", metavar="MODEL",
                         help="preset name, config.json path, model directory, or hub id (org/name)")
    _add_model_options(inspect)
    inspect.add_argument("--json", action="store_true", help="print the JSON report (docs/json-schema.md)")
    inspect.add_argument("--depth", type=int, default=3, metavar="N", help="module tree depth (default 3)")
    inspect.add_argument("--explain", action="store_true", help="show the arithmetic behind every figure")
    inspect.add_argument("--no-tree", action="store_true", help="leave out the module tree")
    inspect.add_argument("--width", type=int, metavar="COLS", help="output width (default: the terminal's)")
    inspect.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    presets = commands.add_parser("presets", help="list the embedded presets")
    presets.add_argument("--json", action="store_true")

    from . import cli_extra, cli_formula

    cli_formula.add_parser(commands)
    cli_extra.add_parsers(commands)
    cli_extra.add_inspect_options(inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return _run(args)
    except ParamscopeError as err:
        if args.debug:
            raise
        print(f"paramscope: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # a bug in paramscope, not bad input: still one line unless --debug
        if args.debug:
            raise
        print(f"paramscope: internal error: {type(err).__name__}: {err} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL


def _run(args: argparse.Namespace) -> int:
    from . import cli_extra

    handled = cli_extra.run(args)
    if handled is not None:
        return handled
    if args.command == "inspect":
        return _inspect(args)
    if args.command == "presets":
        return _presets(args)
    if args.command == "formula":
        from . import cli_formula

        return cli_formula.run(args)
    raise AssertionError(args.command)  # pragma: no cover


def _inspect(args: argparse.Namespace) -> int:
    from .api import inspect_with_module
    from .sources import resolve

    if args.depth is not None and args.depth < 0:
        raise _usage(f"--depth must be 0 or more, got {args.depth}")
    source = resolve(args.model, revision=args.revision)
    options = dict(model_class=args.model_class, task=args.task, num_labels=args.num_labels,
                   trust_remote_code=args.trust_remote_code)
    report, module = inspect_with_module(source, **options)
    counts = heads = None
    if args.explain_counts:
        from .reconcile_counts import reconcile_counts

        counts = reconcile_counts(report, module)
    if args.heads:
        from .heads import describe_heads

        heads = describe_heads(report, task=args.task, num_labels=args.num_labels)
    if args.json:
        from .render.json import report_to_dict

        document = report_to_dict(report)
        if counts is not None:
            document["counts"] = counts.to_dict()
        if heads is not None:
            document["heads"] = heads.to_dict()
        _write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        return 0
    from .render.text import TextOptions, render_text

    width = args.width or _terminal_width()
    formula = None
    if args.explain:
        from .cli_formula import formula_link

        formula = formula_link(source, report, num_labels=args.num_labels,
                               name_class=bool(args.model_class or args.task))
    text = render_text(report, TextOptions(width=width, depth=args.depth, explain=args.explain, color=_use_color(),
                                           tree=not args.no_tree), formula)
    if heads is not None or counts is not None:
        from .render.audit import render_counts_text, render_heads_text

        if heads is not None:
            text += render_heads_text(heads, width, color=_use_color())
        if counts is not None:
            text += render_counts_text(counts, width, color=_use_color())
    _write(text)
    return 0


def _presets(args: argparse.Namespace) -> int:
    from .presets import all_presets

    presets = all_presets()
    if args.json:
        _write(json.dumps([{"name": p.name, "aliases": list(p.aliases)} for p in presets], indent=2) + "\n")
        return 0
    width = max(len(p.name) for p in presets)
    for preset in presets:
        _write(f"{preset.name:<{width}}  {', '.join(preset.aliases)}\n")
    return 0


def _usage(message: str) -> ParamscopeError:
    return ParamscopeError(message)


def _use_color() -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty()


def _terminal_width() -> int:
    if sys.stdout.isatty():
        return os.get_terminal_size(sys.stdout.fileno()).columns
    return int(os.environ.get("COLUMNS", 100))


def _write(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `paramscope inspect … | head` is normal use
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
