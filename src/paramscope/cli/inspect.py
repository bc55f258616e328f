"""`paramscope inspect MODEL`: anatomy, roles, ties and totals of one model."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import OptionError
from ._common import (add_cache_option, add_debug_option, add_html_option, add_model_options, add_width_option,
                      checked_html_path, checked_width, use_color, write, write_html_page,
                      write_report_json)
from ._recording import record_after_build


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("inspect", help="anatomy, roles, ties and totals of one model",
                                   description="Anatomy, roles, ties and totals of one model.")
    parser.add_argument("model", metavar="MODEL",
                        help="preset name, config.json path, model directory, or hub id (org/name)")
    add_model_options(parser)
    parser.add_argument("--json", action="store_true", help="print the JSON report (docs/json-schema.md)")
    add_html_option(parser)
    parser.add_argument("--depth", type=int, default=3, metavar="N", help="module tree depth (default 3)")
    parser.add_argument("--explain", action="store_true", help="show the arithmetic behind every figure")
    parser.add_argument("--no-tree", action="store_true", help="leave out the module tree")
    add_width_option(parser)
    add_cache_option(parser)
    add_debug_option(parser)
    parser.add_argument(
        "--explain-counts", action="store_true",
        help="reconcile the counts people see: unique, with tied duplicates, torchinfo 1.8, "
             "transformers' exclude_embeddings, buffers, state_dict")
    parser.add_argument(
        "--heads", action="store_true",
        help="what the task head adds, with its arithmetic, and a typical label count for a use-case task")


def run(args: argparse.Namespace) -> int:
    from ..api import inspect_source
    from ..sources import resolve

    if args.depth is not None and args.depth < 0:
        raise OptionError(f"--depth must be 0 or more, got {args.depth}")
    width = None if args.json else checked_width(args)  # bad options fail before any build
    checked_html_path(args)
    source = resolve(args.model, revision=args.revision)
    # --explain-counts walks the module: a template's stand-ins carry what torchinfo's and transformers'
    # conventions read (modules, shared ones, tied tensors, which are embeddings), so no build is needed
    report, module = inspect_source(source, model_class=args.model_class, task=args.task,
                                    num_labels=args.num_labels, trust_remote_code=args.trust_remote_code,
                                    use_cache=not args.no_cache)
    _show(args, source, report, module, width)
    if not args.no_cache and not args.trust_remote_code:
        record_after_build(report, source, model_class=args.model_class, task=args.task,
                           num_labels=args.num_labels, debug=args.debug)
    return 0


def _show(args: argparse.Namespace, source: Any, report: Any, module: Any, width: int | None) -> None:
    counts = heads = None
    if args.explain_counts:
        from ..reconcile_counts import reconcile_counts

        counts = reconcile_counts(report, module)
    if args.heads:
        from ..heads import describe_heads

        heads = describe_heads(report, task=args.task, num_labels=args.num_labels)
    if args.html is not None:
        from ..render.html.report import render_report_html

        write_html_page(render_report_html(report), args.html)
    if args.json:
        write_report_json(report, counts=None if counts is None else counts.to_dict(),
                          heads=None if heads is None else heads.to_dict())
        return
    if args.html is not None:  # the page replaces the text (with --json, stdout still gets the JSON)
        return
    from ..render.text import TextOptions, render_text

    formula = None
    if args.explain:
        from ..formula_link import formula_link

        formula = formula_link(source, report, num_labels=args.num_labels,
                               name_class=bool(args.model_class or args.task))
    text = render_text(report, TextOptions(width=width, depth=args.depth, explain=args.explain, color=use_color(),
                                           tree=not args.no_tree), formula)
    if heads is not None or counts is not None:
        from ..render.audit import render_counts_text, render_heads_text

        if heads is not None:
            text += render_heads_text(heads, width, color=use_color())
        if counts is not None:
            text += render_counts_text(counts, width, color=use_color())
    write(text)
