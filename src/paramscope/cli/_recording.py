"""Recording after a build answered: the class's structure template and the config's cost facts, which let the next
call answer without torch. The command's answer comes first, and the process ends once it is printed: by default
the recording runs in a detached process of its own (`python -m paramscope.cli._recording JOB`), so a user's prompt
comes back at once instead of 5–30 s later (30–50 more meta builds for a template).

PARAMSCOPE_RECORD_TEMPLATES: "1" (default) records in a detached process; "wait" records in this process before it
exits (scripts that want the next call to find it, tests); "0" never records. `--debug` records in the process,
so that what failed is shown.

The job is a JSON file in the cache (`<cache>/jobs/`, the user's own, mode 0600): what the build answered from (the
config as read, the class, task and labels, the build dtype). The detached process reads it as any cache entry is
read (a bounded regular file, every field checked), deletes it, rebuilds the class on meta (never remote code: only
a native class is recorded) and records exactly as "wait" does. One job per config at a time: a lock file beside
it, taken with O_EXCL, keeps a second command from starting the same recording while one runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RECORD_ENV = "PARAMSCOPE_RECORD_TEMPLATES"  # "0" | "1" (default: detached) | "wait" (documented in the README)
# in the command's own process ("wait", --debug) a class whose one build took over 2 s is not worth 30–50 more
# builds before the prompt comes back; the detached recorder costs the user no wait, so it takes larger classes
# (Qwen3-235B-A22B's build: about 3 s), within a larger budget
RECORD_BUDGET_S = 30.0
MAX_BUILD_S = 2.0
DETACHED_BUDGET_S = 240.0
DETACHED_MAX_BUILD_S = 8.0
MAX_JOB_BYTES = 16 << 20  # a config is kilobytes; the job holds one
STALE_LOCK_S = 600.0  # a recording that has not finished in 10 minutes died: its lock no longer holds


def record_after_build(report: Any, source: Any, *, model_class: str | None, task: str | None,
                       num_labels: int | None, module: Any = None, build_dtype: str | None = None,
                       debug: bool = False) -> None:
    """After a build answered a config, record what lets the next call answer without torch: the class's template
    when none applies, and with `module` (what memory and flops built, in `build_dtype`) the config's cost facts.
    Detached by default (the module docstring); never fails the command."""
    if (report.model.engine != "build" or report.model.native is not True or source is None
            or getattr(source, "config", None) is None):
        return
    mode = os.environ.get(RECORD_ENV, "1")
    if mode == "0":
        return
    if debug or mode == "wait":
        record_now(report, source, model_class=model_class, task=task, num_labels=num_labels, module=module,
                   build_dtype=build_dtype, debug=debug)
        return
    try:
        _spawn(source, model_class=model_class, task=task, num_labels=num_labels, facts=module is not None,
               build_dtype=build_dtype)
    except (OSError, ValueError, TypeError):  # no cache to write the job to, no process to start: the next call
        pass  # builds again, which is all a missing recording costs


def record_now(report: Any, source: Any, *, model_class: str | None, task: str | None, num_labels: int | None,
               module: Any = None, build_dtype: str | None = None, debug: bool = False,
               detached: bool = False) -> None:
    """Record in this process (quiet unless stderr is a terminal; with `debug`, a recording that failed says so on
    stderr, with its traceback). `detached`: this process is the recorder the command left behind."""
    from .. import progress
    from ..template import lookup_template
    from ..template_record import record_template

    try:
        if (lookup_template(source.config, model_class=model_class, task=task, num_labels=num_labels).template is None
                and not _adopted(report, source, model_class=model_class, task=task, num_labels=num_labels)):
            with progress.status(f"recording a template for {report.model.class_name} (next time: instant; "
                                 "--no-cache skips this)"):
                record_template(source.config, label=source.label, model_class=model_class, task=task,
                                num_labels=num_labels, budget_s=DETACHED_BUDGET_S if detached else RECORD_BUDGET_S,
                                max_build_s=DETACHED_MAX_BUILD_S if detached else MAX_BUILD_S)
        if module is not None:
            from ..cost.facts.record import record_facts

            with progress.status("recording cost facts for this config (next time: instant)"):
                record_facts(source, report, module, build_dtype=build_dtype, model_class=model_class, task=task,
                             num_labels=num_labels)
    except Exception as err:  # broad on purpose: recording rebuilds the class (its own code) and writes files; the
        # answer is already out, and nothing recorded only means the next call builds. --debug shows what failed.
        if debug:
            import traceback

            print(f"paramscope: debug: nothing recorded after the build ({type(err).__name__}: {err}); the next call "
                  "builds again", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)


def _adopted(report: Any, source: Any, **options: Any) -> bool:
    """On a transformers version the package ships no templates for: whether the nearest shipped version's
    template for this class was checked against this build and one at its anchor, and kept (template_adopt.py)."""
    from .. import progress
    from ..template_adopt import adopt_template, nearest_shipped
    from ..disk_cache import installed_transformers_version

    version = installed_transformers_version()
    if version is None or nearest_shipped(version) is None:
        return False
    with progress.status(f"checking the shipped template for {report.model.class_name} on this transformers version"):
        return adopt_template(report, source, **options).kept is not None


# ------------------------------------------------------------------------------------------------ the detached job


def jobs_directory() -> Path:
    from ..disk_cache import cache_root

    return cache_root() / "jobs"


def _spawn(source: Any, *, model_class: str | None, task: str | None, num_labels: int | None, facts: bool,
           build_dtype: str | None) -> subprocess.Popen | None:
    """Write the job and start the detached recorder; None when the same job is already running."""
    job = {"version": 1,
           "source": {"kind": source.kind, "label": source.label, "description": source.description,
                      "path": source.path, "config": source.config},
           "model_class": model_class, "task": task, "num_labels": num_labels, "facts": facts,
           "build_dtype": build_dtype}
    text = json.dumps(job, sort_keys=True)
    name = hashlib.sha256(text.encode()).hexdigest()[:32]
    directory = jobs_directory()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not take_lock(directory / f"{name}.lock"):
        return None
    path = directory / f"{name}.json"
    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(handle, "w", encoding="utf-8") as file:
        file.write(text)
    options: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL,
                               "stderr": subprocess.DEVNULL, "close_fds": True, "cwd": str(directory)}
    if os.name == "nt":
        options["creationflags"] = getattr(subprocess, "DETACHED_PROCESS", 0) | getattr(
            subprocess, "CREATE_NEW_PROCESS_GROUP", 0)
    else:
        options["start_new_session"] = True  # not the terminal's process group: Ctrl-C at the prompt spares it
    return subprocess.Popen([sys.executable, "-m", "paramscope.cli._recording", str(path)], **options)


def take_lock(path: Path) -> bool:
    """Create `path` exclusively; a lock older than STALE_LOCK_S is taken over."""
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return True
        except FileExistsError:
            try:
                if time.time() - path.stat().st_mtime < STALE_LOCK_S:
                    return False
                path.unlink()
            except OSError:
                return False
    return False


def read_job(path: Path) -> dict[str, Any]:
    """The job in `path`, every field checked (OptionError names the first that is wrong)."""
    from ..errors import OptionError
    from ..safe_io import read_json

    job = read_json(path, MAX_JOB_BYTES, error=OptionError, what="recording job", follow_symlinks=False,
                    max_depth=64, max_int_digits=40)
    source = job.get("source") if isinstance(job, dict) else None
    checks = (
        (isinstance(job, dict) and job.get("version") == 1, "version"),
        (isinstance(source, dict) and isinstance(source.get("config"), dict), "source.config"),
        (isinstance(source, dict) and all(isinstance(source.get(k), str) and len(source[k]) <= 4096
                                          for k in ("kind", "label", "description")), "source"),
        (isinstance(source, dict) and (source.get("path") is None or isinstance(source.get("path"), str)),
         "source.path"),
        (all(job.get(k) is None or (isinstance(job[k], str) and len(job[k]) <= 200)
             for k in ("model_class", "task", "build_dtype")), "model_class, task, build_dtype"),
        (job.get("num_labels") is None or (type(job["num_labels"]) is int and 1 <= job["num_labels"] <= 1 << 20),
         "num_labels"),
        (isinstance(job.get("facts"), bool), "facts"),
    )
    for ok, field in checks:
        if not ok:
            raise OptionError("{path}: the recording job's {field} is not valid", path=str(path), field=field)
    return job


def run_job(path: Path) -> int:
    """Read the job, delete it, rebuild the class on meta and record (what "wait" does after a build)."""
    from ..api import inspect_with_module
    from ..sources import Source

    directory = path.parent
    lock = directory / (path.stem + ".lock")
    try:
        job = read_job(path)
        path.unlink(missing_ok=True)
        src = job["source"]
        source = Source(src["kind"], src["label"], src["description"], src["config"], src["path"])
        options = dict(model_class=job["model_class"], task=job["task"], num_labels=job["num_labels"])
        report, module = inspect_with_module(source, dtype=job["build_dtype"], **options)
        if report.model.native is not True:  # never remote code, whatever the job says
            return 2
        record_now(report, source, module=module if job["facts"] else None, build_dtype=job["build_dtype"],
                   detached=True, **options)
        return 0
    finally:
        path.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    from ..errors import ParamscopeError

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m paramscope.cli._recording JOB", file=sys.stderr)
        return 2
    try:
        return run_job(Path(args[0]))
    except ParamscopeError as err:
        print(f"paramscope: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
