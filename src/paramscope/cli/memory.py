"""`paramscope memory MODEL`: the memory to load and serve a model, exact and explained (analytic engine)."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import (add_cache_option, add_debug_option, add_html_option, add_layout_options, add_model_options,
                      add_width_option,
                      checked_html_path, checked_size, checked_width, use_color, write,
                      write_html_page, write_report_json)
from ._llama_cpp import add_llama_cpp_options, run_llama_cpp, wants_llama_cpp
from ._recording import record_after_build
from ._vllm import add_vllm_options, run_vllm, wants_vllm


def add_parser(subparsers: Any) -> None:
    from ..cost.memory.quantization import FORMAT_CHOICES

    parser = subparsers.add_parser(
        "memory", help="memory to load, serve or train a model: weights, KV cache, activations, what fits",
        description="Memory to load and serve a model, at allocator level: weights in their storage format (by "
                    "dtype, role and component), the KV cache at a batch and context length, the prefill's "
                    "workspace, the peak, and the accelerators it fits on. With --training: one steady training "
                    "step's weights, gradients, optimizer states, activations and peak, by phase.")
    parser.add_argument("model", metavar="MODEL",
                        help="preset name, config.json path, model directory, or hub id (org/name)")
    add_model_options(parser)
    parser.add_argument("--dtype", metavar="FORMAT",
                        help="weight storage (default: the config's quantization_config or torch_dtype): "
                             + ", ".join(FORMAT_CHOICES))
    parser.add_argument("--group-size", type=int, metavar="G",
                        help="GPTQ/AWQ group size along the input dimension (default 128; -1: per channel)")
    parser.add_argument("--imatrix", action="store_true",
                        help="with a llama.cpp mixture (--dtype q4_k_m, iq4_xs, ...): the file llama-quantize writes "
                             "with an importance matrix, as most published GGUFs are made")
    parser.add_argument("--kv-dtype", metavar="DTYPE", help="KV cache dtype: fp32, bf16, fp16, fp8 "
                        "(default: the compute dtype)")
    parser.add_argument("--kv-layout", default="hf", choices=("hf", "grouped", "latent", "expanded"),
                        help="hf (default): what transformers' cache holds, checked against a prefill on meta; "
                             "grouped: K and V once per key/value head, as servers with grouped-query kernels "
                             "(vLLM) keep them; MLA models: latent (kv_lora_rank + rope, as MLA-aware servers store "
                             "it), expanded (per-head K and V)")
    parser.add_argument("--batch", type=int, default=1, metavar="B", help="sequences served at once (default 1)")
    parser.add_argument("--seq", type=int, metavar="S",
                        help="context length in tokens (default: the model's max_position_embeddings)")
    parser.add_argument("--encoder-seq", type=int, metavar="S",
                        help="encoder-decoder models: encoder tokens held by the cross-attention cache "
                             "(default: --seq)")
    parser.add_argument("--gpu", metavar="NAME", help="answer for one accelerator (h100, a100-40gb, 4090, …)")
    parser.add_argument("--budget", metavar="SIZE", help="answer for a memory budget (24GiB, 80GB, …)")
    parser.add_argument("--reserve", metavar="SIZE", default="1GiB",
                        help="CUDA context and allocator fragmentation, added before comparing with a device "
                             "(default 1GiB; 0 for none)")
    training = parser.add_argument_group("training (--training)")
    training.add_argument("--training", action="store_true",
                          help="one steady training step: loss, backward, optimizer step, zero_grad")
    training.add_argument("--optimizer", default="adamw", metavar="NAME",
                          help="adamw (default, fused), adam, sgd, sgd-momentum, adafactor, adamw-8bit, lion")
    training.add_argument("--precision", default=None, metavar="P",
                          help="bf16-mixed (fp32 weights, bf16 autocast: the default, but under DeepSpeed's --zero "
                               "1/2/3), fp16-mixed, fp32, bf16-pure, bf16-master (bf16 weights and gradients, fp32 "
                               "master copy and optimizer states: DeepSpeed's bf16, the default under --zero 1/2/3), bf16-main-grad (bf16 weights, a resident fp32 gradient buffer, "
                               "fp32 masters and optimizer states: Megatron-LM's; --zero 0 or 1, its distributed "
                               "optimizer)")
    training.add_argument("--image-tokens", type=int, metavar="N",
                          help="image tokens a sequence (multimodal models, as flops takes it): the KV cache and "
                               "prefill (training: the language model's activations) over the text + N tokens, and "
                               "the vision tower's forward peak (training: the towers train, their saved activations "
                               "held)")
    training.add_argument("--images", type=int, metavar="K",
                          help="images a sequence at the vision config's own size (Gemma-3, LLaVA), as --image-tokens; "
                               "Llama-3.2-Vision: each image as max_num_tiles tiles, read by cross-attention")
    training.add_argument("--audio-seconds", type=float, metavar="T",
                          help="Whisper on T seconds of audio, one 30 s window a sequence: serving, the encoder's "
                               "forward peak, its output and the cross-attention cache; training (default 30), the "
                               "step traced on the mel frames and the text")
    training.add_argument("--grad-checkpointing", default="none", choices=("none", "full"),
                          help="full: each layer keeps only its input and is recomputed in backward")
    training.add_argument("--attention", choices=("sdpa", "eager", "flash"),
                          help="attention implementation (default: the model's own, sdpa where it supports it)")
    training.add_argument("--freeze", action="append", default=[], metavar="ROLE_OR_GLOB",
                          help="parameters that do not train: a role (embeddings, attention, mlp, norm, head) or a name glob "
                               "(model.layers.0.*); repeatable")
    training.add_argument("--devices", type=int, metavar="N",
                          help="devices in all (default 1); alone, data-parallel devices; with --tp (or --dp), "
                               "dp = N / tp")
    training.add_argument("--zero", default=None, metavar="STAGE",
                          help="what data-parallel ranks shard: ZeRO stage 0-3 (DeepSpeed's flat shares), fsdp "
                               "(FSDP2's fully_shard, per parameter), hybrid_shard (FSDP2 within --shard-group "
                               "ranks), or FSDP1's no_shard, shard_grad_op, full_shard (default 0; --find-layout: "
                               "fsdp)")
    training.add_argument("--find-layout", action="store_true",
                          help="with --gpu and --devices N: every dp × tp × pp × cp (× ep) layout of N devices, "
                               "those that fit sorted by a bound on the step time at the GPU's peak, with each "
                               "one's pipeline bubble and communication bytes a device, and the fewest devices "
                               "that fit")
    training.add_argument("--grad-accum", type=int, default=1, metavar="N",
                          help="gradient accumulation: --batch (a replica's) runs as N micro-steps of batch / N, "
                               "the optimizer stepping after the last (default 1; not beside --pp, whose "
                               "--micro-batches are this)")
    training.add_argument("--global-batch", type=int, metavar="G",
                          help="--find-layout: sequences a step over all replicas (default: --batch × --devices); "
                               "each layout's replicas take G / dp")
    layout = add_layout_options(parser, "multi-GPU layout (the figures are one device's; serving takes --tp, --pp, "
                                        "--dp and --ep alone, the rest are for --training)", {
        "dp": "data-parallel degree (default: --devices / tp); serving: vLLM's --data-parallel-size, D replicas each "
              "serving its own --batch (MoE layers span them: experts over tp × dp ranks)",
        "tp": "tensor parallel degree: q/k/v/gate/up column-wise, o/down row-wise, embeddings and head "
              "vocabulary-parallel, norms and routers replicated (Megatron's and torch's plans); serving: each GPU's "
              "weights, KV cache (KV heads / T, replicated past them; MLA's latent whole) and prefill workspace",
        "sp": "sequence parallel with --tp: norms and the residual stream hold S / tp tokens",
        "pp": "pipeline stages: layers split in order, embeddings on the first, head on the last (serving: each "
              "stage's own layers' KV cache)",
        "schedule": "pipeline schedule (default 1f1b; interleaved with --virtual-stages)",
        "cp": "context parallel degree: each rank holds S / C tokens (ring attention)",
        "ep": "expert parallel degree: routed experts split over E of the data-parallel ranks; serving: --tp T "
              "--ep (E = T × D, vLLM's --enable-expert-parallel): whole experts split over the T × D ranks (with "
              "--gpu, also in each tp × dp layout the smallest-layout search tries)"})
    layout.add_argument("--shard-group", type=int, metavar="G",
                        help="--zero hybrid_shard: ranks a shard group holds (default 8, one node)")
    layout.add_argument("--fsdp-mixed-precision", choices=("autocast", "policy"),
                        help="--zero fsdp or hybrid_shard with a mixed --precision: policy (FSDP2's "
                             "MixedPrecisionPolicy, param_dtype 16-bit and reduce_dtype fp32, no autocast: "
                             "torchtitan's; the default) or autocast (torch.autocast over the fp32 "
                             "parameters FSDP2 gathers)")
    layout.add_argument("--expert-load", type=float, metavar="F",
                        help="with --ep: the busiest expert-parallel rank receives F × its balanced token-expert "
                             "pairs (1 ≤ F ≤ E; default 1, balanced routing); its step is derived from traces")
    parser.add_argument("--trace", nargs="?", const="extended", choices=("extended", "full"), metavar="full",
                        help="measure one step of the real class on fake tensors, beside the analytic answer: a "
                             "training step traced at a few layers of each type at this batch and length and "
                             "extended to the model's depth exactly (checked by a longer cut); --trace full "
                             "traces every layer with torch's MemTracker. Serving traces generate()'s prefill and "
                             "a decode step, every layer")
    add_vllm_options(parser)
    add_llama_cpp_options(parser)
    parser.add_argument("--json", action="store_true",
                        help="print the JSON report with its \"memory\" object (docs/json-schema.md)")
    add_cache_option(parser, costs=True)
    add_html_option(parser)
    add_width_option(parser)
    add_debug_option(parser)


def _media(args: argparse.Namespace) -> Any:
    """The images each sequence holds beside its text (--image-tokens, --images), or None."""
    if args.image_tokens is None and args.images is None and args.audio_seconds is None:
        return None
    from ..cost.towers.media import MediaInput

    return MediaInput(image_tokens=args.image_tokens, images=args.images, audio_seconds=args.audio_seconds)


def run(args: argparse.Namespace) -> int:
    from ..cost.memory.serving import MemoryOptions
    from ..cost.memory.serving_answer import memory_answer
    from ..errors import OptionError
    from ..sources import resolve

    if _media(args) is not None and (wants_llama_cpp(args) or wants_vllm(args)):
        raise OptionError("--image-tokens, --images and --audio-seconds are counted for transformers' serving and "
                          "training here, not for another --engine")
    if wants_llama_cpp(args):
        return run_llama_cpp(args)
    if wants_vllm(args):
        return run_vllm(args)
    if args.grad_accum != 1 and (not args.training or args.find_layout):
        raise OptionError("--grad-accum is for one --training step (--find-layout accumulates by itself, "
                          "micro-steps of one sequence without a pipeline)")
    if args.find_layout or args.global_batch is not None:
        return _find_layout(args)
    if args.zero is None:
        args.zero = "0"
    width = None if args.json else checked_width(args)  # bad options fail before any build
    checked_html_path(args)
    if args.gpu and args.budget:
        raise OptionError("give --gpu or --budget, not both")
    reserve = checked_size("--reserve", args.reserve, zero=True)
    options = MemoryOptions(dtype=args.dtype, kv_dtype=args.kv_dtype, batch=args.batch, seq=args.seq,
                            kv_layout=args.kv_layout, group_size=args.group_size, encoder_seq=args.encoder_seq,
                            gpu=args.gpu, budget=checked_size("--budget", args.budget), reserve=reserve,
                            trace=bool(args.trace), imatrix=bool(args.imatrix),
                            **({} if args.training else {"tp": args.tp, "pp": args.pp, "media": _media(args),
                                                         "expert_parallel": _serving_ep(args),
                                                         "dp": 1 if args.dp is None else args.dp}))
    options.check()
    if args.dtype is not None:
        from ..cost.memory.quantization import weight_format

        weight_format(args.dtype, group_size=args.group_size)  # a bad --dtype fails before the build
    model_options = dict(model_class=args.model_class, task=args.task, num_labels=args.num_labels,
                         trust_remote_code=args.trust_remote_code)
    view = None
    if args.training:
        from ..cost.memory.training import TrainingOptions, training_answer

        if args.dtype or args.kv_dtype or args.group_size or args.encoder_seq or args.kv_layout != "hf":
            raise OptionError("--dtype, --kv-dtype, --kv-layout, --group-size and --encoder-seq are for "
                                  "serving; training takes --precision")
        if args.ep == 0:
            raise OptionError("--ep takes a degree E with --training (routed experts split over E data-parallel "
                              "ranks); a bare --ep is serving's (vLLM's --enable-expert-parallel)")
        layout = _layout(args)
        training = TrainingOptions(batch=args.batch, seq=args.seq, optimizer=args.optimizer,
                                   precision=args.precision, grad_checkpointing=args.grad_checkpointing,
                                   attention=args.attention, freeze=tuple(args.freeze),
                                   devices=1 if layout or args.devices is None else args.devices,
                                   zero="0" if layout else args.zero,
                                   layout=layout, trace=args.trace, gpu=args.gpu, budget=options.budget,
                                   grad_accum=args.grad_accum,
                                   reserve=reserve, media=_media(args))
        training.check()
        from ..selection import check_pattern

        for pattern in args.freeze:
            check_pattern(pattern, option="freeze")  # a regular expression or a megabyte fails before the build
        source = resolve(args.model, revision=args.revision)
        if args.trace and layout is not None and layout.pp > 1:  # before the build: a stage is traced or not
            from ..cost.facts.store import recorded_view
            from ..cost.parallel.pipeline_trace_reach import untraced_pipeline

            # the recorded facts' config and class where the config has them (no transformers import: the answer
            # it refuses costs less than that), else the config's dict
            recorded = None if args.no_cache or args.trust_remote_code else recorded_view(
                source, model_class=args.model_class, task=args.task, num_labels=args.num_labels)
            why = untraced_pipeline(recorded[1].config, training, class_name=recorded[1].class_name) if recorded \
                else untraced_pipeline(source.config, training, model_class=args.model_class, task=args.task)
            if why:
                raise OptionError("{0} traces no stage here: {why}", "trace", why=why)
        if layout is not None and layout.ep > 1:  # before the build: the config says how many experts ep splits
            _check_expert_degree(source.config, layout.ep)
        report, estimate, view = training_answer(source, training, not args.no_cache, **model_options)
    else:
        for flag, value, default in (("--optimizer", args.optimizer, "adamw"),
                                     ("--precision", args.precision, None),
                                     ("--grad-checkpointing", args.grad_checkpointing, "none"),
                                     ("--devices", args.devices, None), ("--zero", args.zero, "0"),
                                     ("--attention", args.attention, None),
                                     ("--sp", args.sp, False),
                                     ("--micro-batches", args.micro_batches, None),
                                     ("--schedule", args.schedule, None), ("--virtual-stages", args.virtual_stages, 1),
                                     ("--cp", args.cp, 1), ("--shard-group", args.shard_group, None),
                                     ("--expert-load", args.expert_load, None),
                                     ("--fsdp-mixed-precision", args.fsdp_mixed_precision, None)):
            if value != default:
                raise OptionError(f"{flag} is for --training" + ("; serving across GPUs takes --tp, --pp, --dp and "
                                                                  "--ep" if flag in _LAYOUT_FLAGS else ""))
        if args.freeze:
            raise OptionError("--freeze is for --training")
        source = resolve(args.model, revision=args.revision)
        report, estimate, view = memory_answer(source, options, not args.no_cache, **model_options)
    _show(args, report, estimate, width)
    if view is not None and not args.no_cache and not args.trust_remote_code:
        record_after_build(report, source, model_class=args.model_class, task=args.task, num_labels=args.num_labels,
                           module=view.module, build_dtype=estimate.settings.get("compute_dtype")
                           or estimate.settings["weights_dtype"], debug=args.debug)
    return 0


def _find_layout(args: argparse.Namespace) -> int:
    """--find-layout: the layouts of --devices N that fit --gpu, sorted by the step time's bound (parallel/search.py)."""
    from ..cost.parallel.search import SearchOptions, find_layouts
    from ..errors import OptionError
    from ..sources import resolve

    if not args.find_layout:
        raise OptionError("--global-batch is for --find-layout (elsewhere --batch is each data-parallel replica's)")
    if not args.training:
        raise OptionError("--find-layout searches training layouts: give --training")
    if args.gpu is None:
        raise OptionError("--find-layout needs --gpu NAME: its memory and its peak FLOP/s"
                          + (" (--budget has no peak)" if args.budget else ""))
    if args.budget:
        raise OptionError("--find-layout takes --gpu, not --budget: a budget has no peak FLOP/s to sort by")
    if args.devices is None:
        raise OptionError("--find-layout needs --devices N: the devices the layouts share")
    searched = [flag for flag, value, default in (("--dp", args.dp, None), ("--tp", args.tp, 1),
                                                 ("--pp", args.pp, 1), ("--cp", args.cp, 1), ("--ep", args.ep, 1),
                                                 ("--sp", args.sp, False), ("--micro-batches", args.micro_batches,
                                                                           None)) if value != default]
    if searched:
        raise OptionError(f"--find-layout searches dp, tp, pp, cp and ep (sequence parallel with tp, microbatches "
                          f"of one sequence): drop {', '.join(searched)}")
    for flag, given in (("--trace", args.trace), ("--freeze", args.freeze),
                        ("--dtype", args.dtype), ("--kv-dtype", args.kv_dtype), ("--group-size", args.group_size),
                        ("--encoder-seq", args.encoder_seq), ("--kv-layout", args.kv_layout != "hf")):
        if given:
            raise OptionError(f"--find-layout does not take {flag}")
    if args.global_batch is not None and args.batch != 1:
        raise OptionError("give --batch (sequences a device, as --devices N data-parallel replicas take them) or "
                          "--global-batch, not both")
    width = None if args.json else checked_width(args)
    checked_html_path(args)
    options = SearchOptions(devices=args.devices, gpu=args.gpu, global_batch=args.global_batch, batch=args.batch,
                            seq=args.seq, precision=args.precision, optimizer=args.optimizer,
                            grad_checkpointing=args.grad_checkpointing, attention=args.attention, zero=args.zero,
                            shard_group=args.shard_group, schedule=args.schedule,
                            virtual_stages=args.virtual_stages,
                            expert_load=1.0 if args.expert_load is None else args.expert_load,
                            fsdp_mixed_precision=args.fsdp_mixed_precision,
                            reserve=checked_size("--reserve", args.reserve, zero=True))
    options.check()
    source = resolve(args.model, revision=args.revision)
    report, search, view = find_layouts(source, options, not args.no_cache, model_class=args.model_class,
                                        task=args.task, num_labels=args.num_labels,
                                        trust_remote_code=args.trust_remote_code)
    if args.html is not None:  # the page replaces the text (with --json, stdout still gets the JSON)
        from ..render.html.layout_search import render_layout_search_html

        write_html_page(render_layout_search_html(report, search), args.html)
    if args.json:
        from ..render.layout_search import layout_search_to_dict

        write_report_json(report, layout_search=layout_search_to_dict(search))
    elif args.html is None:
        from ..render.layout_search import render_layout_search_text

        write(render_layout_search_text(report, search, width, color=use_color()))
    if view.module is not None and not args.no_cache and not args.trust_remote_code:
        from ..cost.memory.states import weight_dtype

        record_after_build(report, source, model_class=args.model_class, task=args.task, num_labels=args.num_labels,
                           module=view.module, build_dtype=weight_dtype(options.precision), debug=args.debug)
    return 0


def _serving_ep(args: argparse.Namespace) -> bool:
    """--ep when serving: vLLM's --enable-expert-parallel, whose size is TP × DP; a bare --ep or --ep T × D."""
    from ..errors import OptionError

    dp = 1 if args.dp is None else args.dp
    if args.ep not in (0, 1, args.tp * dp):
        raise OptionError(f"--ep {args.ep}: serving's expert-parallel size is vLLM's, TP × DP = --tp {args.tp} × "
                          f"--dp {dp} = {args.tp * dp} here: give --ep alone or --ep {args.tp * dp}")
    return args.ep != 1


def _check_expert_degree(config: dict[str, Any], ep: int) -> None:
    """--ep E must divide the routed experts: refused from the config's count before the build (the layout's rules
    refuse it again after the build, per experts module, where a config does not say it)."""
    import re

    from ..errors import OptionError
    from ..moe import EXPERT_FIELDS, config_value

    found = config_value(config, EXPERT_FIELDS)
    if found is None or found[1] % ep == 0:
        return
    field, experts = found
    architectures = config.get("architectures") or []
    name = re.sub(r"For[A-Z]\w*$|Model$", "", str(architectures[0])) if architectures else ""
    owner = f"{name}'s" if name else "the model's"
    raise OptionError(f"--ep {ep} does not divide {owner} {experts} routed experts ({field})")


_LAYOUT_FLAGS = ("--devices", "--zero", "--dp", "--ep", "--sp", "--micro-batches", "--schedule", "--virtual-stages",
                 "--cp", "--shard-group", "--expert-load", "--fsdp-mixed-precision")


def _layout(args: argparse.Namespace) -> Any:
    """The multi-GPU layout the flags describe, or None where only --devices and --zero 0-2 are given (DeepSpeed's
    flat ZeRO shares over data-parallel devices, as before layouts: the layout's answer is the same there). ZeRO-3
    over --devices N is the layout --dp N --zero 3, the more exact answer (ZeRO-3's gathered layer and head
    counted): two spellings of one layout, one answer."""
    from ..cost.parallel.layout import layout_for, shard_mode
    from ..errors import OptionError

    if args.fsdp_mixed_precision == "autocast" and args.precision is not None and \
            not str(args.precision).endswith("-mixed"):  # asked, it would change nothing: no autocast to choose
        raise OptionError(f"--fsdp-mixed-precision autocast chooses torch.autocast over the fp32 parameters FSDP2 "
                          f"gathers: it needs a mixed precision (bf16-mixed, fp16-mixed), got {args.precision}")
    stage3 = shard_mode(args.zero) == "zero3" and (args.devices or 1) > 1
    flat = shard_mode(args.zero) in ("none", "zero1", "zero2", "zero3") and str(args.zero).strip().lower() not in (
        "full_shard",) and not stage3
    # gradient accumulation is counted under a layout (the held gradients' share): --devices N --zero 0-2 is that
    # layout's answer too, so it takes the layout rather than a refusal
    flat = flat and not (args.grad_accum > 1 and (args.devices or 1) > 1)
    given = (args.dp, args.shard_group, args.micro_batches, args.schedule, args.expert_load,
             args.fsdp_mixed_precision)
    if all(v is None for v in given) and (args.tp, args.ep, args.pp, args.cp, args.virtual_stages, args.sp) == \
            (1, 1, 1, 1, 1, False) and flat:
        return None
    return layout_for(devices=args.devices, dp=args.dp, zero=args.zero, shard_group=args.shard_group, tp=args.tp,
                      sp=args.sp, pp=args.pp, micro_batches=args.micro_batches, schedule=args.schedule,
                      virtual_stages=args.virtual_stages, ep=args.ep, cp=args.cp, batch=args.batch,
                      expert_load=1.0 if args.expert_load is None else args.expert_load,
                      fsdp_mixed_precision=args.fsdp_mixed_precision)


def _show(args: argparse.Namespace, report: Any, estimate: Any, width: int | None) -> None:
    if args.html is not None:
        from ..render.html.cost import render_memory_html

        write_html_page(render_memory_html(report, estimate), args.html)
    if args.json:
        from ..render.memory import memory_to_dict

        write_report_json(report, memory=memory_to_dict(estimate))
        return
    if args.html is not None:  # the page replaces the text
        return
    from ..render.memory import render_memory_text

    write(render_memory_text(report, estimate, width, color=use_color()))
