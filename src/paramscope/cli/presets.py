"""`paramscope presets`: the embedded presets, by name with their aliases."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ._common import write


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("presets", help="list the embedded presets")
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from ..presets import all_presets

    presets = all_presets()
    if args.json:
        write(json.dumps([{"name": p.name, "aliases": list(p.aliases)} for p in presets], indent=2) + "\n")
        return 0
    width = max(len(p.name) for p in presets)
    for preset in presets:
        write(f"{preset.name:<{width}}  {', '.join(preset.aliases)}\n")
    return 0
