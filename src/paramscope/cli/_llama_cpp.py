"""`paramscope memory MODEL|FILE.gguf --engine llama.cpp`: memory per device as llama.cpp places it
(cost/memory/llama_cpp_answer.py), its flags and their checks.

Kept apart from cli/memory.py, which only adds these options and hands over when --engine llama.cpp (or one of its
flags) is given.
"""

from __future__ import annotations

import argparse

from ._common import checked_size, checked_width, use_color, write

_FLAGS = (("--n-gpu-layers", "n_gpu_layers"), ("--n-cpu-moe", "n_cpu_moe"), ("--ctx-size", "ctx_size"),
          ("--cache-type-k", "cache_type_k"), ("--cache-type-v", "cache_type_v"), ("--parallel", "parallel"),
          ("--batch-size", "batch_size"), ("--ubatch-size", "ubatch_size"), ("--tensor-split", "tensor_split"))
_SWITCHES = (("--flash-attn", "flash_attn"), ("--swa-full", "swa_full"), ("--kv-unified", "kv_unified"),
             ("--no-kv-offload", "no_kv_offload"))


def _layers(text: str) -> str | int:
    if text == "auto":
        return text
    if text == "all":
        return -1
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: give a number of layers, -1 or all, or auto")


def _shares(text: str) -> tuple[float, ...]:
    """--tensor-split as llama.cpp's common/arg.cpp reads it: shares separated by , or / (std::stof each)."""
    parts = [p for p in text.replace("/", ",").split(",")]
    try:
        shares = tuple(float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: give shares such as 3,1 or 1,1,2")
    if not shares or any(not 0 <= v < float("inf") for v in shares):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: each share must be a number, 0 or more")
    return shares


def add_llama_cpp_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("llama.cpp serving memory (--engine llama.cpp; a .gguf file, or a config with "
                                      "a mixture --dtype such as q4_k_m)")
    group.add_argument("--n-gpu-layers", "-ngl", type=_layers, metavar="N",
                       help="layers offloaded to the GPU: the output layer and the last N - 1 repeating layers; -1 "
                            "or all: every layer; auto (default with --gpu/--budget): the most that fit")
    group.add_argument("--n-cpu-moe", type=int, metavar="N",
                       help="keep the expert tensors of the first N layers on the CPU (default 0; with auto, the "
                            "fewest that fit)")
    group.add_argument("--ctx-size", "-c", type=int, metavar="C",
                       help="context size (default 0: the model's training context), padded to 256 as llama.cpp does")
    group.add_argument("--cache-type-k", "-ctk", metavar="TYPE",
                       help="K cache type: f16 (default), f32, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1")
    group.add_argument("--cache-type-v", "-ctv", metavar="TYPE",
                       help="V cache type, as --cache-type-k (quantised types need --flash-attn)")
    group.add_argument("--parallel", "-np", type=int, metavar="P", help="sequences served at once (default 1)")
    group.add_argument("--batch-size", type=int, metavar="B", help="logical batch (default 2048)")
    group.add_argument("--ubatch-size", type=int, metavar="U", help="physical batch (default 512)")
    group.add_argument("--flash-attn", "-fa", action="store_true", help="flash attention (-fa on): no attention scores "
                       "in the compute buffer, V cache not transposed")
    group.add_argument("--swa-full", action="store_true", help="full-size cache for sliding-window layers")
    group.add_argument("--kv-unified", action="store_true", help="one KV stream shared by the --parallel sequences")
    group.add_argument("--no-kv-offload", action="store_true", help="keep the KV cache on the CPU")
    group.add_argument("--tensor-split", "-ts", type=_shares, metavar="A,B,...",
                       help="each GPU's share of the offloaded layers (3,1: three quarters on the first), as "
                            "llama.cpp splits them by layer; as many GPUs as shares, or --devices N (missing shares "
                            "0); --gpu names their kind. Without it, --devices N splits evenly (llama.cpp: by free "
                            "memory)")


def wants_llama_cpp(args: argparse.Namespace) -> bool:
    """--engine llama.cpp, or one of its flags (refused by run_llama_cpp without it, naming the flag)."""
    return args.engine == "llama.cpp" or any(getattr(args, name) is not None for _, name in _FLAGS) or any(
        getattr(args, name) for _, name in _SWITCHES)


def run_llama_cpp(args: argparse.Namespace) -> int:
    from ..cost.hardware import Accelerator, find_accelerator
    from ..cost.memory.llama_cpp import LlamaCppOptions
    from ..cost.memory.llama_cpp_answer import llama_cpp_answer
    from ..errors import OptionError

    if args.engine != "llama.cpp":
        flag = ([flag for flag, name in _FLAGS if getattr(args, name) is not None]
                + [flag for flag, name in _SWITCHES if getattr(args, name)])[0]
        raise OptionError(f"{flag} is for --engine llama.cpp")
    if args.html is not None:  # paramscope's page, not a llama.cpp flag: no page renders a llama.cpp plan
        raise OptionError("--html is not available with --engine llama.cpp (no page renders its plan); --json gives "
                          "the whole answer")
    given = [flag for flag, on in (("--training", args.training), ("--trace", args.trace),
                                   ("--batch", args.batch != 1),
                                   ("--seq", args.seq is not None), ("--pp", args.pp != 1), ("--tp", args.tp != 1),
                                   ("--kv-dtype", args.kv_dtype is not None),
                                   ("--kv-layout", args.kv_layout != "hf"), ("--encoder-seq", args.encoder_seq),
                                   ("--find-layout", args.find_layout),
                                   ("--max-model-len", args.max_model_len is not None),
                                   ("--gpu-memory-utilization", args.gpu_memory_utilization is not None))
             if on]
    if given:
        raise OptionError(f"--engine llama.cpp does not take {given[0]} (llama.cpp's own flags: --ctx-size, "
                          "--parallel, --cache-type-k/-v, --n-gpu-layers)")
    if args.gpu and args.budget:
        raise OptionError("give --gpu or --budget, not both")
    ngl = args.n_gpu_layers
    if ngl == "auto" and not (args.gpu or args.budget):
        raise OptionError("--n-gpu-layers auto needs --gpu NAME or --budget SIZE: the memory to fit")
    reserve = checked_size("--reserve", args.reserve, zero=True) or 0
    budget = checked_size("--budget", args.budget) if args.budget else None
    options = LlamaCppOptions(
        n_gpu_layers=None if ngl == "auto" else ngl, n_cpu_moe=args.n_cpu_moe, ctx_size=args.ctx_size,
        cache_type_k=(args.cache_type_k or "f16").lower(), cache_type_v=(args.cache_type_v or "f16").lower(),
        parallel=1 if args.parallel is None else args.parallel,
        batch_size=2048 if args.batch_size is None else args.batch_size,
        ubatch_size=512 if args.ubatch_size is None else args.ubatch_size, flash_attn=args.flash_attn,
        swa_full=args.swa_full, kv_unified=args.kv_unified, kv_offload=not args.no_kv_offload,
        gpus=args.devices or (len(args.tensor_split) if args.tensor_split else 1), tensor_split=args.tensor_split,
        dtype=args.dtype, imatrix=bool(args.imatrix), gpu=args.gpu, budget=budget, reserve=reserve)
    options.check()
    width = None if args.json else checked_width(args)
    # found here, once, to word the refusal below with the sizes as given; the core takes it as found
    accelerator = find_accelerator(args.gpu) if args.gpu else (
        Accelerator("budget", budget, "", "budget") if budget else None)
    if accelerator is not None and accelerator.memory <= reserve:  # no GPU memory left to place anything in
        what = f"--gpu {accelerator.name}'s {accelerator.memory:,} B" if args.gpu else \
            f"--budget {args.budget} ({accelerator.memory:,} B)"
        raise OptionError(f"{what} is not above --reserve {args.reserve} ({reserve:,} B): nothing is left on the GPU "
                          "for llama.cpp's buffers; give a larger budget or a smaller --reserve")
    result = llama_cpp_answer(args.model, options, not args.no_cache, accelerator=accelerator,
                              revision=args.revision, model_class=args.model_class, task=args.task,
                              num_labels=args.num_labels, trust_remote_code=args.trust_remote_code)
    if args.json:
        import json

        from ..render.llama_cpp import llama_cpp_document

        write(json.dumps(llama_cpp_document(result), indent=2, ensure_ascii=False) + "\n")
    else:
        from ..render.llama_cpp import render_llama_cpp_text

        write(render_llama_cpp_text(result.report, result.plan, result.accelerator, result.reserve, width,
                                    color=use_color()))
    return 0
