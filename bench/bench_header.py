"""The largest legal safetensors headers: `audit` of a header at the format's own 100 MB limit, and of the hostile
ones the tensor bound (MAX_TENSORS, a million) answers or refuses.

    python bench/bench_header.py [--kind one|zero|qweight] [--tensors N] [--modes text,json,all] [--repeats 3]
                                 [--src DIR]

Writes a checkpoint folder (BERT's config.json and a model.safetensors) to a temporary directory, then times
`paramscope audit DIR` (with `--json` or `--all` per mode) in fresh processes: wall time, CPU time (user + system)
and peak RSS. Kinds of header:

* `one` (default): `--tensors` one-element F32 tensors named like MoE experts, 99.8 MB at the default 958,000;
* `zero`: zero-size tensors (shape [0], data_offsets [0, 0]) with short names, as the issue's 72 MB header of
  1.2 million; the default 1,200,000 is over the bound and refused;
* `qweight`: one-element I32 GPTQ `qweight`s, so that every tensor is packed (classified, reconciled and listed
  under "packed").

With `--phases`, the phases in one process as well: read the header, the model's report (from its structure
template, as `audit` answers; no torch), reconcile. `--src DIR` runs the paramscope found in DIR (a `src` folder,
e.g. `git archive HEAD src | tar -x -C /tmp/before`) instead of the installed one: the before of a before/after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _child import run_child

DEFAULT_TENSORS = {"one": 958_000, "zero": 1_200_000, "qweight": 958_000}


def write_checkpoint(folder: Path, tensors: int, kind: str = "one") -> int:
    header, offset = {}, 0
    for i in range(tensors):
        if kind == "zero":
            header[f"t{i}"] = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
            continue
        if kind == "qweight":
            name, dtype = f"model.layers.{i // 1000}.mlp.experts.{i % 1000}.qweight", "I32"
        else:
            name, dtype = f"model.layers.{i // 1000}.mlp.experts.{i % 1000}.w.weight", "F32"
        header[name] = {"dtype": dtype, "shape": [1], "data_offsets": [offset, offset + 4]}
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

MODES = {"text": [], "json": ["--json"], "all": ["--all"]}


def run_audit(argv: list[str], env: dict[str, str]) -> tuple[float, float, int, int, str]:
    """(wall s, CPU s, peak RSS bytes, exit code, last stderr line) of one fresh `paramscope audit`; a refusal (exit
    2) is a result here, not a failure. stdout goes to /dev/null: the figure is the command's, not a pipe's."""
    with tempfile.TemporaryFile() as err, open(os.devnull, "wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status), (
        lines[-1] if lines else "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=sorted(DEFAULT_TENSORS), default="one")
    parser.add_argument("--tensors", type=int)
    parser.add_argument("--modes", default="text", help="comma-separated: text, json, all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--src", help="a paramscope source folder to run instead of the installed one")
    parser.add_argument("--phases", action="store_true")
    parser.add_argument("--write-only", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tensors = args.tensors or DEFAULT_TENSORS[args.kind]
    if args.write_only:
        print(write_checkpoint(Path(args.write_only), tensors, args.kind))
        return
    env = dict(os.environ, PARAMSCOPE_RECORD_TEMPLATES="0")
    if args.src:
        env["PYTHONPATH"] = os.path.abspath(args.src)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # Written by a child: a parent that built a million-entry dict would lend its RSS to every child it forks
        # (ru_maxrss counts the pages a child shares before exec), and the figures would be the parent's.
        size = int(subprocess.run([sys.executable, __file__, "--write-only", tmp, "--kind", args.kind, "--tensors",
                                   str(tensors)], check=True, capture_output=True, text=True).stdout)
        for mode in args.modes.split(","):
            argv = [sys.executable, "-m", "paramscope", "audit", str(folder), *MODES[mode]]
            runs = [run_audit(argv, env) for _ in range(args.repeats)]
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            rss = max(r[2] for r in runs) / 2**20
            outcome = "answered" if runs[0][3] == 0 else f"exit {runs[0][3]}: {runs[0][4][:90]}"
            print(f"| {args.kind} | {tensors:,} | {size / 1e6:.1f} MB | {mode} | {wall:.1f} | {cpu:.1f} | {rss:,.0f} | "
                  f"{outcome} |", flush=True)
        if args.phases:
            phases = run_child([sys.executable, "-c", PHASES, str(folder)], env=env)[2].split()
            print(f"phases: read / the model's report / reconcile (s): {' / '.join(phases)}")


if __name__ == "__main__":
    t = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t:.0f} s in all)", file=sys.stderr)
