"""`paramscope memory --training`: the analytic peak against the traced step, and how long the trace takes.

    python bench/bench_training.py [--batch 1] [--seq 2048] [--precision bf16-mixed] [PRESET ...]

For each preset, runs the training estimate with --trace: one steady AdamW step of the real class on fake tensors,
measured by torch's MemTracker. Prints the traced peak and its phase, the analytic peak and the difference, the
difference of the analytic saved activations from the traced ones, and the wall time of the traced estimate
(build, warm-up step and measured step). Presets without a recipe are traced only ("—"); "answer" is the engine
that answers without --trace (a recipe whose step can peak inside a layer is a check beside the derived answer).
Nothing real is allocated.
"""

from __future__ import annotations

import argparse
import time

DEFAULT = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "mistral-7b", "llama-2-7b", "llama-3-8b", "gpt2",
           "bert-base-uncased", "pythia-410m", "gemma-2b", "gemma-2-2b", "phi-3-mini", "t5-small", "roberta-base",
           "distilbert-base-uncased", "electra-base-discriminator", "albert-base-v2", "bart-base", "bart-large",
           "deberta-v3-base", "gpt-j-6b", "modernbert-base")


def main() -> None:
    from paramscope.cost.memory.training import TrainingOptions, estimate_training

    parser = argparse.ArgumentParser()
    parser.add_argument("presets", nargs="*")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=None, help="default: 2,048, or the model's maximum")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--grad-checkpointing", default="none")
    args = parser.parse_args()
    print(f"batch {args.batch} × {args.seq or '2,048 (or the model maximum)'} tokens, {args.precision}, AdamW (fused), checkpointing "
          f"{args.grad_checkpointing}")
    print(f"{'preset':<26} {'traced peak':>17} {'phase':<9} {'analytic peak':>17} {'diff B':>12} {'diff':>9} "
          f"{'saved':>8} {'answer':<8} {'trace s':>7}")
    for name in args.presets or DEFAULT:
        start = time.perf_counter()
        try:
            estimate = estimate_training(name, TrainingOptions(
                batch=args.batch, seq=args.seq, precision=args.precision,
                grad_checkpointing=args.grad_checkpointing, trace=True))
        except Exception as err:  # a bench row, not a crash
            print(f"{name:<26} {'—':>17} {str(err)[:80]}")
            continue
        seconds = time.perf_counter() - start
        analytic = estimate.training.analytic_peak
        diff = f"{100 * (analytic - estimate.peak) / estimate.peak:+.4f}%" if analytic else "—"
        diff_bytes = f"{analytic - estimate.peak:+,}" if analytic else "—"
        saved, traced = estimate.training.analytic_activations, estimate.activations.bytes
        saved_diff = f"{100 * (saved - traced) / traced:+.2f}%" if saved else "—"
        answer = estimate_training(name, TrainingOptions(batch=args.batch, seq=args.seq, precision=args.precision,
                                                         grad_checkpointing=args.grad_checkpointing)).engine
        print(f"{name:<26} {estimate.peak:>17,} {estimate.peak_phase:<9} "
              f"{'—' if analytic is None else format(analytic, ','):>17} {diff_bytes:>12} {diff:>9} {saved_diff:>8} "
              f"{answer:<8} {seconds:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
