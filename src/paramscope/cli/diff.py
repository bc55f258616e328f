"""The commands diff, compare and audit, and inspect's --explain-counts and --heads: a thin argparse layer.

cli.py wires it in with `add_parsers(commands)`, `add_inspect_options(inspect_parser)` and, first thing in its
dispatch, `run(args)`, which returns an exit code for what it handles and None for everything else.
"""

from __future__ import annotations

import argparse
from typing import Any

from .errors import ParamscopeError

EXTRA_COMMANDS = ("diff", "compare", "audit")


def add_parsers(subparsers: Any) -> None:
    """Add the diff, compare and audit subcommands to cli.py's subparsers."""
    from .cli import _add_model_options

    diff = subparsers.add_parser(
        "diff", help="what changes between two models or classes: added, removed, reshaped, tied",
        description="What changes from model A to model B, parameter by parameter, in exact figures and plain "
                    "words. A and B are MODEL[:CLASS], e.g. bert-base-uncased:BertModel "
                    "bert-base-uncased:BertForMaskedLM; the part after ':' may also be a task (fill-mask, ner, …).")
    diff.add_argument("a", metavar="A", help="MODEL[:CLASS] before")
    diff.add_argument("b", metavar="B", help="MODEL[:CLASS] after")
    diff.add_argument("--num-labels", type=int, metavar="K", help="number of labels of classification heads (both)")
    _common(diff)
    diff.add_argument("--json", action="store_true", help="print the diff as JSON")
    diff.add_argument("--all", action="store_true", dest="all_rows", help="list every tensor, not groups")
    _width(diff)

    compare = subparsers.add_parser(
        "compare", help="several models side by side: totals, roles and shares",
        description="Several models side by side: totals, role groups and shares. Each MODEL is MODEL[:CLASS]; "
                    "--class/--task/--num-labels apply to the models that name no class.")
    compare.add_argument("models", nargs="+", metavar="MODEL", help="two or more MODEL[:CLASS]")
    compare.add_argument("--class", dest="model_class", metavar="NAME", help="class for models without ':CLASS'")
    compare.add_argument("--task", metavar="TASK", help="task for models without ':CLASS'")
    compare.add_argument("--num-labels", type=int, metavar="K", help="number of labels of classification heads")
    _common(compare)
    output = compare.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the comparison as JSON")
    output.add_argument("--csv", action="store_true", help="print the comparison as CSV, one row per model")
    compare.add_argument("--roles", action="store_true", help="show every role, not only role groups")
    _width(compare)

    audit = subparsers.add_parser(
        "audit", help="reconcile a real checkpoint with the architecture, reading headers only",
        description="Reconcile a checkpoint (safetensors, sharded safetensors, or a zip-format PyTorch .bin) "
                    "with the model its config describes: matched, missing, unexpected and non-parameter "
                    "tensors, shape mismatches, dtypes and bytes. Only headers are read.")
    audit.add_argument("path", metavar="PATH_OR_ID",
                       help="checkpoint file, model directory, Hugging Face cache folder, or hub id (read from the "
                            "local cache, else its safetensors headers from the Hub)")
    audit.add_argument("--config", metavar="MODEL",
                       help="the model to compare with (preset, config.json, directory, hub id); default: the "
                            "config.json next to the checkpoint")
    _add_model_options(audit)
    audit.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    audit.add_argument("--json", action="store_true", help="print the model's JSON report plus \"checkpoint\"")
    audit.add_argument("--all", action="store_true", dest="all_rows", help="list every key, not the first 20")
    _width(audit)


def add_inspect_options(inspect_parser: argparse.ArgumentParser) -> None:
    """Add --explain-counts and --heads to cli.py's inspect parser."""
    inspect_parser.add_argument(
        "--explain-counts", action="store_true",
        help="reconcile the counts people see: unique, with tied duplicates, torchinfo 1.8, "
             "transformers' exclude_embeddings, buffers, state_dict")
    inspect_parser.add_argument(
        "--heads", action="store_true",
        help="what the task head adds, with its arithmetic, and a typical label count for a use-case task")


def run(args: argparse.Namespace) -> int | None:
    """Handle the extra commands; None for everything cli.py handles itself."""
    if args.command == "diff":
        return _diff(args)
    if args.command == "compare":
        return _compare(args)
    if args.command == "audit":
        return _audit(args)
    return None


# ---------------------------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow executing model code named by the config's auto_map (off by default)")
    parser.add_argument("--revision", metavar="REV", help="hub revision (branch, tag or commit)")
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _width(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--width", type=int, metavar="COLS", help="output width (default: the terminal's)")


def _output():
    from .cli import _terminal_width, _use_color, _write

    return _write, _terminal_width, _use_color


def _width_of(args) -> int:
    _, terminal_width, _ = _output()
    if args.width is not None and args.width < 20:
        raise ParamscopeError(f"--width must be 20 or more, got {args.width}")
    return args.width or terminal_width()


def _diff(args) -> int:
    from .diff import diff_reports, inspect_spec, parse_spec
    from .heads import describe_heads
    from .render.diff import render_diff_json, render_diff_text

    write, _, use_color = _output()
    specs = [parse_spec(args.a), parse_spec(args.b)]
    a, b = (inspect_spec(s, num_labels=args.num_labels, trust_remote_code=args.trust_remote_code,
                         revision=args.revision) for s in specs)
    result = diff_reports(a, b, a_label=specs[0].text, b_label=specs[1].text)
    if args.json:
        write(render_diff_json(result) + "\n")
        return 0
    heads = []
    b_heads = describe_heads(b)
    if b_heads.parts:
        heads.append((f"b ({b.model.class_name})", b_heads))
    a_heads = describe_heads(a)
    if a_heads.parts and {p.module for p in a_heads.parts} != {p.module for p in b_heads.parts}:
        heads.append((f"a ({a.model.class_name})", a_heads))
    write(render_diff_text(result, _width_of(args), color=use_color(), all_tensors=args.all_rows, heads=heads))
    return 0


def _compare(args) -> int:
    from .compare import compare_reports
    from .diff import inspect_spec, parse_spec
    from .render.compare import render_compare_csv, render_compare_json, render_compare_text

    write, _, use_color = _output()
    if len(args.models) < 2:
        raise ParamscopeError(f"compare needs two or more models, got {len(args.models)}: {args.models[0]}")
    specs = [parse_spec(m) for m in args.models]
    reports = [inspect_spec(s, model_class=args.model_class, task=args.task, num_labels=args.num_labels,
                            trust_remote_code=args.trust_remote_code, revision=args.revision) for s in specs]
    comparison = compare_reports(reports, [s.text for s in specs])
    if args.json:
        write(render_compare_json(comparison) + "\n")
    elif args.csv:
        write(render_compare_csv(comparison))
    else:
        write(render_compare_text(comparison, _width_of(args), color=use_color(), roles=args.roles))
    return 0


def _audit(args) -> int:
    from .audit import audit
    from .render.audit import render_audit_json, render_audit_text

    write, _, use_color = _output()
    result = audit(args.path, config=args.config, model_class=args.model_class, task=args.task,
                   num_labels=args.num_labels, trust_remote_code=args.trust_remote_code, revision=args.revision)
    if args.json:
        write(render_audit_json(result) + "\n")
    else:
        write(render_audit_text(result, _width_of(args), color=use_color(), all_keys=args.all_rows))
    return 0


