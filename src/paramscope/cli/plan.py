"""`paramscope plan MODEL`: which parameters a fine-tuning plan trains, as PEFT counts them, and its memory."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import (add_debug_option, add_html_option, add_model_options, add_width_option, checked_html_path,
                      checked_size, checked_width, use_color, write, write_html_page, write_report_json)


class _Rule(argparse.Action):
    """Keeps --train, --freeze and --train-last in the order given, in one list."""

    def __call__(self, parser, namespace, values, option_string=None):
        rules = list(getattr(namespace, "rules", None) or [])
        rules.append((option_string.lstrip("-"), values))
        namespace.rules = rules


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan", help="a fine-tuning plan: what trains (freezing rules, LoRA/DoRA via PEFT) and its memory",
        description="Which parameters a fine-tuning plan trains, exactly as PEFT counts them (adapters are applied "
                    "by PEFT itself on the meta device), by role, and the plan's training memory.")
    parser.add_argument("model", metavar="MODEL",
                        help="preset name, config.json path, model directory, or hub id (org/name)")
    add_model_options(parser)
    parser.set_defaults(rules=[])
    parser.add_argument("--train", action=_Rule, metavar="PATTERN",
                        help="train what PATTERN names: a role (head.classifier, attention, embeddings) or a glob "
                             "over parameter names; as the first rule, everything else starts frozen")
    parser.add_argument("--freeze", action=_Rule, metavar="PATTERN", help="freeze what PATTERN names")
    parser.add_argument("--train-last", action=_Rule, metavar="K", help="train the last K blocks")
    parser.add_argument("--lora", type=int, metavar="R", help="LoRA adapters of rank R (PEFT)")
    parser.add_argument("--alpha", type=int, metavar="A", help="LoRA alpha (PEFT's default 8)")
    parser.add_argument("--dropout", type=float, default=0.0, metavar="P", help="LoRA dropout (default 0)")
    parser.add_argument("--target", metavar="NAMES",
                        help="comma-separated module names, or all-linear (default: PEFT's for the architecture)")
    parser.add_argument("--dora", action="store_true", help="DoRA: LoRA with a learned magnitude per output")
    parser.add_argument("--rslora", action="store_true", help="rank-stabilised LoRA scaling (same parameters)")
    parser.add_argument("--modules-to-save", metavar="NAMES", help="comma-separated modules trained in full")
    parser.add_argument("--qlora", nargs="?", const="nf4", choices=("nf4", "nf4-dq"), metavar="nf4|nf4-dq",
                        help="QLoRA: with --lora R, the frozen base's nn.Linear weights stored 4-bit by bitsandbytes "
                             "(nf4; nf4-dq: double quantisation)")
    parser.add_argument("--adapter-dtype", metavar="fp32|bf16",
                        help="the adapters' storage (default: bf16 with --qlora, as the QLoRA paper trains them; "
                             "else --precision's weights dtype, fp32 under mixed precision as PEFT makes them)")
    parser.add_argument("--base-dtype", metavar="auto|fp32|bf16|fp16",
                        help="LoRA/DoRA: the frozen base's dtype under mixed precision (default auto: the "
                             "checkpoint's, as transformers 5 loads it; fp32: a full-precision base)")
    parser.add_argument("--compare", metavar="PLANS",
                        help="plans side by side, from full,freeze,lora,qlora: trainable share, peak memory, step "
                             "FLOPs per token, largest batch on --gpu/--budget (freeze: the --train/--freeze rules "
                             "given, else --train-last 2; lora/qlora: --lora R, else rank 8)")
    memory = parser.add_argument_group("the plan's training memory")
    memory.add_argument("--batch", type=int, default=1, metavar="B")
    memory.add_argument("--seq", type=int, metavar="S", help="default: 2,048, or the model's maximum when shorter")
    memory.add_argument("--precision", default="bf16-mixed", metavar="P",
                        help="bf16-mixed (default), fp16-mixed, fp32, bf16-pure")
    memory.add_argument("--optimizer", default="adamw", metavar="NAME")
    memory.add_argument("--grad-checkpointing", default="none", choices=("none", "full"))
    memory.add_argument("--gpu", metavar="NAME", help="answer for one accelerator")
    memory.add_argument("--budget", metavar="SIZE", help="answer for a memory budget (24GiB, …)")
    memory.add_argument("--no-memory", action="store_true",
                        help="counts only: no memory or FLOPs (adapters need a traced step: seconds to a minute); "
                             "without a build where the template and PEFT's arithmetic answer exactly")
    parser.add_argument("--depth", type=int, default=3, metavar="N",
                        help="depth of the module tree, which says what of each module trains (default 3)")
    parser.add_argument("--no-tree", action="store_true", help="leave out the module tree")
    parser.add_argument("--json", action="store_true", help="print the JSON report with its \"plan\" object")
    add_html_option(parser)
    add_width_option(parser)
    add_debug_option(parser)


def run(args: argparse.Namespace) -> int:
    from ..api import as_source, inspect_with_module
    from ..cost.memory.training import TrainingOptions
    from ..errors import OptionError
    from ..plan import (
        ADAPTER_DTYPES, BASE_DTYPES, PlanOptions, compared_plans, counted_module, make_plan, plan_flops, plan_memory,
    )
    from ..sources import resolve

    width = None if args.json else checked_width(args)
    checked_html_path(args)
    if args.depth < 0:
        raise OptionError(f"--depth must be 0 or more, got {args.depth}")
    split = lambda text: tuple(t.strip() for t in text.split(",") if t.strip()) if text else None  # noqa: E731
    options = PlanOptions(rules=tuple(args.rules), lora=args.lora, alpha=args.alpha, dropout=args.dropout,
                          target=split(args.target), dora=args.dora, rslora=args.rslora,
                          modules_to_save=split(args.modules_to_save) or (), qlora=args.qlora,
                          adapter_dtype=None if args.adapter_dtype is None else
                          ADAPTER_DTYPES.get(args.adapter_dtype.strip().lower(), args.adapter_dtype),
                          base_dtype=None if args.base_dtype is None else
                          BASE_DTYPES.get(args.base_dtype.strip().lower(), args.base_dtype))
    compared = compared_plans(args.compare, options) if args.compare else None
    if compared is None:
        options.check()
    if args.gpu and args.budget:
        raise OptionError("give --gpu or --budget, not both")
    training = TrainingOptions(batch=args.batch, seq=args.seq, optimizer=args.optimizer, precision=args.precision,
                               grad_checkpointing=args.grad_checkpointing, gpu=args.gpu,
                               budget=checked_size("--budget", args.budget))
    training.check()
    if args.gpu:
        from ..cost.hardware import find_accelerator

        find_accelerator(args.gpu)  # a bad name fails before the build
    source = resolve(args.model, revision=args.revision)
    if compared is None and _answer_without_build(args, source, options, training, width):
        return 0
    if options.target and options.target != ("all-linear",):  # a bad --target fails before the build
        from ..api import inspect_source
        from ..plan import check_targets

        _, counted = inspect_source(as_source(source), model_class=args.model_class, task=args.task,
                                    num_labels=args.num_labels, trust_remote_code=args.trust_remote_code)
        check_targets(counted, options.target)
    report, module = inspect_with_module(as_source(source), model_class=args.model_class, task=args.task,
                                         num_labels=args.num_labels, trust_remote_code=args.trust_remote_code)
    if compared is not None:
        return _compare(args, source, report, module, compared, training, width)
    plan = make_plan(report, module, options, key=_key(args, source, report, options))
    estimate = flops = None
    if not args.no_memory:
        estimate = plan_memory(plan, training)
        flops = plan_flops(plan, batch=args.batch, seq=estimate.settings["seq"],
                           checkpointing=args.grad_checkpointing == "full")
    from ..api import inspect as inspect_module

    if args.html is not None:
        from ..render.html.cost import render_plan_html

        write_html_page(render_plan_html(report, plan, inspect_module(counted_module(plan)), estimate, flops),
                        args.html)
        if not args.json:  # the page replaces the text
            return 0
    planned = None if args.no_tree or args.json else inspect_module(counted_module(plan))
    return _write_plan(args, report, plan, estimate, flops, planned, width)


def _key(args, source, report, options) -> str | None:
    """The plan's key (plan_store.plan_key) where the class is the config's own, native one: under it the plan's
    memory recipes and FLOPs are kept, and found again without a build."""
    from ..api import as_source
    from ..plan_store import plan_key

    config = getattr(as_source(source), "config", None)
    if args.trust_remote_code or report.model.native is not True or not isinstance(config, dict):
        return None
    return plan_key(config, report.model.class_name, options, args.num_labels)


def _answer_without_build(args, source, options, training, width) -> bool:
    """The plan from the template's stand-ins and PEFT's arithmetic (plan_arithmetic.plan_stand_ins), without
    torch: its counts (--no-memory), or with its memory and FLOPs where an earlier run kept them under the plan's
    key (plan.cached_plan_memory, plan_flops). False, with nothing written, where they do not answer exactly and
    the build must (no template, a layer type or task not mirrored, remote code, nothing kept yet, an HTML page,
    which shows the built module)."""
    from dataclasses import replace

    from ..api import as_source, template_answer
    from ..plan_arithmetic import plan_stand_ins, planned_report

    if args.trust_remote_code or args.html is not None:
        return False
    source = as_source(source)
    report, root, _ = template_answer(source, model_class=args.model_class, task=args.task,
                                      num_labels=args.num_labels)
    if report is None:  # no template, or it does not apply to this config: the build answers, as inspect's would
        return False
    answered = plan_stand_ins(report, root, options, source.config)
    if answered is None:
        return False
    plan, stand_ins = answered
    needs_report = not args.no_memory or not (args.no_tree or args.json)  # the memory's, the tree's
    planned = planned_report(stand_ins, report) if needs_report else None
    if needs_report and planned is None:
        return False
    estimate = flops = None
    if not args.no_memory:
        plan = replace(plan, key=_key(args, source, report, options))
        estimate, flops = _cached_costs(args, source, report, plan, stand_ins, planned, training)
        if estimate is None or flops is None:
            return False
    _write_plan(args, report, plan, estimate, flops, None if args.no_tree or args.json else planned, width)
    return True


def _cached_costs(args, source, report, plan, stand_ins, planned, training):
    """(memory, FLOPs) of a plan counted without a build (`stand_ins`, and `planned` their report), from what an
    earlier run kept; (None, None) where either was not kept (or the config's cost facts were not recorded)."""
    from dataclasses import replace

    from ..cost.facts.store import facts_key, find_facts, view_from_facts
    from ..plan import cached_plan_memory, plan_flops

    if plan.key is None:
        return None, None
    facts = find_facts(report.model.class_name, facts_key(source.config, model_class=args.model_class,
                                                          task=args.task, num_labels=args.num_labels))
    if facts is None:
        return None, None
    view = replace(view_from_facts(facts, stand_ins), class_name=type(stand_ins).__name__)
    estimate = cached_plan_memory(plan, planned, stand_ins, view, training)
    if estimate is None:
        return None, None
    flops = plan_flops(plan, batch=args.batch, seq=estimate.settings["seq"],
                       checkpointing=args.grad_checkpointing == "full")
    return estimate, flops


def _write_plan(args, report, plan, estimate, flops, planned, width) -> int:
    """The plan as JSON or text; `planned`: the planned model's report, for the tree (None: no tree)."""
    if args.json:
        from ..render.plan import plan_to_dict

        write_report_json(report, plan=plan_to_dict(plan, estimate, flops))
        return 0
    from ..render.plan import render_plan_text

    write(render_plan_text(report, plan, estimate, width, color=use_color(), flops=flops, planned=planned,
                           depth=args.depth))
    return 0


def _compare(args, source, report, module, compared, training, width) -> int:
    from ..plan import counted_module, make_plan, plan_flops, plan_memory
    from ..render.plan import compare_plans_to_dict, render_plan_compare_text

    rows = []
    for name, options in compared:
        plan = make_plan(report, module, options, key=_key(args, source, report, options))
        estimate = plan_memory(plan, training)
        flops = plan_flops(plan, batch=args.batch, seq=estimate.settings["seq"],
                           checkpointing=args.grad_checkpointing == "full")
        rows.append((name, plan, estimate, flops))
    if args.html is not None:
        from ..api import inspect as inspect_module
        from ..render.html.cost import render_plans_html

        planned = [inspect_module(counted_module(plan)) for _, plan, _, _ in rows]
        write_html_page(render_plans_html(report, rows, planned), args.html)
    if args.json:
        write_report_json(report, plans=compare_plans_to_dict(rows))
        return 0
    if args.html is not None:  # the page replaces the text
        return 0
    write(render_plan_compare_text(report, rows, width, color=use_color()))
    return 0
