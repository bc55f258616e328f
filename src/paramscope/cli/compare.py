"""`paramscope compare MODEL MODEL …`: several models side by side: totals, role groups and shares."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import OptionError
from ._common import (add_cache_option, add_debug_option, add_html_option, add_source_options, add_width_option,
                      checked_html_path, checked_width, use_color, write, write_html_page)
from ._recording import record_after_build


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compare", help="several models side by side: totals, roles and shares",
        description="Several models side by side: totals (with a mixture of experts, the parameters a token "
                    "uses), role groups and shares. Each MODEL is MODEL[:CLASS]; --class/--task/--num-labels apply "
                    "to the models that name no class.")
    parser.add_argument("models", nargs="+", metavar="MODEL", help="two or more MODEL[:CLASS]")
    parser.add_argument("--class", dest="model_class", metavar="NAME", help="class for models without ':CLASS'")
    parser.add_argument("--task", metavar="TASK", help="task for models without ':CLASS'")
    parser.add_argument("--num-labels", type=int, metavar="K", help="number of labels of classification heads")
    add_source_options(parser)
    add_cache_option(parser)
    add_debug_option(parser)
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the comparison as JSON")
    output.add_argument("--csv", action="store_true", help="print the comparison as CSV, one row per model")
    add_html_option(parser)
    parser.add_argument("--roles", action="store_true", help="show every role, not only role groups")
    add_width_option(parser)


def run(args: argparse.Namespace) -> int:
    from ..compare import compare_reports
    from ..diff import inspect_specs, parse_spec
    from ..render.compare import render_compare_csv, render_compare_json, render_compare_text

    if len(args.models) < 2:
        raise OptionError(f"compare needs two or more models, got {len(args.models)}: {args.models[0]}")
    width = None if args.json or args.csv else checked_width(args)  # bad options fail before any build
    checked_html_path(args)
    specs = [parse_spec(m) for m in args.models]
    reports = inspect_specs(specs, model_class=args.model_class, task=args.task, num_labels=args.num_labels,
                            trust_remote_code=args.trust_remote_code, revision=args.revision,
                            use_cache=not args.no_cache)
    comparison = compare_reports(reports, [s.text for s in specs])
    if args.html is not None:
        from ..render.html.compare import render_compare_html

        write_html_page(render_compare_html(comparison, reports), args.html)
    if args.json:
        write(render_compare_json(comparison) + "\n")
    elif args.csv:
        write(render_compare_csv(comparison))
    elif args.html is None:  # the page replaces the text
        write(render_compare_text(comparison, width, color=use_color(), roles=args.roles))
    if not args.no_cache and not args.trust_remote_code:
        from ..api import as_source

        for spec, report in zip(specs, reports):
            if report.model.engine != "build":  # answered by a template: nothing to record, nothing to read again
                continue
            own = bool(spec.model_class or spec.task)
            record_after_build(report, as_source(spec.model, args.revision),
                               model_class=spec.model_class if own else args.model_class,
                               task=spec.task if own else args.task, num_labels=args.num_labels,
                               debug=args.debug)
    return 0
