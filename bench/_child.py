"""One fresh child process, timed from the parent, with its peak RSS: what every benchmark here measures."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time


def run_child(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes from the child's ru_maxrss, stdout); a failing child raises RuntimeError.

    stderr goes to a file, so that reading stdout to its end can never stall on a full stderr pipe, and the
    child is reaped with os.wait4, the call that returns its resource usage.
    """
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env)
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise RuntimeError(f"{argv[:6]} failed: {err.read().decode(errors='replace')[-600:]}")
    return wall, usage.ru_maxrss * 1024, out.decode()
