"""Reconcile the numbers people see for one model: unique, with tied duplicates, other tools' conventions,
and a checkpoint's element count, each in exact figures with the reason it differs from the unique count.

torchinfo 1.8's total is reproduced here from its algorithm (torchinfo/torchinfo.py `apply_hooks`,
layer_info.py `leftover_params`, model_statistics.py `ModelStatistics.__init__`) without importing torchinfo:

1. Without input data, `summary(model)` lists every module depth-first through `_modules`, shared modules at each
   place they appear; a module already listed is marked *recursive* and skipped by the totals.
2. Each module's `num_params` is the sum over its own `named_parameters()`, which removes duplicates only *within
   that module's subtree*.
3. A leaf adds `num_params`; a container adds `max(leftover, 0)`, where leftover is its `num_params` minus, over
   *all* its listed descendants that are not recursive, the leaf's `num_params` or the container's leftover.

So a tensor reached through two different leaves (an MLM decoder tied to the word embeddings) is counted twice,
while one shared inside a single module (the decoder bias, another name of the MLM head's bias) is counted once.
The per-tensor multiplicities below follow from the same sums, so the explanation names every tensor counted twice.
Not reproduced: lazy parameters (skipped, as torchinfo does), pruning masks (`*_orig` with a `*_mask` buffer:
torchinfo counts the mask's ones, which a meta build cannot know), and summaries *with* input data, which list
only the modules that run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .frozen import FrozenDict, freeze_fields, thaw
from .report import Report


@dataclass(frozen=True)
class TorchinfoCount:
    total: int
    trainable: int
    counted_twice: tuple[tuple[str, int, int], ...]  # (parameter name, numel, times counted) for times > 1
    not_counted: tuple[tuple[str, int], ...]  # tensors torchinfo leaves out (times == 0)
    pruned: tuple[str, ...] = ()  # *_orig parameters with a mask: counted in full here, by the mask in torchinfo


@dataclass(frozen=True)
class CountLine:
    key: str  # stable JSON key
    label: str
    value: int | None  # None when it cannot be computed without the live module
    explanation: str


@dataclass(frozen=True)
class CountsExplanation:
    model: str
    class_name: str
    unique: int
    with_tied_duplicates: int
    buffers: int
    persistent_buffers: int
    torchinfo: TorchinfoCount | None
    exclude_embeddings: int | None
    lines: tuple[CountLine, ...]
    checkpoint: FrozenDict[str, Any] | None = field(default=None)

    def __post_init__(self) -> None:
        freeze_fields(self, "checkpoint")

    def value(self, key: str) -> int | None:
        return next(line.value for line in self.lines if line.key == key)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {line.key: line.value for line in self.lines}
        out["explanations"] = {line.key: line.explanation for line in self.lines}
        if self.torchinfo is not None:
            out["torchinfo_counted_twice"] = [{"name": n, "numel": x, "times": t}
                                              for n, x, t in self.torchinfo.counted_twice]
        if self.checkpoint is not None:
            out["checkpoint"] = thaw(self.checkpoint)
        return out


# ---------------------------------------------------------------------------------------------
# torchinfo 1.8
# ---------------------------------------------------------------------------------------------


@dataclass
class _Entry:
    module: Any
    depth: int
    leaf: bool
    recursive: bool
    num: dict[int, int]  # tensor id → 1, for the module's deduplicated named_parameters()
    trainable: set[int]


def torchinfo_count(module: Any) -> TorchinfoCount:
    """`torchinfo.summary(module).total_params` (and trainable) of torchinfo 1.8, called without input data."""
    numel: dict[int, int] = {}
    names: dict[int, str] = {}
    for name, param in module.named_parameters():
        names.setdefault(id(param), name)
    pruned: list[str] = []

    entries: list[_Entry] = []
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(module, 0)]
    while stack:
        mod, depth = stack.pop()
        num: dict[int, int] = {}
        trainable: set[int] = set()
        for name, param in mod.named_parameters():
            if type(param).__name__ == "UninitializedParameter":  # torchinfo skips lazy parameters
                continue
            if name.endswith("_orig") and _has_mask(mod, name[:-5]):
                pruned.append(name)
            numel[id(param)] = int(param.numel())
            num[id(param)] = 1
            if param.requires_grad:
                trainable.add(id(param))
        entries.append(_Entry(mod, depth, not any(True for _ in mod.children()), id(mod) in seen, num, trainable))
        seen.add(id(mod))
        stack += [(child, depth + 1) for _, child in reversed(mod._modules.items()) if child is not None]

    # Bottom-up: each container's leftover, as a signed multiset of tensors.
    leftover: list[dict[int, int] | None] = [None] * len(entries)
    for i in range(len(entries) - 1, -1, -1):
        entry = entries[i]
        if entry.leaf:
            continue
        vec = dict(entry.num)
        j = i + 1
        while j < len(entries) and entries[j].depth > entry.depth:
            child = entries[j]
            if not child.recursive:
                for key, times in (child.num if child.leaf else leftover[j]).items():
                    vec[key] = vec.get(key, 0) - times
            j += 1
        leftover[i] = vec

    trainable_ids = {k for e in entries for k in e.trainable}
    total = trainable_total = 0
    multiplicity: dict[int, int] = {}
    for i, entry in enumerate(entries):
        if entry.recursive:
            continue
        vec = entry.num if entry.leaf else leftover[i]
        value = sum(numel[k] * t for k, t in vec.items())
        trainable_value = sum(numel[k] * t for k, t in vec.items() if k in trainable_ids)
        if value > 0:
            total += value
            for key, times in vec.items():
                multiplicity[key] = multiplicity.get(key, 0) + times
        trainable_total += max(trainable_value, 0)

    twice = tuple((names.get(k, "?"), numel[k], t) for k, t in multiplicity.items() if t > 1)
    missed = tuple((names[k], numel[k]) for k in names if multiplicity.get(k, 0) == 0 and numel.get(k))
    return TorchinfoCount(total, trainable_total, twice, missed, tuple(pruned))


def _has_mask(module: Any, stem: str) -> bool:
    target = module
    for part in f"{stem}_mask".split("."):
        if not hasattr(target, part):
            return False
        target = getattr(target, part)
    return True


# ---------------------------------------------------------------------------------------------
# The reconciliation
# ---------------------------------------------------------------------------------------------


def reconcile_counts(report: Report, module: Any = None, *, checkpoint: Any = None,
                     audit: Any = None) -> CountsExplanation:
    """Every count of `report`'s model, with the reason each differs from the unique count.

    `module` (the live or meta module) is needed for torchinfo's and transformers' conventions; `checkpoint`
    (a paramscope.checkpoint.Checkpoint) and its `audit` add the checkpoint's element count.
    """
    unique = report.total
    lines: list[CountLine] = [CountLine(
        "unique", "unique parameters", unique,
        "every tensor once, by identity: what paramscope reports and what transformers' num_parameters() "
        "and sum(p.numel() for p in model.parameters()) give",
    )]

    alias_terms = [(alias, g.canonical, g.numel) for g in report.tied for alias in g.aliases]
    dup = report.parameters.with_tied_duplicates
    if alias_terms:
        terms = " + ".join(f"{numel:,} ({alias} = {canonical})" for alias, canonical, numel in alias_terms)
        why = (f"{unique:,} + {terms}: a sum over every parameter name, named_parameters(remove_duplicate=False), "
               "counts each tied tensor once per name")
    else:
        why = "no tensor has a second name, so a sum over every name equals the unique count"
    lines.append(CountLine("with_tied_duplicates", "with tied duplicates", dup, why))

    ti = None
    if module is not None:
        ti = torchinfo_count(module)
        lines.append(CountLine("torchinfo_1_8", "torchinfo 1.8 summary()", ti.total, _torchinfo_words(ti, unique,
                                                                                                        alias_terms)))
    else:
        lines.append(CountLine("torchinfo_1_8", "torchinfo 1.8 summary()", None,
                               "needs the module itself (paramscope builds it on the meta device)"))

    excluded_value = None
    if module is not None:
        from .conventions import exclude_embeddings

        known = _convention(report, "exclude_embeddings_transformers")
        excluded_value = known.value if known is not None else exclude_embeddings(module, report.params)[0]
        excluded = _embedding_weights(module)
        removed = unique - excluded_value
        listed = ", ".join(f"{name} {numel:,}" for name, numel in excluded) or "none"
        words = (f"model.num_parameters(exclude_embeddings=True) = {unique:,} − {removed:,}: it leaves out the "
                 f".weight of every nn.Embedding module, by its first name ({listed})")
        tied_heads = [a for a, c, _ in alias_terms if c in {name for name, _ in excluded}]
        if tied_heads:
            words += f"; {', '.join(tied_heads)}, tied to an embedding, goes with it"
        lines.append(CountLine("exclude_embeddings", "exclude_embeddings (transformers)",
                               excluded_value, words))
    else:
        known = _convention(report, "exclude_embeddings_transformers")
        excluded_value = None if known is None else known.value
        lines.append(CountLine("exclude_embeddings", "exclude_embeddings (transformers)", excluded_value,
                               "needs the module itself" if known is None else known.definition))
    # The other named conventions the report carries (nanoGPT's non-embedding count, with/without LM head).
    for convention in getattr(report, "conventions", ()):
        if convention.key != "exclude_embeddings_transformers":
            lines.append(CountLine(convention.key, convention.label, convention.value, convention.definition))

    buffers = report.parameters.buffers
    persistent = sum(b.numel for b in report.buffers if b.persistent)
    buffer_names = ", ".join(b.name for b in report.buffers) or "none"
    lines.append(CountLine(
        "buffers", "buffers (not parameters)", buffers,
        f"tensors the model keeps but does not train ({buffer_names}); {persistent:,} of them are persistent, "
        "i.e. saved in its state_dict",
    ))
    lines.append(CountLine(
        "state_dict_elements", "state_dict() elements", dup + persistent,
        f"{dup:,} parameter elements under every name + {persistent:,} persistent buffer elements; "
        "save_pretrained writes each tied tensor once, so a saved file holds fewer",
    ))

    checkpoint_info = None
    if checkpoint is not None:
        checkpoint_info, more = _checkpoint_lines(checkpoint, audit, unique)
        lines.extend(more)

    return CountsExplanation(
        model=report.model.label,
        class_name=report.model.class_name,
        unique=unique,
        with_tied_duplicates=dup,
        buffers=buffers,
        persistent_buffers=persistent,
        torchinfo=ti,
        exclude_embeddings=excluded_value,
        lines=tuple(lines),
        checkpoint=checkpoint_info,
    )


def explain_counts(model: Any, *, model_class: str | None = None, task: str | None = None,
                   num_labels: int | None = None, trust_remote_code: bool = False,
                   revision: str | None = None) -> tuple[Report, CountsExplanation]:
    """Inspect `model` and reconcile its counts (one meta build serves both)."""
    from .api import inspect_with_module

    report, module = inspect_with_module(model, model_class=model_class, task=task, num_labels=num_labels,
                                         trust_remote_code=trust_remote_code, revision=revision)
    return report, reconcile_counts(report, module)


def meta_module(model: Any, *, model_class: str | None = None, task: str | None = None,
                num_labels: int | None = None, trust_remote_code: bool = False, revision: str | None = None):
    """The module `paramscope.inspect` counts, built on the meta device (a live module is returned as is)."""
    from .api import inspect_with_module

    return inspect_with_module(model, model_class=model_class, task=task, num_labels=num_labels,
                               trust_remote_code=trust_remote_code, revision=revision)[1]


def _convention(report: Report, key: str):
    return next((c for c in getattr(report, "conventions", ()) if c.key == key), None)


def _embedding_weights(module: Any) -> list[tuple[str, int]]:
    """The (name, numel) of the tensors num_parameters(exclude_embeddings=True) leaves out."""
    from .conventions import embedding_weight_names

    names = embedding_weight_names(module)
    return [(name, int(p.numel())) for name, p in module.named_parameters() if name in names]


def _torchinfo_words(ti: TorchinfoCount, unique: int, alias_terms) -> str:
    extra = ti.total - unique
    head = "sums parameters module by module and removes duplicates only inside one module"
    if not extra and not ti.counted_twice:
        return f"equal to the unique count: it {head}, and no tensor is reached through two different modules"
    parts = []
    for name, numel, times in ti.counted_twice:
        other = next((f"the same tensor as {c}" for a, c, _ in alias_terms if c == name),
                     None) or next((f"another name of {c}" for a, c, _ in alias_terms if a == name), None)
        alias = next((a for a, c, _ in alias_terms if c == name), None)
        who = f"{alias} ({other})" if alias else name
        parts.append(f"{who} is counted {'twice' if times == 2 else f'{times} times'} ({numel:,} each)")
    once = [a for a, c, _ in alias_terms if not any(n == c for n, _, _ in ti.counted_twice)]
    sentence = f"{unique:,} {'+' if extra >= 0 else '−'} {abs(extra):,}: it {head}"
    if parts:
        sentence += "; " + "; ".join(parts)
    if once:
        sentence += f"; {', '.join(once)} {'is' if len(once) == 1 else 'are'} counted once (shared within one module)"
    if ti.not_counted:
        sentence += "; not counted at all: " + ", ".join(n for n, _ in ti.not_counted)
    return sentence


def _checkpoint_lines(checkpoint: Any, audit: Any, unique: int) -> tuple[dict[str, Any], list[CountLine]]:
    elements = int(checkpoint.elements)
    info: dict[str, Any] = {"path": checkpoint.path, "format": checkpoint.format, "elements": elements,
                            "bytes": int(checkpoint.nbytes)}
    lines = []
    if audit is None:
        lines.append(CountLine("checkpoint_elements", "checkpoint elements", elements,
                               f"every stored element of {len(checkpoint.tensors)} tensors, buffers included"))
        return info, lines
    non_param = sum(math.prod(f.shape) for f in audit.non_parameters)
    unexpected = sum(math.prod(f.shape) for f in audit.unexpected)
    mismatched = sum(math.prod(m.checkpoint_shape) for m in audit.mismatched)
    missing = sum(math.prod(f.shape) for f in audit.missing)
    provided = int(audit.parameters)
    packed = [t for t in checkpoint.tensors if getattr(t, "role", "") == "packed"]
    info.update({"parameters": provided, "non_parameter_elements": non_param, "unexpected_elements": unexpected,
                 "mismatched_elements": mismatched, "missing_parameters": missing})
    terms = [f"{provided:,} model parameters"]
    if non_param:
        names = ", ".join(f.name for f in audit.non_parameters[:4]) + (" …" if len(audit.non_parameters) > 4 else "")
        terms.append(f"{non_param:,} in non-parameters ({names})")
    if unexpected:
        terms.append(f"{unexpected:,} in tensors the model does not use")
    if mismatched:
        terms.append(f"{mismatched:,} in tensors of the wrong shape")
    rest = elements - provided - non_param - unexpected - mismatched
    if rest:
        terms.append(f"{rest:,} stored differently (packed or duplicate tensors)" if packed or rest > 0
                     else f"{rest:,} (tensors stored once for several model names)")
    explanation = " + ".join(terms)
    if missing:
        explanation += f"; {missing:,} of the model's {unique:,} parameters are missing (newly initialised)"
    lines.append(CountLine("checkpoint_elements", "checkpoint elements", elements, f"{elements:,} = {explanation}"))
    lines.append(CountLine("checkpoint_parameters", "checkpoint parameters", provided,
                           f"unique model parameters the checkpoint provides (of {unique:,})"))
    return info, lines
