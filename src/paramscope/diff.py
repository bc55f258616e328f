"""Two reports → what was added, removed, reshaped and tied, in exact figures and plain words.

Pure: `diff_reports(a, b)` takes two Reports and returns a frozen `Diff`. Names are aligned across the
base-model prefix, so BertModel's `embeddings.word_embeddings.weight` is BertForMaskedLM's
`bert.embeddings.word_embeddings.weight`. `parse_spec` and `inspect_specs` read the CLI's `MODEL[:CLASS]`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .count import LAYER_INDEX, TiedGroup
from .errors import ModelClassError
from .report import Report
from .roles import ROLES, role_of, role_sort_key

# ---------------------------------------------------------------------------------------------
# MODEL[:CLASS] specs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    text: str  # what the user typed
    model: str
    model_class: str | None = None
    task: str | None = None  # when the part after ':' is a task name (fill-mask, ner, …) rather than a class


_CLASS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_spec(spec: str) -> ModelSpec:
    """`bert-base-uncased:BertForMaskedLM` → (model, class). The part after ':' may also be a task name."""
    text = str(spec).strip()
    if not text:
        raise ModelClassError("empty model spec: expected MODEL or MODEL:CLASS, e.g. bert-base-uncased:BertModel")
    if ":" not in text or Path(text).expanduser().exists():  # a path may contain ':'
        return ModelSpec(text, text)
    model, _, after = text.rpartition(":")
    if not model.strip():
        raise ModelClassError(f"bad model spec {text!r}: nothing before ':' (expected MODEL:CLASS)")
    if not after.strip():
        raise ModelClassError(f"bad model spec {text!r}: no class after ':' (expected MODEL:CLASS, e.g. "
                              f"{model}:BertModel)")
    after = after.strip()
    from .build import TASK_ALIASES, TASKS

    key = after.lower().replace("_", "-")
    if key in TASKS or key in TASK_ALIASES:
        return ModelSpec(text, model.strip(), task=after)
    if not _CLASS_NAME.match(after):
        raise ModelClassError(f"bad model spec {text!r}: {after!r} is neither a class name nor a task")
    return ModelSpec(text, model.strip(), model_class=after)


def inspect_specs(specs: list[str | ModelSpec], *, model_class: str | None = None, task: str | None = None,
                  num_labels: int | None = None, trust_remote_code: bool = False,
                  revision: str | None = None, use_cache: bool = True) -> list[Report]:
    """Inspect several specs. Every config is read and checked before the first build, so that a bad last model
    fails in milliseconds, not after the others were built."""
    from .api import as_source, inspect
    from .build import check_num_labels, validate_config_dict

    check_num_labels(num_labels)
    parsed = [spec if isinstance(spec, ModelSpec) else parse_spec(spec) for spec in specs]
    sources = [as_source(p.model, revision) for p in parsed]
    for source in sources:
        validate_config_dict(source.config)
    reports = []
    for p, source in zip(parsed, sources):
        own = bool(p.model_class or p.task)
        reports.append(inspect(source, model_class=p.model_class if own else model_class,
                               task=p.task if own else task, num_labels=num_labels,
                               trust_remote_code=trust_remote_code, use_cache=use_cache))
    return reports


# ---------------------------------------------------------------------------------------------
# The diff
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    name: str  # the name in its own model
    key: str  # the aligned name (base-model prefix removed)
    shape: tuple[int, ...]
    numel: int
    role: str


@dataclass(frozen=True)
class ShapeChange:
    name: str  # b's name
    a_name: str
    role: str
    from_shape: tuple[int, ...]
    to_shape: tuple[int, ...]
    from_numel: int
    to_numel: int

    @property
    def delta(self) -> int:
        return self.to_numel - self.from_numel


@dataclass(frozen=True)
class Side:
    spec: str  # the label the user gave, e.g. "bert-base-uncased:BertModel"
    class_name: str
    total: int
    with_tied_duplicates: int
    base_model_prefix: str | None


@dataclass(frozen=True)
class Diff:
    a: Side
    b: Side
    added: tuple[Tensor, ...]  # parameters (unique tensors) only b has
    removed: tuple[Tensor, ...]  # parameters only a has
    changed: tuple[ShapeChange, ...]  # same aligned name, different shape
    unchanged: int  # tensors with the same aligned name and shape
    tied_added: tuple[TiedGroup, ...]  # b's tie groups that a does not have
    tied_removed: tuple[TiedGroup, ...]  # a's tie groups that b does not have
    new_ties: tuple[tuple[str, str, int], ...]  # (b alias, b canonical, numel): b reuses a tensor a also has
    clauses: tuple[str, ...]  # the plain-language summary, clause by clause
    delta: int  # b.total - a.total

    @property
    def summary(self) -> str:
        """'the pooler (590,592) is removed; … so it adds nothing' (no clauses: 'no parameter differs')."""
        return "; ".join(self.clauses) if self.clauses else "no parameter differs"

    @property
    def sentence(self) -> str:
        """The summary as a sentence, with the net change."""
        return (f"{_capital(self.summary)}. Net change: {self.delta:+,} "
                f"({self.a.total:,} → {self.b.total:,}).")

    def to_dict(self) -> dict[str, Any]:
        from .report import SCHEMA_VERSION

        return {
            "schema_version": SCHEMA_VERSION,
            "a": _side_dict(self.a),
            "b": _side_dict(self.b),
            "added": [t.name for t in self.added],
            "removed": [t.name for t in self.removed],
            "changed": [{"name": c.name, "a_name": c.a_name, "from": list(c.from_shape), "to": list(c.to_shape),
                         "delta": c.delta} for c in self.changed],
            "tied": {"added": [_tie_dict(t) for t in self.tied_added],
                     "removed": [_tie_dict(t) for t in self.tied_removed]},
            "delta": self.delta,
            "added_params": sum(t.numel for t in self.added),
            "removed_params": sum(t.numel for t in self.removed),
            "changed_params": sum(c.delta for c in self.changed),
            "unchanged_tensors": self.unchanged,
            "summary": self.sentence,
        }


def diff_reports(a: Report, b: Report, *, a_label: str | None = None, b_label: str | None = None) -> Diff:
    """What changes from model `a` to model `b`, parameter by parameter, aligned across base-model prefixes."""
    a_prefix, b_prefix = _prefix(a), _prefix(b)
    a_tensors = _tensors(a, a_prefix)
    b_tensors = _tensors(b, b_prefix)
    a_alias_of = _alias_keys(a, a_prefix)  # alias key → canonical key
    b_alias_of = _alias_keys(b, b_prefix)

    added = tuple(t for k, t in b_tensors.items() if k not in a_tensors)
    removed = tuple(t for k, t in a_tensors.items() if k not in b_tensors)
    changed = []
    unchanged = 0
    for key, tb in b_tensors.items():
        ta = a_tensors.get(key)
        if ta is None:
            continue
        if ta.shape != tb.shape:
            changed.append(ShapeChange(tb.name, ta.name, tb.role, ta.shape, tb.shape, ta.numel, tb.numel))
        else:
            unchanged += 1

    a_groups = {_group_key(g.canonical, g.aliases, a_prefix): g for g in a.tied}
    b_groups = {_group_key(g.canonical, g.aliases, b_prefix): g for g in b.tied}
    tied_added = tuple(g for k, g in b_groups.items() if k not in a_groups)
    tied_removed = tuple(g for k, g in a_groups.items() if k not in b_groups)

    # b's aliases that name a tensor a has too, where a had no such name: b reuses it, adding nothing.
    new_ties = _alias_only_names(b, b_prefix, b_alias_of, b_tensors, set(a_tensors) | set(a_alias_of), a_tensors)
    # a's aliases of a tensor both have, under a name b lacks: they go away and change nothing.
    lost_ties = _alias_only_names(a, a_prefix, a_alias_of, a_tensors, set(b_tensors) | set(b_alias_of), b_tensors)

    clauses = _clauses(added, removed, changed, new_ties, lost_ties, a_alias_of, b_alias_of, a_tensors, b_tensors,
                       _blocks(b, {t.name for t in added}), _blocks(a, {t.name for t in removed}))
    return Diff(
        a=_side(a, a_label, a_prefix),
        b=_side(b, b_label, b_prefix),
        added=added,
        removed=removed,
        changed=tuple(changed),
        unchanged=unchanged,
        tied_added=tied_added,
        tied_removed=tied_removed,
        new_ties=tuple(new_ties),
        clauses=tuple(clauses),
        delta=b.total - a.total,
    )


# ---------------------------------------------------------------------------------------------
# Alignment
# ---------------------------------------------------------------------------------------------


def _prefix(report: Report) -> str | None:
    prefix = getattr(report.model, "base_model_prefix", None)
    if prefix:
        return prefix
    # Fallback for reports made without it: a top-level child that is itself a *Model holding most parameters.
    for child in report.tree.children:
        if child.type.endswith("Model") and child.params * 2 > report.total:
            return child.attr
    return None


def _key(name: str, prefix: str | None) -> str:
    if prefix and name.startswith(prefix + "."):
        return name[len(prefix) + 1:]
    return name


def _tensors(report: Report, prefix: str | None) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for p in report.params:
        key = _key(p.name, prefix)
        if key in out:  # a head name that equals a base-model name once the prefix is gone: keep it whole
            key = p.name
        out[key] = Tensor(p.name, key, p.shape, p.numel, p.role)
    return out


def _alias_keys(report: Report, prefix: str | None) -> dict[str, str]:
    return {_key(alias, prefix): _key(p.name, prefix) for p in report.params for alias in p.aliases}


def _unkey(key: str, report: Report, prefix: str | None) -> str:
    for p in report.params:
        for alias in p.aliases:
            if _key(alias, prefix) == key:
                return alias
    return key


def _group_key(canonical: str, aliases: tuple[str, ...], prefix: str | None) -> frozenset[str]:
    return frozenset(_key(n, prefix) for n in (canonical, *aliases))


def _side(report: Report, label: str | None, prefix: str | None) -> Side:
    return Side(label or f"{report.model.label}:{report.model.class_name}", report.model.class_name,
                report.total, report.parameters.with_tied_duplicates, prefix)


def _side_dict(side: Side) -> dict[str, Any]:
    return {"model": side.spec, "class": side.class_name, "total": side.total,
            "with_tied_duplicates": side.with_tied_duplicates, "base_model_prefix": side.base_model_prefix}


def _alias_only_names(side: Report, prefix: str, alias_of: dict, tensors: dict, other_names: set,
                      other_tensors: dict) -> list[tuple[str, str, int]]:
    """(alias, canonical, numel) for `side`'s aliases that the other model lacks, of a tensor both models have."""
    out = []
    for alias_key, canonical_key in alias_of.items():
        if alias_key in other_names or canonical_key not in other_tensors or canonical_key not in tensors:
            continue
        out.append((_unkey(alias_key, side, prefix), tensors[canonical_key].name, tensors[canonical_key].numel))
    return out


def _tie_dict(tie: TiedGroup) -> dict[str, Any]:
    return {"canonical": tie.canonical, "aliases": list(tie.aliases), "numel": tie.numel, "shape": list(tie.shape)}


# ---------------------------------------------------------------------------------------------
# Plain words
# ---------------------------------------------------------------------------------------------

# role → (noun phrase, plural?)
_PHRASES: dict[str, tuple[str, bool]] = {
    "embeddings.word": ("the word embeddings", True),
    "embeddings.position": ("the position embeddings", True),
    "embeddings.token_type": ("the token-type embeddings", True),
    "embeddings.projection": ("the embedding projection", False),
    "embeddings.norm": ("the embedding LayerNorm", False),
    "attention.query": ("the query projections", True),
    "attention.key": ("the key projections", True),
    "attention.value": ("the value projections", True),
    "attention.qkv": ("the fused query/key/value projections", True),
    "attention.output": ("the attention output projections", True),
    "attention.norm": ("the attention norms", True),
    "cross_attention.query": ("the cross-attention query projections", True),
    "cross_attention.key": ("the cross-attention key projections", True),
    "cross_attention.value": ("the cross-attention value projections", True),
    "cross_attention.output": ("the cross-attention output projections", True),
    "cross_attention.norm": ("the cross-attention norms", True),
    "mlp.gate": ("the MLP gate projections", True),
    "mlp.up": ("the MLP up projections", True),
    "mlp.gate_up": ("the fused MLP gate/up projections", True),
    "mlp.down": ("the MLP down projections", True),
    "mlp.norm": ("the MLP norms", True),
    "moe.router": ("the expert routers", True),
    "moe.experts": ("the routed experts", True),
    "moe.shared_experts": ("the shared experts", True),
    "norm.final": ("the final norm", False),
    "pooler": ("the pooler", False),
    "head.transform": ("the MLM transform", False),
    "head.transform_norm": ("the MLM transform's LayerNorm", False),
    "head.decoder": ("the decoder weight", False),
    "head.bias": ("the vocabulary bias", False),
    "head.lm": ("the language-modelling head", False),
    "head.nsp": ("the next-sentence head", False),
    "head.classifier": ("the classifier", False),
    "head.qa": ("the question-answering span head", False),
}
_MAX_LISTED = 6  # more changed groups than this are summarised by the largest


@dataclass(frozen=True)
class _Group:
    role: str
    names: tuple[str, ...]
    numel: int
    plural: bool
    phrase: str


def _phrase(role: str, names: list[str]) -> tuple[str, bool]:
    if role == "head.transform" and all("pre_classifier" in n for n in names):
        return "the pre-classifier", False
    if role in _PHRASES:
        return _PHRASES[role]
    description = dict(ROLES).get(role)
    if description and role != "other":
        return f"the {description.split(':')[0].split(',')[0]} tensors", True
    return f"the {role} tensors", True


def _layers(names: list[str]) -> str:
    indices = sorted({int(m.group(1)) for n in names for m in [LAYER_INDEX.search(n)] if m})
    if len(indices) <= 1:
        return ""
    if indices == list(range(indices[0], indices[-1] + 1)):
        return f" of layers {indices[0]}–{indices[-1]}"
    return f" of {len(indices)} layers"


def _groups(tensors: list[tuple[str, str, int]]) -> list[_Group]:
    """(name, role, numel) → one group per role, in role order."""
    by_role: dict[str, list[tuple[str, int]]] = {}
    for name, role, numel in tensors:
        by_role.setdefault(role, []).append((name, numel))
    groups = []
    for role in sorted(by_role, key=role_sort_key):
        names = [n for n, _ in by_role[role]]
        phrase, plural = _phrase(role, names)
        groups.append(_Group(role, tuple(names), sum(x for _, x in by_role[role]), plural, phrase + _layers(names)))
    # "the MLM transform (…), its LayerNorm (…)": a norm right after its own transform reads as "its".
    for i in range(1, len(groups)):
        if groups[i].role == "head.transform_norm" and groups[i - 1].role == "head.transform":
            g = groups[i]
            groups[i] = _Group(g.role, g.names, g.numel, g.plural, "its LayerNorm")
    return groups


def _join(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _clause(groups: list[_Group], verb_one: str, verb_many: str) -> str:
    items = [f"{g.phrase} ({g.numel:,})" for g in groups]
    many = len(groups) > 1 or groups[0].plural
    return f"{_join(items)} {verb_many if many else verb_one}"


def _blocks(report: Report, names: set[str]) -> list[tuple[str, set[str]]]:
    """Runs of whole numbered blocks (layers) all of whose parameters are in `names`: (phrase, their names)."""
    from .count import walk

    if not names:
        return []
    runs: list[tuple[str, set[str]]] = []
    for node in walk(report.tree):
        current: list[tuple[int, str, int, set[str]]] = []
        for child in list(node.children) + [None]:
            member = None
            if child is not None and child.attr.isdigit() and child.params:
                inside = {p.name for p in report.params if p.name.startswith(child.name + ".")}
                if inside and inside <= names:
                    member = (int(child.attr), child.type, child.params, inside)
            if member and current and (member[0] != current[-1][0] + 1 or member[1:3] != current[-1][1:3]):
                member, pending = None, member
            else:
                pending = None
            if member:
                current.append(member)
                continue
            if current:
                first, kind, each, _ = current[0]
                last, n = current[-1][0], len(current)
                covered = set().union(*(m[3] for m in current))
                label = f"layer {first}" if n == 1 else f"layers {first}–{last}"
                what = f"a {kind}, {each:,}" if n == 1 else f"{n} × {kind}, {each:,} each = {each * n:,}"
                runs.append((f"{label} ({what})", covered))
                current = []
            if pending:
                current.append(pending)
    return runs


def _block_clause(blocks: list[tuple[str, set[str]]], rest: list[_Group], verb_one: str, verb_many: str) -> str:
    items = [phrase for phrase, _ in blocks] + [f"{g.phrase} ({g.numel:,})" for g in rest]
    many = len(items) > 1 or (not blocks and rest[0].plural) or (blocks and "layers " in blocks[0][0])
    return f"{_join(items)} {verb_many if many else verb_one}"


def _clauses(added, removed, changed, new_ties, lost_ties, a_alias_of, b_alias_of, a_tensors, b_tensors,
             added_blocks, removed_blocks) -> list[str]:
    clauses: list[str] = []
    # Tensors that only change tie status are told as such, not as plain additions and removals.
    untied = [t for t in added if t.key in a_alias_of]
    now_tied = [t for t in removed if t.key in b_alias_of]
    in_removed_blocks = set().union(*(names for _, names in removed_blocks)) if removed_blocks else set()
    in_added_blocks = set().union(*(names for _, names in added_blocks)) if added_blocks else set()
    plain_removed = [t for t in removed if t not in now_tied and t.name not in in_removed_blocks]
    plain_added = [t for t in added if t not in untied and t.name not in in_added_blocks]

    if plain_removed or removed_blocks:
        groups = _groups([(t.name, t.role, t.numel) for t in plain_removed])
        clauses.append(_block_clause(removed_blocks, groups, "is removed", "are removed"))
    if plain_added or added_blocks:
        groups = _groups([(t.name, t.role, t.numel) for t in plain_added])
        clauses.append(_block_clause(added_blocks, groups, "is added", "are added"))
    if changed:
        groups = _groups([(c.name, c.role, c.delta) for c in changed])
        items = []
        for g in groups:
            members = [c for c in changed if c.name in g.names]
            before, after = sum(c.from_numel for c in members), sum(c.to_numel for c in members)
            items.append(f"{g.phrase} ({before:,} → {after:,}, {after - before:+,})")
        if len(items) > _MAX_LISTED:
            before, after = sum(c.from_numel for c in changed), sum(c.to_numel for c in changed)
            ranked = sorted(zip(groups, items), key=lambda gi: -abs(sum(c.delta for c in changed
                                                                          if c.name in gi[0].names)))
            chief = _join([item for _, item in ranked[:3]])
            clauses.append(f"{len(changed)} tensors change shape ({before:,} → {after:,}, {after - before:+,}), "
                           f"chiefly {chief}")
        else:
            many = len(groups) > 1 or groups[0].plural
            clauses.append(f"{_join(items)} {'change' if many else 'changes'} shape")
    if new_ties:
        parts = []
        for alias, canonical, numel in new_ties:
            alias_phrase, _ = _phrase(role_of(alias), [alias])
            canonical_role = next((t.role for t in b_tensors.values() if t.name == canonical), role_of(canonical))
            canonical_phrase, _ = _phrase(canonical_role, [canonical])
            parts.append(f"{alias_phrase} ({numel:,}) is tied to {canonical_phrase}")
        clauses.append(_join(parts) + (", so it adds nothing" if len(parts) == 1 else ", so they add nothing"))
    if lost_ties:
        parts = []
        for alias, canonical, numel in lost_ties:
            alias_phrase, _ = _phrase(role_of(alias), [alias])
            canonical_role = next((t.role for t in a_tensors.values() if t.name == canonical), role_of(canonical))
            parts.append(f"{alias_phrase} ({numel:,}) was tied to {_phrase(canonical_role, [canonical])[0]}")
        many = len(parts) > 1
        clauses.append(_join(parts) + (", so dropping them changes nothing" if many
                                       else ", so dropping it changes nothing"))
    for t in now_tied:
        target = b_tensors.get(b_alias_of[t.key])
        target_phrase = _phrase(target.role, [target.name])[0] if target else b_alias_of[t.key]
        clauses.append(f"{_phrase(t.role, [t.name])[0]} ({t.numel:,}) is now tied to {target_phrase}, "
                       "so it no longer counts")
    for t in untied:
        source = a_tensors.get(a_alias_of[t.key])
        source_phrase = _phrase(source.role, [source.name])[0] if source else a_alias_of[t.key]
        clauses.append(f"{_phrase(t.role, [t.name])[0]} is no longer tied to {source_phrase}: "
                       f"it adds {t.numel:,}")
    return clauses


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]
