"""`paramscope serve MODEL --gpu NAME`: how fast a model serves, as roofline bounds (decode, prefill, crossover)."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import (add_cache_option, add_debug_option, add_html_option, add_model_options, add_width_option,
                      checked_html_path, checked_width, use_color, write, write_html_page, write_report_json)
from ._recording import record_after_build


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="how fast a model serves on a GPU: decode tokens/s, time to first token, the compute-bound "
                      "batch (roofline bounds)",
        description="Roofline bounds on serving: a decode step's bytes (weights in the storage format, MoE's "
                    "expected active experts, the KV cache read at the context) over the GPU's bandwidth against "
                    "its FLOPs (generate()'s) over the GPU's dense peak; the prefill's likewise (a time-to-first-"
                    "token bound); the batch where decode turns compute-bound. One GPU; no communication modelled.")
    parser.add_argument("model", metavar="MODEL",
                        help="preset name, config.json path, model directory, or hub id (org/name)")
    add_model_options(parser)
    parser.add_argument("--gpu", required=True, metavar="NAME",
                        help="accelerator whose bandwidth and dense peak bound the step (h100, a100-80gb, mi300x, …)")
    parser.add_argument("--dtype", metavar="FORMAT",
                        help="weight storage (default: the config's quantization_config or torch_dtype): as "
                             "`memory --dtype` (bf16, fp8, gptq-int4, awq-int4, nf4, q4_k_m, …)")
    parser.add_argument("--kv-dtype", metavar="DTYPE", help="KV cache dtype: fp32, bf16, fp16, fp8 "
                        "(default: the compute dtype)")
    parser.add_argument("--kv-layout", default="hf", choices=("hf", "grouped", "latent", "expanded"),
                        help="the KV cache as `memory --kv-layout` keeps it (default hf: what transformers' cache "
                             "holds, checked on meta)")
    parser.add_argument("--batch", type=int, default=1, metavar="B",
                        help="sequences decoded together (default 1); the table adds 1, 8, 32 and 128")
    parser.add_argument("--seq", type=int, metavar="S",
                        help="the prompt's tokens (default 2,048, or the model's maximum or --context when shorter)")
    parser.add_argument("--context", type=int, metavar="C",
                        help="keys a decode step reads: the tokens cached and its own (default: --seq)")
    parser.add_argument("--tp", type=int, default=1, metavar="T",
                        help="tensor parallel over T GPUs: one GPU's bytes (its shards, its KV heads) and FLOPs; no "
                             "communication modelled")
    parser.add_argument("--peak-dtype", choices=("bf16", "fp16", "fp8", "tf32"),
                        help="which dense peak bounds the FLOPs (default: fp8 for fp8 checkpoints, else the "
                             "compute dtype)")
    parser.add_argument("--peak-tflops", type=float, metavar="X", help="the peak in TFLOP/s, in place of the table's")
    parser.add_argument("--json", action="store_true",
                        help="print the JSON report with its \"serve\" object (docs/json-schema.md)")
    add_cache_option(parser, costs=True)
    add_html_option(parser)
    add_width_option(parser)
    add_debug_option(parser)


def run(args: argparse.Namespace) -> int:
    from ..cost.hardware import find_accelerator
    from ..cost.speed.answer import ServeOptions, serve_answer
    from ..sources import resolve

    width = None if args.json else checked_width(args)  # bad options fail before any build
    checked_html_path(args)
    options = ServeOptions(gpu=args.gpu, dtype=args.dtype, kv_dtype=args.kv_dtype, kv_layout=args.kv_layout,
                           batch=args.batch, seq=args.seq, context=args.context, peak_dtype=args.peak_dtype,
                           peak_tflops=args.peak_tflops, tp=args.tp)
    options.check()
    accelerator = find_accelerator(args.gpu, instead=None)  # a bad name fails before the build, found once
    if args.dtype is not None:
        from ..cost.memory.quantization import weight_format

        weight_format(args.dtype)  # a bad --dtype fails before the build
    source = resolve(args.model, revision=args.revision)
    report, speed, view = serve_answer(source, options, not args.no_cache, accelerator=accelerator,
                                       model_class=args.model_class, task=args.task, num_labels=args.num_labels,
                                       trust_remote_code=args.trust_remote_code)
    _show(args, report, speed, width)
    if not args.no_cache and not args.trust_remote_code:
        record_after_build(report, source, model_class=args.model_class, task=args.task, num_labels=args.num_labels,
                           module=view.module, build_dtype=speed.compute_dtype, debug=args.debug)
    return 0


def _show(args: argparse.Namespace, report: Any, speed: Any, width: int | None) -> None:
    if args.html is not None:
        from ..render.serve import render_serve_html

        write_html_page(render_serve_html(report, speed), args.html)
    if args.json:
        from ..render.serve import serve_to_dict

        write_report_json(report, serve=serve_to_dict(speed))
        return
    if args.html is not None:  # the page replaces the text
        return
    from ..render.serve import render_serve_text

    write(render_serve_text(report, speed, width, color=use_color()))
