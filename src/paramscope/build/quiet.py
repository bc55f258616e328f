"""transformers kept to one line: its logs and warnings off stderr while it reads or builds, and an exception's
first line for an error message."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def quiet_transformers():
    """transformers' log lines and Python warnings stay off stderr: the report carries what matters as notes."""
    import warnings

    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(previous)


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, short: never a C++ backtrace or a multi-line dump."""
    try:
        text = str(err)
    except Exception:  # broad on purpose: an exception's own __str__ (remote code's, torch's) may raise
        text = ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(err).__name__
    if first.endswith(":") and len(lines) > 1:  # "Validation error for field 'x':" says why on the next line
        first = f"{first} {lines[1]}"
    return first if len(first) <= 300 else first[:297] + "..."
