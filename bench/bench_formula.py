"""`paramscope formula`: derivation time per class, and the cached answer's wall time and peak RSS.

    python bench/bench_formula.py [--repeats 5] [--models bert-base-chinese,openai-community/gpt2,...]

Every measurement is a fresh Python process, timed from the parent; peak RSS is the child's ru_maxrss from
os.wait4. The cache lives in a temporary directory (PARAMSCOPE_CACHE_DIR), so the user's cache is untouched.

- derive (cold): `formula MODEL --no-cache`, whole process: imports of torch and transformers, every probe build,
  the checks. The child also reports the derivation alone (builds, seconds) from the formula's record.
- cached: `formula MODEL` after one derivation stored the formula, text and --json; this path must not import
  torch, transformers or sympy (checked: the child exits non-zero if it did).
- floors: `python -c pass` (the interpreter), `import paramscope` (the package, which every command pays), and
  reading the cached JSON file with json.load.

Bytecode caching is on (as in any installed package) even where PYTHONDONTWRITEBYTECODE is set, and each timed
command gets one unmeasured warm-up run; --no-bytecode measures with compilation on every start instead.

Prints Markdown tables for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile

from _child import run_child

DEFAULT_MODELS = ("bert-base-chinese,openai-community/gpt2,google-t5/t5-small,meta-llama/Llama-2-7b-hf,"
                  "mistralai/Mixtral-8x7B-v0.1,albert/albert-base-v2,deepseek-ai/DeepSeek-V3")

CLI = "from paramscope.cli import main; import sys; sys.exit(main(sys.argv[1:]))"
CLI_LIGHT = ("import sys; from paramscope.cli import main; code = main(sys.argv[1:]);"
             "heavy = {'torch', 'transformers', 'sympy'} & set(sys.modules);"
             "sys.exit(f'imported {sorted(heavy)}' if heavy else code)")


def median_runs(argv: list[str], env: dict[str, str], repeats: int, warm: bool = True) -> tuple[float, int, str]:
    if warm:
        run_child(argv, env)
    runs = [run_child(argv, env) for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), max(r[1] for r in runs), runs[-1][2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5, help="runs per cached measurement (median)")
    parser.add_argument("--derive-repeats", type=int, default=1, help="runs per cold derivation (median)")
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--no-bytecode", action="store_true", help="keep PYTHONDONTWRITEBYTECODE if it is set")
    args = parser.parse_args()

    cache = tempfile.mkdtemp(prefix="paramscope-bench-cache-")
    env = {**os.environ, "PARAMSCOPE_CACHE_DIR": cache}
    if not args.no_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    py = sys.executable

    floor_wall, floor_rss, _ = median_runs([py, "-c", "pass"], env, args.repeats)
    package_wall, package_rss, _ = median_runs([py, "-c", "import paramscope"], env, args.repeats)
    print(f"interpreter floor: {floor_wall:.3f} s, {floor_rss / 2**20:.0f} MiB; import paramscope "
          f"{package_wall:.3f} s", file=sys.stderr)

    derive_rows, cached_rows = [], []
    for model in args.models.split(","):
        # cold: no cache, everything imported and derived
        wall, rss, out = median_runs([py, "-c", CLI, "formula", model, "--no-cache", "--json"], env,
                                     args.derive_repeats, warm=False)
        doc = json.loads(out)
        anchor = doc["derivation"]["anchor"]
        cls = doc["model"]["class"]
        derive_rows.append((model, cls, len(doc["formula"]["symbols"]), anchor["builds"], anchor["seconds"],
                            wall, rss))
        print(f"{model}: derive {anchor['seconds']:.2f} s ({anchor['builds']} builds), process {wall:.2f} s",
              file=sys.stderr, flush=True)
        # store it, then the cached path (text and JSON), which must stay torch-free; an edit of the role rules
        # while this runs invalidates the cache (by design), so store again once and retry
        for attempt in (1, 2):
            _, _, out = run_child([py, "-c", CLI, "formula", model, "--json"], env)
            entry = json.loads(out)["derivation"]["cache_file"]
            try:
                text_wall, text_rss, _ = median_runs([py, "-c", CLI_LIGHT, "formula", model], env, args.repeats)
                json_wall, json_rss, _ = median_runs([py, "-c", CLI_LIGHT, "formula", model, "--json"], env,
                                                     args.repeats)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        read_wall, read_rss, _ = median_runs([py, "-c", f"import json; json.load(open({entry!r}))"], env,
                                             args.repeats)
        cached_rows.append((model, cls, text_wall, text_rss, json_wall, json_rss, read_wall, read_rss,
                            os.path.getsize(entry)))
        print(f"{model}: cached text {text_wall:.3f} s, json {json_wall:.3f} s, json.load floor {read_wall:.3f} s",
              file=sys.stderr, flush=True)

    print(f"\nPython {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores; "
          f"bytecode cache {'off' if args.no_bytecode else 'on'}; floors: `python -c pass` {floor_wall:.3f} s "
          f"({floor_rss / 2**20:.0f} MiB), `import paramscope` {package_wall:.3f} s "
          f"({package_rss / 2**20:.0f} MiB).\n")
    print("Derivation (cold, `formula MODEL --no-cache --json`, median of "
          f"{args.derive_repeats}):\n")
    print("| model | class | symbols | probe builds | derivation (s) | whole process (s) | peak RSS (MiB) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for model, cls, nsym, builds, seconds, wall, rss in derive_rows:
        print(f"| {model} | {cls} | {nsym} | {builds} | {seconds:.2f} | {wall:.2f} | {rss / 2**20:.0f} |")
    print(f"\nCached answer (median of {args.repeats}; no torch, transformers or sympy imported):\n")
    print("| model | text (s) | RSS (MiB) | --json (s) | RSS (MiB) | json.load floor (s) | cache file (KiB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for model, cls, tw, tr, jw, jr, rw, rr, size in cached_rows:
        print(f"| {model} | {tw:.3f} | {tr / 2**20:.0f} | {jw:.3f} | {jr / 2**20:.0f} | {rw:.3f} | "
              f"{size / 1024:.1f} |")


if __name__ == "__main__":
    main()
