"""Which parameters a pattern names: a role or role group ("embeddings", "attention", "head.classifier") or a glob
over parameter names ("*.layer.1[01].*"), and "the last K blocks".

Used by `memory --training --freeze`, `flops --freeze` and `plan`'s rules, so a pattern means the same everywhere.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from typing import Any, Iterable

from .errors import OptionError


MAX_PATTERN = 500  # characters: a parameter name is under 200


_NEVER_IN_A_NAME = set("()+^$|\\{}")  # regular-expression syntax: no parameter name holds it, no glob needs it


def check_pattern(pattern: str, *, option: str = "freeze") -> None:
    """Refuse, before any build, a pattern that can match no parameter name whatever the model: too long, or a
    regular expression where a glob is meant."""
    text = str(pattern).strip()
    if len(text) > MAX_PATTERN:
        raise OptionError("{0}: a pattern of {length:,} characters; at most {limit} (it begins {start!r})", option,
                          length=len(text), limit=MAX_PATTERN, start=text[:40])
    if set(text) & _NEVER_IN_A_NAME:
        raise OptionError("{0} {text!r} can match no parameter name; patterns are globs, not regular expressions: "
                          "* any run, ? one character, [01] a set (model.layers.1[01].*)", option, text=text[:60])


def match_parameters(params: Iterable[Any], pattern: str, *, option: str = "freeze") -> list[str]:
    """Canonical names of the parameters `pattern` names; raises, listing the roles, when it names none."""
    params = list(params)
    text = str(pattern).strip()
    check_pattern(text, option=option)
    roles = (text, text + "s")  # "embedding" names the "embeddings" roles too
    hits = [p.name for p in params
            if any(p.role == r or p.role.startswith(r + ".") for r in roles) or fnmatch.fnmatchcase(p.name, text)
            or any(fnmatch.fnmatchcase(alias, text) for alias in p.aliases)]
    if not text or not hits:
        groups = sorted({p.role.split(".")[0] for p in params})
        tied = next((alias for p in params for alias in p.aliases), None) if text.startswith("head") else None
        hint = f"; the output head ({tied}) is tied to the input embeddings: name embeddings" if tied else ""
        raise OptionError("{0} {text!r} matches no parameter; give a role ({roles}) or a glob over parameter names "
                          "(model.layers.0.*){hint}", option, text=text[:60], roles=", ".join(groups), hint=hint)
    return hits


def match_all(params: Iterable[Any], patterns: Iterable[str], *, option: str = "freeze") -> list[str]:
    """Sorted canonical names of the parameters any of `patterns` names (each must name one)."""
    params = list(params)
    names: set[str] = set()
    for pattern in patterns:
        names.update(match_parameters(params, pattern, option=option))
    return sorted(names)


def last_blocks(params: Iterable[Any], count: int) -> tuple[list[str], str]:
    """Names of the parameters in the last `count` blocks of the model's longest run of numbered blocks, and a
    description ("model.layers.20–23", or "model.layers.23" for one)."""
    params = list(params)
    prefixes: Counter[str] = Counter()
    indices: dict[str, set[int]] = {}
    for p in params:
        match = re.match(r"^(.*?)\.(\d+)\.", p.name)
        if match:
            prefixes[match.group(1)] += 1
            indices.setdefault(match.group(1), set()).add(int(match.group(2)))
    if not prefixes:
        raise OptionError("{0}: the model has no numbered blocks (layers.0, layer.1, …)", "train_last")
    prefix = max(indices, key=lambda k: (len(indices[k]), prefixes[k]))
    blocks = sorted(indices[prefix])
    if not 1 <= count <= len(blocks):
        raise OptionError("{0} must be between 1 and {blocks} (the blocks of {prefix}), got {count}", "train_last",
                          blocks=len(blocks), prefix=prefix, count=count)
    chosen = set(blocks[-count:])
    names = [p.name for p in params
             if (m := re.match(rf"^{re.escape(prefix)}\.(\d+)\.", p.name)) and int(m.group(1)) in chosen]
    described = f"{prefix}.{blocks[-1]}" if count == 1 else f"{prefix}.{blocks[-count]}–{blocks[-1]}"
    return names, described
