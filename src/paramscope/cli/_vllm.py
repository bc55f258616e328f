"""`paramscope memory MODEL --engine vllm`: vLLM's launch figures (cost/memory/vllm_answer.py), its flags and their
checks.

Kept apart from cli/memory.py, which only adds these options and hands over when --engine is given.
"""

from __future__ import annotations

import argparse

from ._common import checked_size, checked_width, use_color, write

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
    from ..cost.memory.vllm import DEFAULT_UTILIZATION, VllmOptions
    from ..cost.memory.vllm_answer import vllm_answer
    from ..errors import OptionError

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
    partition = _partition(args.pp_layer_partition)
    if bool(args.gpu) == bool(args.budget):
        raise OptionError("--engine vllm needs one of --gpu NAME or --budget SIZE: the memory vLLM's utilization "
                          "multiplies")
    width = None if args.json else checked_width(args)
    options = VllmOptions(
        gpu_memory_utilization=(DEFAULT_UTILIZATION if args.gpu_memory_utilization is None else
                                args.gpu_memory_utilization),
        max_model_len=args.max_model_len, block_size=16 if args.block_size is None else args.block_size,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        pp_layer_partition=partition, dtype=args.dtype, kv_dtype=args.kv_dtype, group_size=args.group_size,
        tp=args.tp, pp=args.pp, gpu=args.gpu, budget=checked_size("--budget", args.budget) if args.budget else None,
        reserve=checked_size("--reserve", args.reserve, zero=True))
    result = vllm_answer(args.model, options, not args.no_cache, revision=args.revision,
                         model_class=args.model_class, task=args.task, num_labels=args.num_labels,
                         trust_remote_code=args.trust_remote_code)
    if args.json:
        import json

        from ..render.vllm import vllm_document

        write(json.dumps(vllm_document(result), indent=2, ensure_ascii=False) + "\n")
    else:
        from ..render.vllm import render_vllm_text

        write(render_vllm_text(result.report, result.preflight, width, color=use_color()))
    return 0


def _partition(text: str | None) -> tuple[int, ...] | None:
    """--pp-layer-partition "41,39" → (41, 39); one line naming the flag where it is not counts (without --pp, the
    core's refusal)."""
    from ..errors import OptionError

    if text is None:
        return None
    try:
        counts = tuple(int(part) for part in text.split(",", 64))
    except ValueError:
        counts = ()
    if not counts or any(n < 1 for n in counts):
        raise OptionError(f"--pp-layer-partition must be layer counts of one or more separated by commas, got "
                          f"{text[:80]!r}")
    return counts
