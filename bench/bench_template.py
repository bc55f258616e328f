"""Structure templates (issue 14): `inspect`, `compare`, `memory` and `flops` answered from shipped templates (and
cost facts), against the build.

    python bench/bench_template.py [--repeats 7] [--only report|costs]

Every measurement is a fresh Python process timed from the parent (peak RSS from os.wait4). The cache lives in an
empty temporary PARAMSCOPE_CACHE_DIR, so only the shipped templates answer. Template runs must import neither
torch, transformers nor sympy (the child exits non-zero if they did). Rows:

- template: `inspect PRESET --json`, `inspect PRESET` (text, width 100), `compare` of 8 presets; `memory PRESET`
  (JSON and text), `flops PRESET --json` and `flops PRESET --training` (text);
- build: the same with `--no-cache` (imports torch and transformers, builds on meta);
- floors: `python -c pass` and `import paramscope`, and the bare meta-count floor (import transformers, build
  on meta, sum numel) from bench_inspect.py's definition.

Prints Markdown tables for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile

from _child import run_child
from bench_formula import CLI, CLI_LIGHT

MODELS = ("bert-base-uncased", "meta-llama/Llama-3.1-405B", "deepseek-ai/DeepSeek-V3")
COMPARE = ("bert-base-uncased", "gpt2", "llama-3-8b", "mistral-7b", "mixtral-8x7b", "t5-small", "qwen2.5-7b",
           "gemma-2-9b")
FLOOR = ("import sys, torch, transformers\nfrom paramscope.presets import find_preset\n"
         "config = transformers.AutoConfig.for_model(**find_preset(sys.argv[1]).load_config())\n"
         "with torch.device('meta'):\n"
         "    model = getattr(transformers, config.architectures[0])(config)\n"
         "print(sum(p.numel() for p in model.parameters()))\n")


def median(argv, env, repeats):
    run_child(argv, env)  # warm-up: bytecode and the page cache, as any installed package has them
    runs = [run_child(argv, env) for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), max(r[1] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", choices=("report", "costs"))
    args = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PARAMSCOPE_CACHE_DIR": cache, "PARAMSCOPE_RECORD_TEMPLATES": "0",
               "COLUMNS": "100"}
        print(f"Python {platform.python_version()}, {platform.machine()}; median of {args.repeats} runs\n")
        print("| command | model | engine | wall (s) | peak RSS (MiB) |")
        print("| --- | --- | --- | ---: | ---: |")

        def row(what, model, engine, argv):
            wall, rss = median(argv, env, args.repeats)
            print(f"| {what} | {model} | {engine} | {wall:.3f} | {rss / 2**20:.0f} |", flush=True)

        row("`python -c pass`", "", "floor", [py, "-c", "pass"])
        row("`import paramscope`", "", "floor", [py, "-c", "import paramscope"])
        if args.only != "report":
            for model in MODELS:
                row("`memory --json`", model, "template", [py, "-c", CLI_LIGHT, "memory", model, "--json"])
                row("`memory` (text)", model, "template", [py, "-c", CLI_LIGHT, "memory", model])
                row("`memory --json --no-cache`", model, "build", [py, "-c", CLI, "memory", model, "--json",
                                                                    "--no-cache"])
                row("`flops --json`", model, "template", [py, "-c", CLI_LIGHT, "flops", model, "--json"])
                row("`flops --training` (text)", model, "template", [py, "-c", CLI_LIGHT, "flops", model,
                                                                     "--training"])
                row("`flops --json --no-cache`", model, "build", [py, "-c", CLI, "flops", model, "--json",
                                                                   "--no-cache"])
        if args.only == "costs":
            return
        for model in MODELS:
            row("`inspect --json`", model, "template", [py, "-c", CLI_LIGHT, "inspect", model, "--json"])
            row("`inspect` (text)", model, "template", [py, "-c", CLI_LIGHT, "inspect", model])
            row("`inspect --json --no-cache`", model, "build", [py, "-c", CLI, "inspect", model, "--json",
                                                                 "--no-cache"])
            row("meta-count floor", model, "build", [py, "-c", FLOOR, model])
        row("`compare` of 8", ", ".join(COMPARE), "template", [py, "-c", CLI_LIGHT, "compare", *COMPARE])
        row("`compare` of 8 `--no-cache`", "(the same)", "build", [py, "-c", CLI, "compare", *COMPARE, "--no-cache"])


if __name__ == "__main__":
    main()
