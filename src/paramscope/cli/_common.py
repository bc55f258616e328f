"""What the command modules share: argparse options that several commands take, and writing to the terminal.

It imports only paramscope.errors, so every command module can import it without a circle.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from typing import Any

from ..errors import OptionError, ParamscopeError, short_repr


def add_model_options(parser: argparse.ArgumentParser, *, remote_code: bool = True) -> None:
    """--class, --task, --num-labels, --trust-remote-code (unless remote_code is False) and --revision."""
    parser.add_argument("--class", dest="model_class", metavar="NAME",
                        help="build this transformers class (default: the config's architectures[0])")
    parser.add_argument("--task", metavar="TASK",
                        help="build the head for a task: text-classification, token-classification, fill-mask, "
                             "question-answering, text-generation, … or sentiment, topic, spam, intent, ner, pos, "
                             "chunking")
    parser.add_argument("--num-labels", type=int, metavar="K", help="number of labels of a classification head")
    add_source_options(parser, remote_code=remote_code)


def add_source_options(parser: argparse.ArgumentParser, *, remote_code: bool = True) -> None:
    """--trust-remote-code (unless remote_code is False) and --revision: where a model comes from."""
    if remote_code:
        parser.add_argument("--trust-remote-code", action="store_true",
                            help="allow executing model code named by the config's auto_map (off by default)")
    parser.add_argument("--revision", metavar="REV", help="hub revision (branch, tag or commit)")


def add_debug_option(parser: argparse.ArgumentParser) -> None:
    """--debug after the command too; SUPPRESS keeps the top-level --debug when it is not given here."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_width_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--width", type=int, metavar="COLS", help="output width (default: the terminal's)")


def checked_width(args: argparse.Namespace) -> int:
    """--width, at least 20, else the terminal's width."""
    if args.width is not None and args.width < 20:
        raise OptionError(f"--width must be 20 or more, got {args.width}")
    return args.width or terminal_width()


def use_color() -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty()


def terminal_width() -> int:
    if sys.stdout.isatty():
        return os.get_terminal_size(sys.stdout.fileno()).columns
    return int(os.environ.get("COLUMNS", 100))


def write(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `paramscope inspect … | head` is normal use
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def add_cache_option(parser: argparse.ArgumentParser, *, costs: bool = False) -> None:
    """--no-cache; `costs`: the command also answers from (and records) a config's cost facts."""
    what = "a structure template or cost facts" if costs else "a structure template"
    parser.add_argument("--no-cache", action="store_true",
                        help=f"build the class on meta: neither answer from nor record {what}")


# The library's errors name options as its Python parameters (`model_class`); the CLI spells them as its flags.
_FLAGS = {"model_class": "--class"}


def flag_of(option: str) -> str:
    """The command-line flag for a library option: `batch` → `--batch`, `model_class` → `--class`."""
    return _FLAGS.get(option, "--" + option.replace("_", "-"))


def write_report_json(report: Any, **objects: Any) -> None:
    """The inspect document (docs/json-schema.md) with each command's own objects ("memory", "plan", …) added;
    None values are left out."""
    import json

    from ..render.json import report_to_dict

    document = report_to_dict(report)
    document.update({key: value for key, value in objects.items() if value is not None})
    write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


MIN_SIZE = 1 << 20  # a budget or reserve under 1 MiB is a typo (`--budget 24` for 24 GiB), not a device


def checked_size(flag: str, text: str | None, *, zero: bool = False) -> int | None:
    """A memory size given to `flag` ("24GiB", "80GB"), in bytes: a unit is required (a bare `24` is 24 bytes to
    the library, never what a user meant) and so is at least 1 MiB; `zero`: a plain 0 means none."""
    if text is None:
        return None
    from ..cost.dtypes import parse_bytes

    stripped = str(text).strip()
    if zero and stripped in ("0", "0B"):
        return 0
    shown = short_repr(str(text), 40)
    if stripped.startswith("-"):
        raise OptionError(f"{flag} must be a positive size, got {shown} (for example 24GiB)")
    if re.fullmatch(r"[0-9.]{1,20}", stripped):
        raise OptionError(f"{flag} needs a unit: {shown} would be {stripped} bytes; write {stripped}GiB, "
                              f"{stripped}GB or {stripped}MiB")
    try:
        value = parse_bytes(stripped)
    except ParamscopeError:
        raise OptionError(f"{flag}: not a memory size: {shown} (examples: 24GiB, 80GB, 512MiB)") from None
    if value < MIN_SIZE:
        raise OptionError(f"{flag} must be at least 1MiB, got {shown} ({value:,} bytes)")
    return value


def add_layout_options(parser: argparse.ArgumentParser, title: str, helps: dict[str, str]) -> Any:
    """The multi-GPU layout flags memory and flops share (--dp --tp --sp --pp --micro-batches --schedule
    --virtual-stages --cp --ep): one set of names, types, defaults and metavars; `helps` (by flag, without the
    dashes) says what each degree does to the command's figures, the pipeline's microbatches and chunks said once
    here. Returns the argument group (memory adds --shard-group to it)."""
    helps = {"micro-batches": "microbatches a step under --pp (default: the batch, one sequence each)",
             "virtual-stages": "interleaved schedule: layer chunks a device holds (V ≥ 2; default 1, no interleaving)",
             **helps}
    group = parser.add_argument_group(title)
    group.add_argument("--dp", type=int, metavar="N", help=helps["dp"])
    group.add_argument("--tp", type=int, default=1, metavar="T", help=helps["tp"])
    group.add_argument("--sp", action="store_true", help=helps["sp"])
    group.add_argument("--pp", type=int, default=1, metavar="P", help=helps["pp"])
    group.add_argument("--micro-batches", type=int, metavar="M", help=helps["micro-batches"])
    group.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved"), help=helps["schedule"])
    group.add_argument("--virtual-stages", type=int, default=1, metavar="V", help=helps["virtual-stages"])
    group.add_argument("--cp", type=int, default=1, metavar="C", help=helps["cp"])
    # a bare --ep (0) is serving's: vLLM's --enable-expert-parallel, its size the tensor-parallel group's
    group.add_argument("--ep", type=int, nargs="?", const=0, default=1, metavar="E", help=helps["ep"])
    return group


def add_html_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--html", metavar="FILE",
                        help="write a self-contained interactive HTML report to FILE ('-': stdout) instead of the "
                             "text; works offline")


def checked_html_path(args: argparse.Namespace) -> str | None:
    """--html's FILE, checked before any work, with stat alone (nothing is opened): its folder exists, and it is a
    regular file or none yet. A FIFO (opening it would wait for a reader for ever), a device, a folder, a socket, a
    link to nothing and a name holding a control character get one line each. '-' is stdout, and /dev/null (or a
    link to it) is taken too: the page is made and discarded, as `-o /dev/null` is in curl or gcc."""
    path = getattr(args, "html", None)
    if path is None or path == "-":
        return path
    control = next((c for c in path if ord(c) < 32 or ord(c) == 127), None)
    if control is not None:  # legal on Linux, but no one means it, and the "wrote …" line would break in two
        raise OptionError(f"--html: the file name {short_repr(path, 80)} holds a control character "
                              f"({short_repr(control)}); give a plain name")
    if len(os.path.basename(path).encode("utf-8", "surrogateescape")) > 255:
        raise OptionError(f"--html: the file name {short_repr(path, 80)} is longer than 255 bytes")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OptionError(f"--html: no such folder for {path!r}")
    if os.path.isdir(path):
        raise OptionError(f"--html: {path!r} is a folder, not a file")
    if os.path.lexists(path):
        kind = _file_kind(path)
        if kind != "a regular file" and not _is_devnull(path):
            raise OptionError(f"--html: {short_repr(path, 80)} is {kind}; --html writes a regular file (or '-' for "
                              "stdout)")
    return path


def _is_devnull(path: str) -> bool:
    """Whether `path` is the null device (/dev/null, or a link to it), by stat alone."""
    import stat

    try:
        seen, null = os.stat(path), os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(seen.st_mode) and stat.S_ISCHR(null.st_mode) and seen.st_rdev == null.st_rdev


def _file_kind(path: str) -> str:
    """What is at `path`, in words ('a regular file', 'a FIFO', …), following links; never opens it."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a symbolic link to nothing" if os.path.islink(path) else "gone"
    except OSError as err:
        return f"unreadable ({err.strerror})"
    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def write_html_page(page: str, path: str) -> None:
    """The page to `path` (or stdout for '-'); one line on stderr says where it went."""
    if path == "-":
        write(page)
        return
    size = f"{len(page.encode('utf-8')) / 1e6:.1f} MB"
    if _is_devnull(path):
        print(f"paramscope: the page ({size}) went to {path}, which discards it", file=sys.stderr)
        return
    existed = os.path.lexists(path)
    try:
        # non-blocking: a FIFO that appeared since the check fails at once (no reader) instead of waiting for one
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                             0o666)
        import stat

        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            os.close(descriptor)
            raise OptionError(f"--html: {short_repr(path, 80)} is {_file_kind(path)}; --html writes a regular file "
                              "(or '-' for stdout)")
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(page)
    except OSError as err:
        if not existed and os.path.isfile(path):  # a disk that filled up leaves no half page behind
            with contextlib.suppress(OSError):
                os.remove(path)
        raise OptionError(f"--html: cannot write {path!r}: {err.strerror}") from None
    print(f"paramscope: wrote {path} ({size}; open it in any browser, it needs no network)", file=sys.stderr)
