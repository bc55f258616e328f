"""What the command modules share: argparse options that several commands take, and writing to the terminal.

It imports only paramscope.errors, so every command module can import it without a circle.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..errors import ParamscopeError


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
        raise ParamscopeError(f"--width must be 20 or more, got {args.width}")
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


RECORD_ENV = "PARAMSCOPE_RECORD_TEMPLATES"  # "0": never record templates after a build (documented in the README)
RECORD_BUDGET_S = 30.0
_RECORD_AFTER_BUILD_S = 2.0  # a class whose one build took longer is not worth 30–50 more builds here


def record_after_build(report: Any, source: Any, *, model_class: str | None, task: str | None,
                       num_labels: int | None, module: Any = None, build_dtype: str | None = None,
                       debug: bool = False) -> None:
    """After a build answered a config, record what lets the next call answer without torch: the class's template
    when none applies, and with `module` (what memory and flops built, in `build_dtype`) the config's cost facts.
    Quiet unless stderr is a terminal; never fails the command. With `debug` (--debug), a recording that failed
    says so on stderr, with its traceback."""
    if (report.model.engine != "build" or report.model.native is not True or source is None
            or os.environ.get(RECORD_ENV, "1") == "0"):
        return
    from .. import progress
    from ..template import lookup_template
    from ..template_record import record_template

    try:
        if lookup_template(source.config, model_class=model_class, task=task, num_labels=num_labels).template is None:
            with progress.status(f"recording a template for {report.model.class_name} (next time: instant; "
                                 "--no-cache skips this)"):
                record_template(source.config, label=source.label, model_class=model_class, task=task,
                                num_labels=num_labels, budget_s=RECORD_BUDGET_S, max_build_s=_RECORD_AFTER_BUILD_S)
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


def write_report_json(report: Any, **objects: Any) -> None:
    """The inspect document (docs/json-schema.md) with each command's own objects ("memory", "plan", …) added;
    None values are left out."""
    import json

    from ..render.json import report_to_dict

    document = report_to_dict(report)
    document.update({key: value for key, value in objects.items() if value is not None})
    write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def add_html_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--html", metavar="FILE",
                        help="write a self-contained interactive HTML report to FILE ('-': stdout) instead of the "
                             "text; works offline")


def checked_html_path(args: argparse.Namespace) -> str | None:
    """--html's FILE, checked before any work: its folder exists and it is not a folder itself."""
    path = getattr(args, "html", None)
    if path is None or path == "-":
        return path
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ParamscopeError(f"--html: no such folder for {path!r}")
    if os.path.isdir(path):
        raise ParamscopeError(f"--html: {path!r} is a folder, not a file")
    return path


def write_html_page(page: str, path: str) -> None:
    """The page to `path` (or stdout for '-'); one line on stderr says where it went."""
    if path == "-":
        write(page)
        return
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(page)
    except OSError as err:
        raise ParamscopeError(f"--html: cannot write {path!r}: {err.strerror}") from None
    print(f"paramscope: wrote {path} ({len(page.encode('utf-8')) / 1e6:.1f} MB; open it in any browser, "
          "it needs no network)", file=sys.stderr)
