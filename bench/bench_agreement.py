"""Agreement (issue 31 §4): every engine against torch's own counters, for every preset family and for
architectures that are not presets.

    python bench/bench_agreement.py [--only NAME ...] [--jsonl FILE] [--resume] [--timeout SECONDS]
    python bench/bench_agreement.py --render FILE.jsonl

For each model, in fresh child processes (one for the FLOPs, one for the training memory), at batch 1:

- FLOPs of a training step (2,048 tokens, or the model's maximum when shorter): the engine's own answer
  (`estimate_flops(model, FlopOptions(training=True))`: "analytic", checked once against FlopCounterMode on a cut
  of the class, or "traced" where no formula covers the class or the check found a term that differs) against
  FlopCounterMode over the real class at full depth on fake tensors (`trace=True`): forward and backward, exact
  integers, and their relative difference.
- Training memory (bf16-mixed, AdamW, no checkpointing; 2,048 tokens or the model's maximum, 512 for the models
  over 100 B parameters, `BIG` below): the default answer's peak (`estimate_training`, engine "analytic" for the
  fitted families, "derived" for the others, "traced" where neither) against MemTracker over one steady step of
  the real class at full depth on fake tensors (`trace="full"`): the difference in bytes and in %. Mamba and Jamba
  (`SCAN`: transformers' CPU selective scan loops over the tokens in Python, so a trace's time grows with S) are
  counted at 256 tokens, their memory at 64. A row whose trace runs past --timeout (or fails) is left out with
  the reason; a FLOPs row keeps the engine's answer where FlopCounterMode cannot run the class.

Each child writes one JSON line (to --jsonl, default /tmp/bench_agreement.jsonl); the tables are printed from those
lines at the end (or with --render, from a file already written). Nothing real is allocated. The cache is
$PARAMSCOPE_CACHE_DIR, as a user's would be: the engine's answer is what `paramscope flops` / `memory --training`
would say there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

# one preset per family (tests/test_flops.py's FAMILIES)
PRESETS = ("llama-3-8b", "mistral-7b", "qwen2.5-0.5b", "gemma-2b", "gemma-2-2b", "phi-3-mini", "gpt2", "pythia-160m",
           "gpt-j-6b", "bert-base-uncased", "roberta-base", "distilbert", "electra-base", "modernbert-base",
           "mixtral-8x7b", "qwen1.5-moe-a2.7b", "deepseek-v3", "t5-small", "bart-base", "albert-base-v2",
           "deberta-v3-base")
# architectures without a preset: the hub's config.json files (Mistral-7B's, a preset family, left out)
CONFIGS = ("bench/configs/Qwen--Qwen3-0.6B.json", "bench/configs/Qwen--Qwen3-8B.json",
           "bench/configs/Qwen--Qwen3-235B-A22B.json", "bench/configs/HuggingFaceTB--SmolLM3-3B.json",
           "bench/configs/LGAI-EXAONE--EXAONE-4.0-32B.json", "bench/configs/allenai--OLMo-2-1124-7B.json",
           "bench/configs/baidu--ERNIE-4.5-0.3B-PT.json", "bench/configs/google--gemma-3-1b-pt.json",
           "bench/configs/ibm-granite--granite-3.1-3b-a800m-base.json", "bench/configs/openai--gpt-oss-20b.json",
           "bench/configs/zai-org--GLM-4.5-Air.json", "tests/configs/families/LiquidAI--LFM2-1.2B.json",
           "tests/configs/families/state-spaces--mamba-130m-hf.json", "tests/configs/families/defaults--mamba2.json",
           "tests/configs/families/ai21labs--Jamba-v0.1.json", "tests/configs/families/openai--whisper-small.json",
           "tests/configs/families/Qwen--Qwen2.5-VL-7B-Instruct.json")
BIG = ("deepseek-v3", "bench/configs/Qwen--Qwen3-235B-A22B.json", "bench/configs/zai-org--GLM-4.5-Air.json")
BIG_SEQ = 512
# transformers' CPU path of Mamba's selective scan is a Python loop over the tokens (one small op chain per token
# per layer), so a trace on fake tensors takes time in proportion to S: FlopCounterMode over mamba-130m ran past 10
# minutes at 2,048 tokens, MemTracker (its answer is a trace too) past 10 minutes at 256 (86 s at 64)
SCAN = ("tests/configs/families/state-spaces--mamba-130m-hf.json", "tests/configs/families/ai21labs--Jamba-v0.1.json")
SCAN_SEQ = {"flops": 256, "memory": 64}
PRECISION = "bf16-mixed"


def _label(model: str) -> str:
    if model.endswith(".json"):
        return os.path.basename(model).removesuffix(".json").replace("--", "/", 1)
    return model


def _child(model: str, part: str, seq: int | None) -> dict:
    """One part for one model, in this (fresh) process: the engine's answer, then the full-depth count."""
    import resource

    result: dict = {"model": model, "part": part}
    if part == "flops":
        from paramscope.cost.flops.estimate import FlopOptions, estimate_flops

        start = time.perf_counter()
        answer = estimate_flops(model, FlopOptions(batch=1, seq=seq, training=True))
        result["answer_s"] = time.perf_counter() - start
        result.update(
            class_name=answer.report.model.class_name if answer.report is not None else None,
            seq=answer.seq, engine=answer.engine, check=None if answer.check is None else answer.check.status,
            check_words=None if answer.check is None else answer.check.words(), answer_notes=list(answer.notes),
            forward=answer.forward, backward=answer.backward, recompute=answer.recompute)
        start = time.perf_counter()
        try:
            traced = estimate_flops(model, FlopOptions(batch=1, seq=seq, training=True, trace=True))
        except Exception as err:  # a row saying why FlopCounterMode could not count the class, not a crash
            result["trace_error"] = str(err).splitlines()[0][:300]
        else:
            result.update(traced_engine=traced.engine, traced_forward=traced.forward, traced_backward=traced.backward,
                          traced_recompute=traced.recompute, traced_notes=list(traced.notes))
        result["trace_s"] = time.perf_counter() - start
    else:
        from paramscope.cost.memory.training import TrainingOptions, estimate_training

        start = time.perf_counter()
        answer = estimate_training(model, TrainingOptions(batch=1, seq=seq, precision=PRECISION))
        result["answer_s"] = time.perf_counter() - start
        result.update(
            class_name=answer.report.model.class_name if answer.report is not None else None,
            seq=answer.settings.get("seq"), engine=answer.engine, peak=answer.peak, phase=answer.peak_phase,
            answer_notes=list(answer.notes))
        start = time.perf_counter()
        try:
            traced = estimate_training(model, TrainingOptions(batch=1, seq=seq, precision=PRECISION, trace="full"))
        except Exception as err:  # a row saying why the step could not be traced, not a crash
            result["trace_error"] = str(err).splitlines()[0][:300]
        else:
            result.update(traced_engine=traced.engine, traced_depth=traced.training.trace_depth,
                          traced_peak=traced.peak, traced_phase=traced.peak_phase,
                          traced_by_category=dict(traced.training.by_category))
        result["trace_s"] = time.perf_counter() - start
    result["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def _run_part(model: str, part: str, seq: int | None, timeout: float) -> dict:
    """The child's JSON line, or a row saying why there is none (past the timeout, or failed)."""
    argv = [sys.executable, __file__, "--child", model, "--part", part] + ([] if seq is None else ["--seq", str(seq)])
    start = time.perf_counter()
    # a session of its own: past the timeout the child and anything under it end together
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return {"model": model, "part": part, "seq": seq, "skipped": f"ran past {timeout:.0f} s",
                    "wall_s": time.perf_counter() - start}
    wall = time.perf_counter() - start
    if process.returncode != 0:
        last = [line for line in err.strip().splitlines() if line.strip()][-1:] or ["(no message)"]
        return {"model": model, "part": part, "seq": seq, "skipped": f"failed: {last[0][:200]}", "wall_s": wall}
    row = json.loads(out.strip().splitlines()[-1])
    row["wall_s"] = wall
    return row


def _pct(value: int, reference: int) -> str:
    return "equal" if value == reference else f"{100 * (value - reference) / reference:+.4f}%"


def _model_cell(row: dict) -> str:
    label = _label(row["model"])
    return f"{label} ({row['class_name']})" if row.get("class_name") and row["model"].endswith(".json") else label


def render(rows: list[dict]) -> str:
    order = {model: index for index, model in enumerate(PRESETS + CONFIGS)}
    rows = sorted(rows, key=lambda r: order.get(r["model"], len(order)))  # stable: --only's extras keep their order
    flops = [r for r in rows if r["part"] == "flops"]
    memory = [r for r in rows if r["part"] == "memory"]
    lines = ["### FLOPs of a training step (batch 1)", "",
             "| model | S | engine | check | forward (engine) | forward (FlopCounterMode) | forward diff | "
             "backward (engine) | backward (FlopCounterMode) | backward diff | s (answer / trace) |",
             "|---|---:|---|---|---:|---:|---|---:|---:|---|---:|"]
    for r in flops:
        if "skipped" in r:
            lines.append(f"| {_model_cell(r)} | — | — | — | — | — | {r['skipped']} | — | — | — | — |")
            continue
        if "trace_error" in r:
            lines.append(f"| {_model_cell(r)} | {r['seq']:,} | {r['engine']} | {r['check'] or '—'} | "
                         f"{r['forward']:,} | — | FlopCounterMode cannot run it: {r['trace_error']} | "
                         f"{r['backward']:,} | — | — | {r['answer_s']:.1f} / — |")
            continue
        lines.append(f"| {_model_cell(r)} | {r['seq']:,} | {r['engine']} | {r['check'] or '—'} | {r['forward']:,} | "
                     f"{r['traced_forward']:,} | {_pct(r['forward'], r['traced_forward'])} | {r['backward']:,} | "
                     f"{r['traced_backward']:,} | {_pct(r['backward'], r['traced_backward'])} | "
                     f"{r['answer_s']:.1f} / {r['trace_s']:.1f} |")
    lines += ["", f"### Training memory, {PRECISION}, AdamW, batch 1", "",
              "| model | S | engine | answered peak | full-depth traced peak (MemTracker) | phase | diff B | diff | "
              "s (answer / trace) |",
              "|---|---:|---|---:|---:|---|---:|---|---:|"]
    for r in memory:
        if "skipped" in r:
            lines.append(f"| {_model_cell(r)} | {r['seq'] or 'default'} | — | — | left out: {r['skipped']} | — | "
                         f"— | — | — |")
            continue
        if "trace_error" in r:
            lines.append(f"| {_model_cell(r)} | {r['seq']:,} | {r['engine']} | {r['peak']:,} | left out: the step "
                         f"cannot be traced: {r['trace_error']} | — | — | — | {r['answer_s']:.1f} / — |")
            continue
        diff = r["peak"] - r["traced_peak"]
        lines.append(f"| {_model_cell(r)} | {r['seq']:,} | {r['engine']} | {r['peak']:,} | {r['traced_peak']:,} | "
                     f"{r['traced_phase']} | {diff:+,} | {_pct(r['peak'], r['traced_peak'])} | "
                     f"{r['answer_s']:.1f} / {r['trace_s']:.1f} |")
    return "\n".join(lines)


def _read(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="+", metavar="NAME", help="presets or config paths (or their hub ids)")
    parser.add_argument("--jsonl", default="/tmp/bench_agreement.jsonl")
    parser.add_argument("--resume", action="store_true", help="keep the rows already in --jsonl, run the rest")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one child may run")
    parser.add_argument("--parts", nargs="+", default=["flops", "memory"], choices=["flops", "memory"])
    parser.add_argument("--render", metavar="FILE", help="print the tables from a --jsonl file already written")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(_child(options.child, options.part, options.seq)), flush=True)
        return
    if options.render:
        print(render(_read(options.render)))
        return
    models = list(PRESETS + CONFIGS)
    if options.only:
        models = [m for m in models if m in options.only or _label(m) in options.only] + \
                 [m for m in options.only if m not in models and _label(m) not in {_label(x) for x in models}]
    done = {(r["model"], r["part"]) for r in _read(options.jsonl)} if options.resume else set()
    if not options.resume and os.path.exists(options.jsonl):
        os.remove(options.jsonl)
    start = time.perf_counter()
    for model in models:
        for part in options.parts:
            if (model, part) in done:
                continue
            seq = SCAN_SEQ[part] if model in SCAN else BIG_SEQ if part == "memory" and model in BIG else None
            row = _run_part(model, part, seq, options.timeout)
            with open(options.jsonl, "a") as handle:
                handle.write(json.dumps(row) + "\n")
            if row.get("skipped") or row.get("trace_error"):
                status = row.get("skipped") or row.get("trace_error")
            elif part == "flops":
                status = f"{row['engine']} {_pct(row['forward'], row['traced_forward'])} forward, " \
                         f"{_pct(row['backward'], row['traced_backward'])} backward"
            else:
                status = f"{row['engine']} {_pct(row['peak'], row['traced_peak'])}"
            print(f"# {_label(model)} {part}: {status} ({row['wall_s']:.1f} s)", file=sys.stderr, flush=True)
    print(render(_read(options.jsonl)))
    print(f"\n# {time.perf_counter() - start:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
