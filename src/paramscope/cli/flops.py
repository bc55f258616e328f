"""`paramscope flops MODEL`: FLOPs of a forward pass or a training step, exact and explained; compute and MFU."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import (add_cache_option, add_debug_option, add_html_option, add_layout_options, add_model_options,
                      add_width_option,
                      checked_html_path, checked_width, use_color, write, write_html_page,
                      write_report_json)
from ._recording import record_after_build


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "flops", help="FLOPs of a forward pass or a training step, by role; training compute, MFU and time",
        description="FLOPs of one forward pass (or, with --training, a training step) at a batch and length, by "
                    "role, with the arithmetic; over --tokens D beside 6ND; MFU from a throughput or time from an "
                    "MFU on an accelerator.")
    parser.add_argument("model", metavar="MODEL",
                        help="preset name, config.json path, model directory, or hub id (org/name)")
    add_model_options(parser)
    parser.add_argument("--batch", type=int, default=1, metavar="B", help="sequences (default 1)")
    parser.add_argument("--seq", type=int, metavar="S",
                        help="tokens per sequence (default 2,048, or the model's maximum when shorter)")
    parser.add_argument("--training", action="store_true", help="forward, backward and the recomputation")
    parser.add_argument("--generate", type=int, metavar="N",
                        help="generate() of N new tokens after a --seq prompt: the prefill (logits for the last token "
                             "only) and N − 1 decode steps over the growing cache")
    media = parser.add_argument_group("images or audio beside the text (multimodal models; a text input runs the "
                                      "language model only)")
    media.add_argument("--image-tokens", type=int, metavar="N",
                       help="image tokens a sequence, as the projector hands them to the language model (Gemma-3: "
                            "256 an image; LLaVA: its patches; Qwen2.5-VL: merged 2×2 patches): the vision tower and "
                            "projector in lines of their own, the language model over the text + N tokens")
    media.add_argument("--images", type=int, metavar="K",
                       help="images a sequence at the vision config's own image size (Gemma-3, LLaVA)")
    media.add_argument("--audio-seconds", type=float, metavar="T",
                       help="seconds of audio a sequence (Whisper: its encoder over 30 s windows of 3,000 mel "
                            "frames, the decoder over --seq tokens a window)")
    parser.add_argument("--grad-checkpointing", default="none", choices=("none", "full"),
                        help="full: each layer's forward is rerun in backward (hardware FLOPs)")
    parser.add_argument("--freeze", action="append", default=[], metavar="ROLE_OR_GLOB",
                        help="parameters that do not train (no weight gradients); repeatable")
    parser.add_argument("--causal", default="full", choices=("full", "half"),
                        help="attention: full (FlopCounterMode's and PaLM's convention, the default) or half "
                             "(Megatron's)")
    parser.add_argument("--tokens", type=float, metavar="D", help="training tokens (2e12, …): the total compute")
    parser.add_argument("--gpu", metavar="NAME", help="accelerator for the peak FLOP/s (h100, a100-80gb, mi300x, …)")
    parser.add_argument("--peak-dtype", default="bf16", choices=("bf16", "fp16", "fp8", "tf32"),
                        help="which dense peak to use (default bf16)")
    parser.add_argument("--peak-tflops", type=float, metavar="X", help="the peak per device, in TFLOP/s")
    parser.add_argument("--tokens-per-second", type=float, metavar="T",
                        help="measured throughput over all devices: gives the MFU")
    parser.add_argument("--mfu", type=float, metavar="X", help="an assumed MFU (0.4): gives the time for --tokens")
    parser.add_argument("--devices", type=int, metavar="N",
                        help="devices (default 1): alone, what --tokens-per-second and --mfu divide the peak over "
                             "(with --step-seconds, dp N, as memory reads it); with a layout, its total (dp = N / "
                             "(tp × pp × cp) when --dp is not given)")
    parser.add_argument("--step-seconds", type=float, metavar="S",
                        help="a measured training step's time: the MFU (and, under a layout, each device's)")
    add_layout_options(parser, "multi-GPU layout: one device's FLOPs per step (--batch is each data-parallel "
                               "replica's)", {
        "dp": "data-parallel replicas (default: --devices / (tp × pp × cp))",
        "tp": "tensor parallel: column/row-cut matmuls and attention heads / T, the vocabulary-parallel head ⌈V / T⌉ "
              "rows, norms and routers whole on every rank",
        "sp": "sequence parallel with --tp (norms on S / T tokens: no FLOP changes, norms are not counted)",
        "pp": "pipeline stages: layers in order, embeddings on the first, head on the last; the busiest stage is "
              "shown, the bubble named",
        "schedule": "pipeline schedule (default 1f1b; interleaved with --virtual-stages): sets the bubble",
        "cp": "context parallel: S / C query tokens a rank against all S keys (causal: the load-balanced split)",
        "ep": "expert parallel over the data-parallel ranks (balanced routing: expert FLOPs unchanged)"})
    parser.add_argument("--zero", metavar="STAGE",
                        help="what the data-parallel ranks shard, as memory takes it (0-3, fsdp, hybrid_shard, …): "
                             "named in the layout; it changes communication and memory, not FLOPs")
    parser.add_argument("--expert-load", type=float, metavar="F",
                        help="with --ep: the busiest expert-parallel rank receives F × its balanced token-expert pairs "
                             "(1 ≤ F ≤ E; default 1, balanced routing): its FLOPs, the layout's step time's")
    parser.add_argument("--trace", action="store_true",
                        help="also count with torch's FlopCounterMode on fake tensors and show the agreement")
    parser.add_argument("--json", action="store_true",
                        help="print the JSON report with its \"flops\" object (docs/json-schema.md)")
    add_cache_option(parser, costs=True)
    add_html_option(parser)
    add_width_option(parser)
    add_debug_option(parser)


def run(args: argparse.Namespace) -> int:
    from ..cost.flops.estimate import FlopOptions, flop_answer
    from ..errors import OptionError
    from ..sources import resolve

    width = None if args.json else checked_width(args)
    checked_html_path(args)
    tokens = None
    if args.tokens is not None:
        if not 1 <= args.tokens <= 1e17:  # also refuses nan
            raise OptionError(f"--tokens must be a count between 1 and 1e17, got {args.tokens:g}")
        tokens = int(args.tokens)
    scheduled = [flag for flag, given in (("--micro-batches", args.micro_batches is not None),
                                          ("--schedule", args.schedule is not None),
                                          ("--virtual-stages", args.virtual_stages != 1)) if given]
    if scheduled and not args.training:
        # a pipeline schedule orders forwards and backwards: a forward's FLOPs a stage take none (FlopOptions
        # refuses what it can see; the default 1F1B given by name it cannot)
        raise OptionError(f"{scheduled[0]} is for --training: a forward's pipeline runs no backward, so its stages' "
                          "FLOPs take no schedule")
    layout = _layout(args)
    # a step's time is one layout's: --devices N alone is then N data-parallel replicas, as memory reads it
    # (elsewhere --devices alone is what a throughput or an assumed MFU divides the peak over, as it always was)
    as_dp = layout is None and args.step_seconds is not None and (args.devices or 1) > 1
    if as_dp:
        from ..cost.parallel.layout import layout_for

        layout = layout_for(devices=args.devices)
    devices = args.devices if args.devices is not None else (layout.devices if layout is not None else 1)
    options = FlopOptions(batch=args.batch, seq=args.seq, training=args.training,
                          grad_checkpointing=args.grad_checkpointing, causal=args.causal, freeze=tuple(args.freeze),
                          tokens=tokens, gpu=args.gpu, peak_dtype=args.peak_dtype, peak_tflops=args.peak_tflops,
                          tokens_per_second=args.tokens_per_second, mfu=args.mfu, devices=devices,
                          trace=args.trace, context_curve=args.html is not None,
                          generate=args.generate, layout=layout, step_seconds=args.step_seconds,
                          media=_media(args))
    options.check()
    from ..selection import check_pattern

    for pattern in args.freeze:
        check_pattern(pattern, option="freeze")  # a regular expression or a megabyte fails before the build
    if args.gpu:
        from ..cost.hardware import find_accelerator

        find_accelerator(args.gpu, instead="peak_tflops")  # a bad name fails before the build
    source = resolve(args.model, revision=args.revision)
    report, estimate, compute, view = flop_answer(source, options, not args.no_cache, model_class=args.model_class,
                                                  task=args.task, num_labels=args.num_labels,
                                                  trust_remote_code=args.trust_remote_code)
    _show(args, report, estimate, compute, width, tokens, as_dp)
    if not args.no_cache and not args.trust_remote_code:
        record_after_build(report, source, model_class=args.model_class, task=args.task,
                           num_labels=args.num_labels, module=view.module, build_dtype=None, debug=args.debug)
    return 0


def _media(args: argparse.Namespace) -> Any:
    """The images or audio each sequence holds, or None for a text input."""
    if args.image_tokens is None and args.images is None and args.audio_seconds is None:
        return None
    from ..cost.towers.media import MediaInput

    return MediaInput(image_tokens=args.image_tokens, images=args.images, audio_seconds=args.audio_seconds)


def _layout(args: argparse.Namespace) -> Any:
    """The multi-GPU layout the flags describe, or None where none is given (--devices alone keeps its meaning:
    the devices a throughput or an assumed MFU divides the peak over)."""
    from ..cost.parallel.layout import layout_for
    from ..errors import OptionError

    if args.ep == 0:  # a bare --ep is memory's serving flag (vLLM's --enable-expert-parallel): flops needs E
        raise OptionError("--ep takes a degree E with flops (routed experts split over E data-parallel ranks); a "
                          "bare --ep is memory's serving flag (vLLM's --enable-expert-parallel)")
    given = (args.dp, args.micro_batches, args.schedule, args.expert_load, args.zero)
    if all(v is None for v in given) and (args.tp, args.ep, args.pp, args.cp, args.virtual_stages, args.sp) == \
            (1, 1, 1, 1, 1, False):
        return None
    return layout_for(devices=args.devices, dp=args.dp, tp=args.tp, sp=args.sp, pp=args.pp,
                      micro_batches=args.micro_batches, schedule=args.schedule, virtual_stages=args.virtual_stages,
                      ep=args.ep, cp=args.cp, batch=args.batch, zero="0" if args.zero is None else args.zero,
                      expert_load=1.0 if args.expert_load is None else args.expert_load)


def compute_devices(args: argparse.Namespace, estimate: Any) -> int:
    if estimate.device is not None:
        return estimate.device.layout.devices
    return args.devices if args.devices is not None else 1


def _show(args: argparse.Namespace, report: Any, estimate: Any, compute: Any, width: int | None,
          tokens: int | None, as_dp: bool) -> None:
    if args.html is not None:
        from ..render.html.cost import render_flops_html

        write_html_page(render_flops_html(report, estimate, compute), args.html)
    if args.json:
        from ..render.flops import flops_to_dict

        write_report_json(report, flops=flops_to_dict(estimate, compute, {
            "training": args.training, "grad_checkpointing": args.grad_checkpointing, "freeze": list(args.freeze),
            "tokens": tokens, "gpu": args.gpu, "peak_dtype": args.peak_dtype, "peak_tflops": args.peak_tflops,
            "tokens_per_second": args.tokens_per_second, "mfu_assumed": args.mfu,
            "devices": compute_devices(args, estimate), "generate": args.generate,
            "step_seconds": args.step_seconds, "image_tokens": args.image_tokens, "images": args.images,
            "audio_seconds": args.audio_seconds}))
        return
    if args.html is not None:  # the page replaces the text
        return
    from ..render.flops import render_flops_text

    said = (f"--devices {args.devices:,} read as dp {args.devices:,} (data-parallel replicas), as memory reads it: "
            "--step-seconds is one step of a layout",) if as_dp else ()
    write(render_flops_text(report, estimate, compute, width, color=use_color(), notes=said))
