"""`paramscope audit PATH`: reconcile a real checkpoint with the architecture, reading headers only."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import (add_cache_option, add_debug_option, add_model_options, add_width_option, checked_width,
                      use_color, write)
from ._recording import record_after_build


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit", help="reconcile a real checkpoint with the architecture, reading headers only",
        description="Reconcile a checkpoint (safetensors, sharded safetensors, or a zip-format PyTorch .bin) "
                    "with the model its config describes: matched, missing, unexpected and non-parameter "
                    "tensors, shape mismatches, dtypes and bytes. A GGUF file, shard set or folder is reported "
                    "from its header alone: ggml types, exact bytes, metadata, parameters and bits per weight by "
                    "role. Only headers are read.")
    parser.add_argument("path", metavar="PATH_OR_ID",
                        help="checkpoint file (.safetensors, .bin, .gguf or any shard of a set), model directory, "
                             "Hugging Face cache folder, or hub id (read from the local cache, else its safetensors "
                             "headers from the Hub)")
    parser.add_argument("--config", metavar="MODEL",
                        help="the model to compare with (preset, config.json, directory, hub id); default: the "
                             "config.json next to the checkpoint")
    add_model_options(parser)
    add_cache_option(parser)
    add_debug_option(parser)
    parser.add_argument("--json", action="store_true", help="print the model's JSON report plus \"checkpoint\"")
    parser.add_argument("--all", action="store_true", dest="all_rows", help="list every key, not the first 20")
    add_width_option(parser)


def run(args: argparse.Namespace) -> int:
    from ..audit import audit
    from ..render.audit import iter_audit_json, iter_audit_text

    width = None if args.json else checked_width(args)  # bad options fail before any build
    gguf = _gguf_target(args)
    if gguf is not None:
        return _run_gguf(args, gguf, width)
    result = audit(args.path, config=args.config, model_class=args.model_class, task=args.task,
                   num_labels=args.num_labels, trust_remote_code=args.trust_remote_code, revision=args.revision,
                   use_cache=not args.no_cache)
    if args.json:
        for piece in iter_audit_json(result):  # a million findings are written as they are formatted
            write(piece)
        write("\n")
    else:
        for piece in iter_audit_text(result, width, color=use_color(), all_keys=args.all_rows):
            write(piece)
    if not args.no_cache and not args.trust_remote_code:
        # after a build, a template: the next audit (or inspect) of this class answers without torch
        record_after_build(result.report, result.source, model_class=args.model_class, task=args.task,
                           num_labels=args.num_labels, debug=args.debug)
    return 0


def _gguf_target(args: argparse.Namespace) -> Any:
    """The GGUF file, shard or folder `args.path` names, or None when it is no GGUF checkpoint (nor a local path)."""
    from pathlib import Path

    from ..audit import locate_checkpoint
    from ..checkpoint.gguf_read import is_gguf_path

    path = Path(args.path.strip()).expanduser()
    if not args.path.strip() or not (path.exists() or path.is_symlink()):
        return None
    target = locate_checkpoint(str(path), revision=args.revision).checkpoint if path.is_dir() else path
    return target if is_gguf_path(target) else None


def _run_gguf(args: argparse.Namespace, target: Any, width: int | None) -> int:
    from ..checkpoint.gguf_read import read_gguf
    from ..errors import OptionError
    from ..render.gguf import render_gguf_json, render_gguf_text

    if args.config is not None:
        raise OptionError("{0}: a GGUF checkpoint is reconciled with the class built from its own metadata; "
                          "reconciling it with another model is not supported yet (`paramscope audit {path}`)",
                          "config", path=args.path)
    checkpoint = read_gguf(target)
    reconciliation = _reconcile_gguf(args, checkpoint)
    if args.json:
        write(render_gguf_json(checkpoint, reconciliation))
    else:
        write(render_gguf_text(checkpoint, width or 100, all_tensors=args.all_rows, reconciliation=reconciliation))
    return 0


def _reconcile_gguf(args: argparse.Namespace, checkpoint: Any) -> Any:
    """The file against the transformers class built from its metadata; "cannot reconcile: why" where no class is
    built (an architecture transformers does not map, a header whose layers its tensors do not hold)."""
    from ..api import inspect_source
    from ..checkpoint.gguf_reconcile import cannot_reconcile, reconcile_gguf
    from ..errors import ParamscopeError
    from ..sources import gguf_source

    try:
        source = gguf_source(checkpoint, args.path)
        report, _ = inspect_source(source, model_class=args.model_class, task=args.task, num_labels=args.num_labels,
                                   use_cache=not args.no_cache)
    except ParamscopeError as err:
        why = str(err).removeprefix(f"{checkpoint.path}: ").removeprefix("cannot build a model from this GGUF: ")
        return cannot_reconcile(checkpoint, "-", why)
    return reconcile_gguf(checkpoint, report.params, report.model.class_name,
                          int(source.config["num_hidden_layers"]))
