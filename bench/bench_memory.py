"""`paramscope memory`: the analytic prefill peak against torch's MemTracker on a fake-tensor prefill, per preset.

    python bench/bench_memory.py [--seq 512] [--batch 1] [PRESET ...]

For each preset (all of them by default, the largest left out unless named), builds the class in bf16 on fake
tensors, runs the prefill as generate() does (use_cache, logits_to_keep=1; every token for encoders), and prints
the traced peak, the analytic peak and their difference, then the same for the workspace alone (peak − weights −
buffers − KV cache). Also times `paramscope memory` in a fresh process for one preset. Nothing real is allocated.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from _child import run_child

LARGE = ("405B", "Llama-3.1-70B", "Llama-2-70b", "72B", "8x22B", "DeepSeek", "gemma-2-27b", "Meta-Llama-3-70B")


def traced_prefill_peak(name: str, batch: int, seq: int) -> int:
    import transformers

    from paramscope.build import choose_class, make_config
    from paramscope.cost.traced import cache_probe as probe
    from paramscope.presets import find_preset

    raw = find_preset(name).load_config()
    config, _ = make_config(raw)
    cls = getattr(transformers, choose_class(config, raw).name)
    return probe.traced_prefill_peak(cls, config, batch=batch, seq=seq)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("presets", nargs="*")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    from paramscope.cost.memory.serving import MemoryOptions
    from paramscope.cost.memory.serving_answer import estimate_memory
    from paramscope.presets import all_presets

    names = args.presets or [p.name for p in all_presets() if not any(big in p.name for big in LARGE)]
    print(f"{'preset':40} {'class':30} {'traced peak':>16} {'analytic':>16} {'diff':>8} {'workspace':>12} "
          f"{'analytic':>12} {'diff':>8}")
    for name in names:
        try:
            memory = estimate_memory(name, MemoryOptions(dtype="bf16", batch=args.batch, seq=args.seq))
            report = memory.report
            traced = traced_prefill_peak(name, args.batch, args.seq)
        except Exception as err:  # a forward that cannot run on fake tensors (data-dependent ops)
            print(f"{name:40} not traced: {type(err).__name__}: {str(err)[:80]}")
            continue
        resident = memory.weights.bytes + memory.weights.buffer_bytes + (memory.kv_cache.bytes if memory.kv_cache
                                                                           else 0)
        work = traced - resident
        print(f"{name:40} {report.model.class_name:30} {traced:>16,} {memory.peak:>16,} "
              f"{100 * (memory.peak - traced) / traced:>+7.2f}% {work:>12,} {memory.activations.bytes:>12,} "
              f"{100 * (memory.activations.bytes - work) / max(work, 1):>+7.1f}%", flush=True)
    walls = [run_child([sys.executable, "-m", "paramscope", "memory", "meta-llama/Meta-Llama-3-8B", "--json"])[0]
             for _ in range(3)]
    print(f"\npython -m paramscope memory meta-llama/Meta-Llama-3-8B --json: median {statistics.median(walls):.2f} s "
          f"over 3 fresh processes")


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - started:.0f} s")
