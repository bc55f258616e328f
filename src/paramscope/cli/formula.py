"""`paramscope formula MODEL`: the parameter count as a closed-form polynomial in the config's fields.

The cached path (a formula derived before whose assumptions this config meets) imports neither torch,
transformers nor sympy; everything heavy is imported only after a cache miss.
"""

from __future__ import annotations

import argparse
from typing import Any

from ._common import add_debug_option, add_model_options, add_width_option, checked_width, use_color, write


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "formula",
        help="the parameter count as a formula in the config's fields, derived and checked",
        description="Derive the parameter count as a polynomial in the config's fields (V vocab_size, D "
                    "hidden_size, L max_position_embeddings, N num_hidden_layers, I intermediate_size, …), "
                    "per role, with the assumptions under which it holds; checked against meta-device builds.",
    )
    parser.add_argument("model", metavar="MODEL",
                        help="preset name, config.json path, model directory, or hub id (org/name)")
    add_model_options(parser, remote_code=False)  # formulas are derived for native classes only
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help='print JSON with a "formula" object')
    output.add_argument("--latex", action="store_true", help="print the formula as LaTeX")
    parser.add_argument("--explain", action="store_true", help="show each role's term with the numbers put in")
    parser.add_argument("--verify", action="store_true",
                        help="build the model on meta even when a cached formula applies, and compare")
    parser.add_argument("--no-cache", action="store_true", help="derive afresh; neither read nor write the cache")
    add_width_option(parser)
    add_debug_option(parser)


def run(args: argparse.Namespace) -> int:
    from ..build import check_num_labels, validate_config_dict
    from ..sources import resolve

    check_num_labels(args.num_labels)
    width = None if args.json or args.latex else checked_width(args)  # bad options fail before any build
    source = resolve(args.model, revision=args.revision)
    validate_config_dict(source.config)
    shown, rejected = None, ()
    if not args.no_cache and not args.verify:
        shown, rejected = _cached(source, args)
    if shown is None:
        shown = _derived(source, args, rejected)
    _output(shown, args, width)
    return 0


def _cached(source, args):
    from ..formula_cache import lookup
    from ..render.formula import Shown

    hit = lookup(source.config, model_class=args.model_class, task=args.task, num_labels=args.num_labels)
    if hit.spec is None:
        return None, hit.rejected
    return Shown(hit.spec, hit.values, source.label, source.description, "cache", str(hit.path)), ()


def _derived(source, args, rejected):
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        from ..errors import FormulaError

        why = "; ".join(rejected) or "no formula for this class is cached"
        raise FormulaError(f"no cached formula applies ({why}), and deriving one needs torch and transformers: "
                           f"{err}") from None
    from ..formula import formula_for

    formula = formula_for(source.config, label=source.label, source=source.description,
                          model_class=args.model_class, task=args.task, num_labels=args.num_labels,
                          use_cache=not args.no_cache, verify=args.verify)
    return formula.shown()


def _output(shown, args, width: int | None) -> None:
    from ..render import formula as render

    if args.json:
        import json

        write(json.dumps(render.document(shown), indent=2, ensure_ascii=False) + "\n")
    elif args.latex:
        write(render.render_latex(shown))
    else:
        write(render.render_text(shown, width=width, color=use_color(),
                                 explain=args.explain))
