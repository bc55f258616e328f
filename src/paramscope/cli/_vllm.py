"""`paramscope memory MODEL --engine vllm`: vLLM's launch figures (cost/memory/vllm.py), its flags and their checks.

Kept apart from cli/memory.py, which only adds these options and hands over when --engine is given.
"""

from __future__ import annotations

import argparse

from ..errors import UnsupportedError
from ._common import checked_size, checked_width, use_color, write, write_report_json

_FLAGS = (("--gpu-memory-utilization", "gpu_memory_utilization"), ("--max-model-len", "max_model_len"),
          ("--max-num-seqs", "max_num_seqs"), ("--max-num-batched-tokens", "max_num_batched_tokens"),
          ("--block-size", "block_size"), ("--pp-layer-partition", "pp_layer_partition"))


def add_vllm_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("vLLM pre-flight (--engine vllm, with --gpu or --budget)")
    group.add_argument("--engine", choices=("vllm", "llama.cpp"),
                       help="llama.cpp: memory per device (GPU and CPU) as llama.cpp places it, and the "
                            "llama-server flags that fit (a .gguf file, or a config with a mixture --dtype); "
                            "vllm: what vLLM computes at launch on one GPU (each GPU under --tp): the memory it "
                            "budgets, KV blocks and tokens, the maximum concurrency at --max-model-len, the largest "
                            "--max-model-len that fits, and the `vllm serve` flags that fit")
    group.add_argument("--gpu-memory-utilization", type=float, metavar="U",
                       help="the fraction of the GPU vLLM may use (default 0.92, vLLM v0.27.1's)")
    group.add_argument("--max-model-len", type=int, metavar="N",
                       help="context length vLLM reserves for (default: the model's max_position_embeddings)")
    group.add_argument("--max-num-seqs", type=int, metavar="S",
                       help="sequences a step (default: vllm serve's, 1024 on a GPU of 70 GiB or more that is not "
                            "an A100, else 256)")
    group.add_argument("--max-num-batched-tokens", type=int, metavar="T",
                       help="tokens a step, the profile run's size (default: vllm serve's, 8192 or 2048 as above)")
    group.add_argument("--block-size", type=int, metavar="B", help="tokens a KV block (default 16)")
    group.add_argument("--pp-layer-partition", metavar="N,N,…",
                       help="with --pp: each stage's layers, as vLLM's VLLM_PP_LAYER_PARTITION gives them (default: "
                            "vLLM's rule, the remainder to the stages before the last)")


def wants_vllm(args: argparse.Namespace) -> bool:
    """--engine vllm, or one of its flags without it (refused by run_vllm, naming the flag)."""
    return args.engine is not None or any(getattr(args, name) is not None for _, name in _FLAGS)


def run_vllm(args: argparse.Namespace) -> int:
    from ..cost.hardware import Accelerator, find_accelerator
    from ..cost.memory.serving import MemoryOptions
    from ..cost.memory.serving_answer import memory_answer
    from ..cost.memory.vllm import DEFAULT_UTILIZATION, VllmOptions, vllm_preflight
    from ..errors import OptionError
    from ..sources import resolve

    if args.engine is None:
        flag = next(flag for flag, name in _FLAGS if getattr(args, name) is not None)
        raise OptionError(f"{flag} is for --engine vllm")
    given = [flag for flag, on in (("--training", args.training), ("--trace", args.trace),
                                   ("--html", args.html is not None), ("--batch", args.batch != 1),
                                   ("--seq", args.seq is not None),
                                   ("--kv-layout", args.kv_layout != "hf"), ("--encoder-seq", args.encoder_seq),
                                   ("--find-layout", args.find_layout), ("--devices", args.devices),
                                   ("--zero", args.zero is not None), ("--dp", args.dp), ("--sp", args.sp),
                                   ("--cp", args.cp != 1), ("--ep", args.ep != 1), ("--freeze", args.freeze))
             if on]
    if given:
        raise OptionError(f"--engine vllm does not take {given[0]} (vLLM's own flags: --max-model-len, "
                          "--max-num-seqs, --tp, --pp)")
    partition = _partition(args.pp_layer_partition, args.pp)
    if bool(args.gpu) == bool(args.budget):
        raise OptionError("--engine vllm needs one of --gpu NAME or --budget SIZE: the memory vLLM's utilization "
                          "multiplies")
    width = None if args.json else checked_width(args)
    options = VllmOptions(
        gpu_memory_utilization=(DEFAULT_UTILIZATION if args.gpu_memory_utilization is None else
                                args.gpu_memory_utilization),
        max_model_len=args.max_model_len, block_size=16 if args.block_size is None else args.block_size,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        pp_layer_partition=partition)
    options.check()
    reserve = checked_size("--reserve", args.reserve, zero=True)
    accelerator = find_accelerator(args.gpu) if args.gpu else Accelerator(
        "budget", checked_size("--budget", args.budget), "", "budget")
    from ..cost.dtypes import torch_name
    from ..cost.memory.vllm import cache_dtype_flag, vllm_dtype

    if args.kv_dtype is not None and torch_name(args.kv_dtype) not in ("bfloat16", "float16", "float8_e4m3fn",
                                                                       "float8_e5m2"):
        raise OptionError(f"--kv-dtype {args.kv_dtype}: vLLM's --kv-cache-dtype takes auto (the model's dtype), "
                          "bfloat16, fp8 or fp8_e5m2")
    source = resolve(args.model, revision=args.revision)
    from ..cost.memory.quantization import weight_format

    if source.checkpoint is not None or (args.dtype is not None and weight_format(args.dtype).kind == "gguf"):
        # vLLM keeps a GGUF's weights in their ggml types through its own (experimental) GGUF kernels: not modelled,
        # and pricing them at the model's dtype would be several times high
        raise UnsupportedError("--engine vllm on a GGUF model (a .gguf file or a llama.cpp mixture --dtype) is not "
                               "modelled; --engine llama.cpp serves it")
    from ..cost.memory.vllm import refuse_unserved_encoder_decoder

    refuse_unserved_encoder_decoder(source.config)
    dtype, dtype_flag, dtype_note = vllm_dtype(source.config, args.dtype)
    memory = MemoryOptions(dtype=dtype, kv_dtype=args.kv_dtype, seq=args.max_model_len,
                           group_size=args.group_size, reserve=reserve, tp=args.tp)
    memory.check()
    report, estimate, view = memory_answer(source, memory, not args.no_cache, model_class=args.model_class,
                                           task=args.task, num_labels=args.num_labels,
                                           trust_remote_code=args.trust_remote_code)
    preflight = vllm_preflight(report, view, estimate, options, accelerator, reserve=reserve, tp=args.tp, pp=args.pp,
                               model_id=report.model.label if report.model.source_kind in ("preset", "hub",
                                                                                            "hub-cache")
                               else args.model,
                               kv_dtype_flag=cache_dtype_flag(estimate.settings["kv_dtype"],
                                                              estimate.settings.get("compute_dtype")),
                               dtype_flag=dtype_flag, extra_notes=(dtype_note,) if dtype_note else ())
    if args.json:
        from ..render.memory import memory_to_dict
        from ..render.vllm import vllm_to_dict

        write_report_json(report, memory={**memory_to_dict(estimate), "vllm": vllm_to_dict(preflight)})
    else:
        from ..render.vllm import render_vllm_text

        write(render_vllm_text(report, preflight, width, color=use_color()))
    return 0


def _partition(text: str | None, pp: int) -> tuple[int, ...] | None:
    """--pp-layer-partition "41,39" → (41, 39); one line naming the flag where it is not counts, or without --pp."""
    from ..errors import OptionError

    if text is None:
        return None
    if pp == 1:
        raise OptionError("--pp-layer-partition is for --pp: each pipeline stage's layers")
    try:
        counts = tuple(int(part) for part in text.split(",", 64))
    except ValueError:
        counts = ()
    if not counts or any(n < 1 for n in counts):
        raise OptionError(f"--pp-layer-partition must be layer counts of one or more separated by commas, got "
                          f"{text[:80]!r}")
    return counts
