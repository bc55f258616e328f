"""Whole-process wall time and peak RSS: paramscope vs the bare floor vs peer tools.

    python bench/bench_inspect.py [--repeats 3] [--models bert-base-uncased,meta-llama/Llama-3.1-405B]

Each measurement is a fresh Python process (imports included, as a user pays them), timed from the parent;
peak RSS is that child's ru_maxrss from os.wait4. Prints a Markdown table for docs/benchmarks.md.

- floor: import transformers, build the class on the meta device, sum the parameters. Nothing else.
- paramscope: `paramscope inspect MODEL --json` (everything: roles, ties, tree, JSON).
- torchinfo / fvcore: their parameter summaries of the same meta-built model (when installed).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

BUILD = """
import json, torch, transformers
from paramscope.presets import find_preset
config_dict = find_preset({model!r}).load_config()
config_dict.pop("quantization_config", None); config_dict.pop("auto_map", None)
cls = getattr(transformers, {cls!r})
config = transformers.CONFIG_MAPPING[config_dict["model_type"]].from_dict(config_dict)
with torch.device("meta"):
    model = cls(config)
"""

SNIPPETS = {
    "floor": BUILD + "print(sum(p.numel() for p in model.parameters()))\n",
    "torchinfo": BUILD + "import torchinfo\nprint(torchinfo.summary(model, verbose=0).total_params)\n",
    "fvcore": BUILD + "from fvcore.nn import parameter_count\nprint(parameter_count(model)[''])\n",
}


def measure(argv: list[str]) -> tuple[float, int, str]:
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv[:3]} failed: {err.decode()[-500:]}")
    return wall, usage.ru_maxrss * 1024, out.decode().strip().splitlines()[-1][:40] if out else ""


def class_of(model: str) -> str:
    from paramscope.presets import find_preset

    return find_preset(model).load_config()["architectures"][0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="bert-base-uncased,meta-llama/Llama-3.1-405B")
    parser.add_argument("--tools", default="floor,paramscope,torchinfo,fvcore")
    args = parser.parse_args()

    rows = []
    for model in args.models.split(","):
        cls = class_of(model)
        medians = {}
        for tool in args.tools.split(","):
            if tool == "paramscope":
                argv = [sys.executable, "-m", "paramscope", "inspect", model, "--json"]
            else:
                argv = [sys.executable, "-c", SNIPPETS[tool].format(model=model, cls=cls)]
            try:
                runs = [measure(argv) for _ in range(args.repeats)]
            except RuntimeError as err:
                print(f"skip {tool} on {model}: {err}", file=sys.stderr)
                continue
            wall = statistics.median(r[0] for r in runs)
            rss = max(r[1] for r in runs)
            medians[tool] = (wall, rss)
            rows.append((model, cls, tool, wall, rss, medians["floor"] if "floor" in medians else None))
            print(f"{model} {tool}: {wall:.2f} s, {rss / 2**20:.0f} MiB", file=sys.stderr, flush=True)

    print(f"\nPython {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores; "
          f"median of {args.repeats} runs, peak RSS the max.\n")
    print("| model | class | tool | wall (s) | × floor | peak RSS (MiB) | × floor |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for model, cls, tool, wall, rss, floor in rows:
        ratio_t = f"{wall / floor[0]:.2f}" if floor else "–"
        ratio_m = f"{rss / floor[1]:.2f}" if floor else "–"
        print(f"| {model} | {cls} | {tool} | {wall:.2f} | {ratio_t} | {rss / 2**20:.0f} | {ratio_m} |")


if __name__ == "__main__":
    main()
