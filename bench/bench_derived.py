"""The derived engine against the traced one: peaks and whole-process times, per config.

    python bench/bench_derived.py [--seq S] [--batch B] CONFIG.json ...
    python bench/bench_derived.py --table [--seq S] [--batch B] [--also BxS] [--full-timeout SECONDS] CONFIG.json ...

For each config, in fresh processes with an empty cache: `memory CONFIG --training` cold (derived: cuts traced,
checked, kept), the same again (the cache answers), another batch and length from the cache, and `--trace` (the
whole model on fake tensors, MemTracker) at the first point, then at the other. Prints one Markdown row per config:
engine, the peaks, whether they are equal to the byte, and the seconds. Figures go in docs/benchmarks.md.

--table: one row per config and point for the table of architectures without a preset: the model (hub id from the
file name, org--name.json, and class), layers, the derived peak, the depth-extended `--trace` peak and the
`--trace full` one (skipped, "—", where it runs past --full-timeout), equal or the difference, and `memory CONFIG
--training` cold (empty cache) and cached (again, once the recording the cold run detached has finished), each a
whole process timed by /usr/bin/time -f %e. --also adds a row per
config at another point, with an empty cache of its own too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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


def _timed(args: list[str], cache: str, timeout: float | None = None) -> tuple[float, dict] | None:
    """(seconds as /usr/bin/time -f %e reports them, the JSON's memory) of one whole process; None past `timeout`.
    Bytecode is written (PYTHONDONTWRITEBYTECODE unset), so after the warm-up every process imports from .pyc."""
    env = dict(os.environ, PARAMSCOPE_CACHE_DIR=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    command = ["/usr/bin/time", "-f", "%e", sys.executable, "-m", "paramscope", *args, "--json"]
    # a session of its own: past the timeout, time and the paramscope process under it end together
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return None
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: {err.strip()[-400:]}")
    return float(err.strip().splitlines()[-1]), json.loads(out)["memory"]


def _warm_up() -> None:
    """One import of everything a run imports, with bytecode written, so no measured process compiles."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-c", "import paramscope.cli, transformers, torch; "
                    "import paramscope.cost.memory.training, paramscope.cost.derived.derive"], env=env, check=True)


def _recorded(cache: str, limit: float = 900) -> None:
    """Wait for the detached recording the cold run started (cli/_recording.py: the class's template and the
    config's cost facts, written for the next call), so that "cached" is the steady state and nothing else runs
    beside it."""
    jobs = os.path.join(cache, "jobs")
    start = time.monotonic()
    while os.path.isdir(jobs) and any(n.endswith((".lock", ".json")) for n in os.listdir(jobs)):
        if time.monotonic() - start > limit:
            raise SystemExit(f"the recording in {jobs} did not finish in {limit:.0f} s")
        time.sleep(0.5)


def _difference(derived: int, traced: int) -> str:
    return "equal" if derived == traced else f"{derived - traced:+,} B ({(derived - traced) / traced:+.4%})"


def table(options: argparse.Namespace) -> None:
    _warm_up()
    points = [(options.batch, options.seq)] + [tuple(int(x) for x in p.split("x")) for p in options.also]
    print("| model (hub id, class) | layers | B × S | derived peak | traced peak, extended | traced peak, full | "
          "derived − traced | cold s | cached s | trace s, extended / full |")
    print("|---|---:|---|---:|---:|---:|---|---:|---:|---:|")
    for config in options.configs:
        with open(config) as handle:
            data = json.load(handle)
        name = os.path.basename(config).removesuffix(".json").replace("--", "/", 1)
        model = f"{name} ({data['architectures'][0]})"
        layers = data.get("num_hidden_layers")
        for batch, seq in points:
            with tempfile.TemporaryDirectory() as cache:
                point = ["--batch", str(batch), "--seq", str(seq)]
                cold_s, derived = _timed(["memory", config, "--training", *point], cache)
                _recorded(cache)
                cached_s, again = _timed(["memory", config, "--training", *point], cache)
                assert again["peak"]["bytes"] == derived["peak"]["bytes"]
                extended_s, extended = _timed(["memory", config, "--training", *point, "--trace"], cache)
                full = _timed(["memory", config, "--training", *point, "--trace", "full"], cache,
                              timeout=options.full_timeout)
                peak = derived["peak"]["bytes"]
                traced = [extended["peak"]["bytes"]] + ([full[1]["peak"]["bytes"]] if full else [])
                if all(t == peak for t in traced):
                    differences = ["equal"]
                else:
                    differences = [f"{label}: {_difference(peak, t)}" for label, t in zip(("extended", "full"), traced)]
                seconds = f"{extended_s:.1f} / {f'{full[0]:.1f}' if full else f'> {options.full_timeout:.0f}'}"
                engine = "" if derived["engine"] == "derived" else f" ({derived['engine']})"
                first = (batch, seq) == points[0]
                print(f"| {model if first else ''} | {layers if first else ''} | {batch} × {seq:,} | {peak:,}{engine} "
                      f"| {traced[0]:,} | {f'{traced[1]:,}' if full else '—'} | {'; '.join(differences)} | "
                      f"{cold_s:.1f} | {cached_s:.1f} | {seconds} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--other", default="4x4096", help="another point, BxS, answered from the cache")
    parser.add_argument("--table", action="store_true", help="the table of architectures (docs/benchmarks.md)")
    parser.add_argument("--also", action="append", default=[], metavar="BxS",
                        help="--table: another point, a row of its own (repeatable)")
    parser.add_argument("--full-timeout", type=float, default=180,
                        help="--table: seconds `--trace full` may run before it is left out")
    options = parser.parse_args()
    if options.table:
        table(options)
        return
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
