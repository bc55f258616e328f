"""The largest legal safetensors header: `audit` of a header at the format's own 100 MB limit.

    python bench/bench_header.py [--tensors 958000] [--repeats 3]

Writes a checkpoint folder (BERT's config.json and a model.safetensors whose header lists `--tensors` one-element
F32 tensors, 99.8 MB at the default) to a temporary directory, then times `paramscope audit DIR` in fresh
processes (wall time and peak RSS), and the phases in one process: read the header, the model's report (from its
structure template, as `audit` answers; no torch), reconcile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

from _child import run_child


def write_checkpoint(folder: Path, tensors: int) -> int:
    header, offset = {}, 0
    for i in range(tensors):
        header[f"model.layers.{i // 1000}.mlp.experts.{i % 1000}.w.weight"] = {
            "dtype": "F32", "shape": [1], "data_offsets": [offset, offset + 4]}
        offset += 4
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with (folder / "model.safetensors").open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    from paramscope.presets import find_preset

    (folder / "config.json").write_text(json.dumps(find_preset("bert-base-uncased").load_config()))
    return len(raw)


PHASES = """
import sys, time
t = time.perf_counter
t0 = t()
from paramscope.checkpoint import read_checkpoint
ck = read_checkpoint(sys.argv[1] + "/model.safetensors"); t1 = t()
from paramscope.api import as_source, inspect_source
report, module = inspect_source(as_source(sys.argv[1])); t2 = t()  # a template where one answers, as audit does
from paramscope.audit import audit_report
audit_report(report, ck, module=module); t3 = t()
print(f"{t1 - t0:.2f} {t2 - t1:.2f} {t3 - t2:.2f}")
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tensors", type=int, default=958_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        size = write_checkpoint(folder, args.tensors)
        runs = [run_child([sys.executable, "-m", "paramscope", "audit", str(folder)]) for _ in range(args.repeats)]
        phases = run_child([sys.executable, "-c", PHASES, str(folder)])[2].split()
    wall = statistics.median(r[0] for r in runs)
    rss = max(r[1] for r in runs) / 2**20
    print(f"| {args.tensors:,} | {size / 1e6:.1f} MB | {wall:.1f} | {rss:.0f} | {' / '.join(phases)} |")


if __name__ == "__main__":
    t = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t:.0f} s in all)", file=sys.stderr)
