"""`paramscope diff A B`: what changes between two models or classes, parameter by parameter."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import (add_cache_option, add_debug_option, add_html_option, add_source_options, add_width_option,
                      checked_html_path, checked_width, use_color, write, write_html_page)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diff", help="what changes between two models or classes: added, removed, reshaped, tied",
        description="What changes from model A to model B, parameter by parameter, in exact figures and plain "
                    "words. A and B are MODEL[:CLASS], e.g. bert-base-uncased:BertModel "
                    "bert-base-uncased:BertForMaskedLM; the part after ':' may also be a task (fill-mask, ner, …).")
    parser.add_argument("a", metavar="A", help="MODEL[:CLASS] before")
    parser.add_argument("b", metavar="B", help="MODEL[:CLASS] after")
    parser.add_argument("--num-labels", type=int, metavar="K", help="number of labels of classification heads (both)")
    add_source_options(parser)
    add_cache_option(parser)
    add_debug_option(parser)
    parser.add_argument("--json", action="store_true", help="print the diff as JSON")
    add_html_option(parser)
    parser.add_argument("--all", action="store_true", dest="all_rows", help="list every tensor, not groups")
    add_width_option(parser)


def run(args: argparse.Namespace) -> int:
    from ..diff import diff_reports, inspect_specs, parse_spec
    from ..heads import describe_heads
    from ..render.diff import render_diff_json, render_diff_text

    width = None if args.json else checked_width(args)  # bad options fail before any build
    checked_html_path(args)
    specs = [parse_spec(args.a), parse_spec(args.b)]
    a, b = inspect_specs(specs, num_labels=args.num_labels, trust_remote_code=args.trust_remote_code,
                         revision=args.revision, use_cache=not args.no_cache)
    result = diff_reports(a, b, a_label=specs[0].text, b_label=specs[1].text)
    if args.json:
        write(render_diff_json(result) + "\n")
        if args.html is None:
            return 0
    heads = []
    b_heads = describe_heads(b)
    if b_heads.parts:
        heads.append((f"b ({b.model.class_name})", b_heads))
    a_heads = describe_heads(a)
    if a_heads.parts and {p.module for p in a_heads.parts} != {p.module for p in b_heads.parts}:
        heads.append((f"a ({a.model.class_name})", a_heads))
    if args.html is not None:
        from ..render.html.diff import render_diff_html

        write_html_page(render_diff_html(result, a, b, heads=heads), args.html)
        return 0  # the page replaces the text
    write(render_diff_text(result, width, color=use_color(), all_tensors=args.all_rows, heads=heads))
    return 0
