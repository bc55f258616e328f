"""The derived engine against the traced one: peaks and whole-process times, per config.

    python bench/bench_derived.py [--seq S] [--batch B] CONFIG.json ...

For each config, in fresh processes with an empty cache: `memory CONFIG --training` cold (derived: cuts traced,
checked, kept), the same again (the cache answers), another batch and length from the cache, and `--trace` (the
whole model on fake tensors, MemTracker) at the first point, then at the other. Prints one Markdown row per config:
engine, the peaks, whether they are equal to the byte, and the seconds. Figures go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _run(args: list[str], cache: str) -> tuple[float, dict]:
    env = dict(os.environ, PARAMSCOPE_CACHE_DIR=cache)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "paramscope", *args, "--json"], capture_output=True, text=True,
                          env=env, timeout=3600)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: {done.stderr.strip()[-400:]}")
    return seconds, json.loads(done.stdout)["memory"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--other", default="4x4096", help="another point, BxS, answered from the cache")
    options = parser.parse_args()
    other_batch, other_seq = (int(x) for x in options.other.split("x"))
    print("| config | engine | B×S | derived peak | traced peak | equal | cold s | cached s | "
          f"{other_batch}×{other_seq} cached s | traced s | {other_batch}×{other_seq} equal | traced s |")
    print("|---|---|---|---:|---:|---|---:|---:|---:|---:|---|---:|")
    for config in options.configs:
        with tempfile.TemporaryDirectory() as cache:
            point = ["--batch", str(options.batch), "--seq", str(options.seq)]
            far = ["--batch", str(other_batch), "--seq", str(other_seq)]
            cold, derived = _run(["memory", config, "--training", *point], cache)
            warm, _ = _run(["memory", config, "--training", *point], cache)
            other, derived_far = _run(["memory", config, "--training", *far], cache)
            traced_s, traced = _run(["memory", config, "--training", *point, "--trace"], cache)
            far_s, traced_far = _run(["memory", config, "--training", *far, "--trace"], cache)
        name = os.path.basename(config).removesuffix(".json")
        print(f"| {name} | {derived['engine']} | {options.batch}×{options.seq} | {derived['peak']['bytes']:,} | "
              f"{traced['peak']['bytes']:,} | {derived['peak']['bytes'] == traced['peak']['bytes']} | {cold:.1f} | "
              f"{warm:.1f} | {other:.1f} | {traced_s:.1f} | "
              f"{derived_far['peak']['bytes'] == traced_far['peak']['bytes']} | {far_s:.1f} |", flush=True)


if __name__ == "__main__":
    main()
