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
import sys

from _child import run_child

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
    wall, rss, out = run_child(argv)
    return wall, rss, out.strip().splitlines()[-1][:40] if out.strip() else ""


# The work after the imports, in one warm process: the floor's build + sum against paramscope's whole
# inspect (resolve, build, count, roles, ties, tree, MoE, conventions) + JSON. Import time (≈6 s here, and
# noisy) dominates whole-process figures; this isolates what paramscope adds.
IN_PROCESS = BUILD + """
import statistics, time
import paramscope
from paramscope.render.json import render_json

def floor():
    with torch.device("meta"):
        m = cls(config)
    return sum(p.numel() for p in m.parameters())

def full():
    return render_json(paramscope.inspect({model!r}))

for f in (floor, full):
    f()  # warm: first-use imports and caches belong to neither
times = {{}}
for name, f in (("floor", floor), ("paramscope", full)):
    runs = []
    for _ in range({repeats}):
        start = time.perf_counter(); f(); runs.append(time.perf_counter() - start)
    times[name] = statistics.median(runs)
print(times["floor"], times["paramscope"])
"""


def class_of(model: str) -> str:
    from paramscope.presets import find_preset

    return find_preset(model).load_config()["architectures"][0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="bert-base-uncased,meta-llama/Llama-3.1-405B")
    parser.add_argument("--tools", default="floor,paramscope,torchinfo,fvcore")
    parser.add_argument("--no-in-process", action="store_true", help="skip the after-import comparison")
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

    in_process = []
    if not args.no_in_process:
        for model in args.models.split(","):
            snippet = IN_PROCESS.format(model=model, cls=class_of(model), repeats=max(args.repeats, 5))
            _, _, out = run_child([sys.executable, "-c", snippet])
            floor_s, full_s = map(float, out.split()[-2:])
            in_process.append((model, floor_s, full_s))
            print(f"{model} in-process: floor {floor_s:.3f} s, paramscope {full_s:.3f} s", file=sys.stderr)

    print(f"\nPython {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores; "
          f"median of {args.repeats} runs, peak RSS the max.\n")
    print("| model | class | tool | wall (s) | × floor | peak RSS (MiB) | × floor |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for model, cls, tool, wall, rss, floor in rows:
        ratio_t = f"{wall / floor[0]:.2f}" if floor else "–"
        ratio_m = f"{rss / floor[1]:.2f}" if floor else "–"
        print(f"| {model} | {cls} | {tool} | {wall:.2f} | {ratio_t} | {rss / 2**20:.0f} | {ratio_m} |")
    if in_process:
        print(f"\nAfter the imports, in one warm process (median of {max(args.repeats, 5)}):\n")
        print("| model | floor: build + sum (s) | paramscope: inspect + JSON (s) | × floor |")
        print("| --- | ---: | ---: | ---: |")
        for model, floor_s, full_s in in_process:
            print(f"| {model} | {floor_s:.3f} | {full_s:.3f} | {full_s / floor_s:.2f} |")


if __name__ == "__main__":
    main()
