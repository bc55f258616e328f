"""What a task head adds, with its arithmetic, and typical label counts per use case.

Pure functions of a Report: the head parts are the parameters whose role is `head.*`, plus the head names
that are only aliases of another tensor (an MLM decoder tied to the word embeddings adds nothing).

Label counts are *suggestions* and are never applied: the head paramscope builds always has the config's
`num_labels` (transformers' default is 2), or `--num-labels K`, which always wins. A suggestion only tells
the user which K a typical dataset for their use case needs, and what the head would then cost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .report import Report
from .roles import role_of

# ---------------------------------------------------------------------------------------------
# Label-count suggestions (never applied automatically)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabelSuggestion:
    use_case: str
    num_labels: int
    dataset: str  # the typical dataset the figure comes from, and what the labels are


LABEL_SUGGESTIONS: dict[str, LabelSuggestion] = {
    s.use_case: s
    for s in (
        LabelSuggestion("sentiment", 2, "SST-2 / IMDb: positive, negative"),
        LabelSuggestion("topic", 4, "AG News: World, Sports, Business, Sci/Tech"),
        LabelSuggestion("spam", 2, "SMS Spam Collection: spam, ham"),
        LabelSuggestion("intent", 7, "SNIPS: 7 intents (ATIS has 26, CLINC150 has 151)"),
        LabelSuggestion("ner", 9, "CoNLL-2003: O plus B-/I- for PER, ORG, LOC, MISC"),
        LabelSuggestion("pos", 17, "Universal Dependencies UPOS tags"),
        LabelSuggestion("chunking", 23, "CoNLL-2000: O plus B-/I- for 11 chunk types"),
    )
}
_USE_CASE_ALIASES = {"sentiment-analysis": "sentiment", "named-entity-recognition": "ner", "pos-tagging": "pos"}


def suggest_num_labels(task: str | None) -> LabelSuggestion | None:
    """The typical label count for a use-case name (`ner` → 9, CoNLL-2003), or None. Only a suggestion."""
    if not task:
        return None
    key = task.strip().lower().replace("_", "-")
    return LABEL_SUGGESTIONS.get(_USE_CASE_ALIASES.get(key, key))


# What each task's head is, in words, for BERT-like models (H = hidden size, K = labels, V = vocabulary).
TASK_HEADS: dict[str, str] = {
    "feature-extraction": "no head: the bare model (with its pooler, for BERT)",
    "text-classification": "a classifier over the pooled first token: H·K + K",
    "token-classification": "a classifier over every token: H·K + K; the pooler is dropped",
    "multiple-choice": "one score per choice: H·1 + 1, over the pooled output",
    "question-answering": "start and end logits for every token: H·2 + 2; the pooler is dropped",
    "fill-mask": "the MLM head: transform H·H + H, its LayerNorm 2·H, a vocabulary bias V; "
                 "the decoder weight is tied to the word embeddings, so it adds nothing",
    "pretraining": "the MLM head plus a next-sentence head H·2 + 2 over the pooler",
    "next-sentence-prediction": "a next-sentence head H·2 + 2 over the pooler",
    "text-generation": "a vocabulary projection H·V, usually tied to the word embeddings "
                       "(BERT: the MLM head used as a decoder)",
}

# ---------------------------------------------------------------------------------------------
# Head parts
# ---------------------------------------------------------------------------------------------

_LABELS = {
    "head.classifier": "classifier",
    "head.qa": "question-answering span head",
    "head.nsp": "next-sentence head",
    "head.transform": "MLM transform",
    "head.transform_norm": "MLM transform LayerNorm",
    "head.decoder": "MLM decoder",
    "head.bias": "vocabulary bias",
    "head.lm": "language-modelling head",
}
_HEAD_ORDER = ("head.transform", "head.transform_norm", "head.decoder", "head.bias", "head.lm", "head.nsp",
               "head.classifier", "head.qa")


@dataclass(frozen=True)
class HeadPart:
    """One module of a head: what it is, its shapes, what it adds and how that figure arises."""

    module: str  # e.g. "classifier", "cls.predictions.transform.dense"
    role: str
    label: str  # e.g. "classifier", "MLM transform"
    shapes: tuple[tuple[int, ...], ...]
    params: int  # unique parameters it adds; 0 when every tensor is another name of an existing one
    arithmetic: str  # e.g. "768·K + K = 1,538 with K=2"
    tied: tuple[tuple[str, str], ...] = ()  # (this part's tensor name, the canonical tensor it reuses)
    num_labels: int | None = None  # K, for classifiers

    @property
    def line(self) -> str:
        """'classifier: 768·K + K = 1,538 with K=2'."""
        return f"{self.module}: {self.arithmetic}"


@dataclass(frozen=True)
class Heads:
    class_name: str
    parts: tuple[HeadPart, ...]
    total: int  # unique parameters of every head part
    num_labels: int | None  # K of the classifier, when there is one
    task: str | None
    task_description: str | None  # TASK_HEADS' words for the task, when a task was named
    suggestion: LabelSuggestion | None
    suggestion_note: str | None  # e.g. "CoNLL-2003 … uses 9 labels: --num-labels 9 gives …"
    uses_pooler: bool

    def to_dict(self) -> dict:
        return {
            "class": self.class_name,
            "total": self.total,
            "num_labels": self.num_labels,
            "task": self.task,
            "task_description": self.task_description,
            "uses_pooler": self.uses_pooler,
            "parts": [
                {"module": p.module, "role": p.role, "label": p.label, "shapes": [list(s) for s in p.shapes],
                 "params": p.params, "arithmetic": p.arithmetic,
                 "tied": [{"name": n, "canonical": c} for n, c in p.tied], "num_labels": p.num_labels}
                for p in self.parts
            ],
            "suggestion": None if self.suggestion is None else {
                "use_case": self.suggestion.use_case, "num_labels": self.suggestion.num_labels,
                "dataset": self.suggestion.dataset, "note": self.suggestion_note,
            },
        }


def describe_heads(report: Report, *, task: str | None = None, num_labels: int | None = None) -> Heads:
    """Every head part of `report`, with arithmetic; a label suggestion when `task` is a use-case name.

    `num_labels` is what the user passed (`--num-labels`); when given, no suggestion is made: it always wins.
    """
    members: dict[str, list[tuple[str, tuple[int, ...], int, str, str | None]]] = {}
    for p in report.params:
        if p.role.startswith("head."):
            members.setdefault(_module_of(p.name), []).append((p.name, p.shape, p.numel, p.role, None))
        for alias in p.aliases:
            alias_role = role_of(alias)
            if alias_role.startswith("head."):
                members.setdefault(_module_of(alias), []).append((alias, p.shape, 0, alias_role, p.name))
    parts = [_part(module, tensors, report.model.class_name) for module, tensors in members.items()]
    parts.sort(key=lambda part: (part.params == 0,  # parts that only reuse other tensors come last
                                 _HEAD_ORDER.index(part.role) if part.role in _HEAD_ORDER else len(_HEAD_ORDER),
                                 part.module))
    k = next((part.num_labels for part in parts if part.num_labels is not None and part.role == "head.classifier"),
             None)
    suggestion = None if num_labels is not None or k is None else suggest_num_labels(task)
    if suggestion is not None and "MultipleChoice" in report.model.class_name:
        suggestion = None  # one score per choice, whatever the label count
    note = _suggestion_note(suggestion, parts, k) if suggestion else None
    return Heads(
        class_name=report.model.class_name,
        parts=tuple(parts),
        total=sum(part.params for part in parts),
        num_labels=k,
        task=task,
        task_description=_task_description(task),
        suggestion=suggestion,
        suggestion_note=note,
        uses_pooler="pooler" in report.breakdown and any(part.role in ("head.classifier", "head.nsp")
                                                         for part in parts),
    )


def classifier_arithmetic(hidden: int, k: int) -> str:
    """'768·K + K = 1,538 with K=2'."""
    return f"{hidden}·K + K = {hidden * k + k:,} with K={k}"


def _module_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else name


def _part(module: str, tensors, class_name: str) -> HeadPart:
    # The weight's role names the part (a tied MLM decoder is a decoder, though its bias is the vocabulary bias).
    role = next((r for name, _, _, r, _ in tensors if name.endswith(".weight")), tensors[0][3])
    label = _LABELS.get(role, role)
    if role == "head.transform" and "pre_classifier" in module:
        label = "pre-classifier"
    shapes = tuple(shape for _, shape, _, _, _ in tensors)
    params = sum(numel for _, _, numel, _, _ in tensors)
    tied = tuple((name, canonical) for name, _, _, _, canonical in tensors if canonical is not None)
    by_local = {name.rsplit(".", 1)[-1]: (shape, canonical) for name, shape, _, _, canonical in tensors}
    weight, bias = by_local.get("weight"), by_local.get("bias")
    k = None
    if role == "head.bias" and len(tensors) == 1 and not tied:
        module = tensors[0][0]
        arithmetic = f"{params:,}: one per vocabulary entry"
    elif tied and params == 0:
        arithmetic = _tied_arithmetic(tensors)
    elif (weight and len(weight[0]) == 2 and bias and bias[0] == (weight[0][0],) and len(tensors) == 2
          and role in ("head.classifier", "head.qa", "head.nsp") and weight[0][0] != weight[0][1]):
        out, hidden = weight[0]
        k = out
        arithmetic = classifier_arithmetic(hidden, out) + _why_k(role, out, class_name)
    else:
        arithmetic = _sum_arithmetic(tensors)
        if tied:
            arithmetic += "; " + _tied_arithmetic([t for t in tensors if t[4] is not None])
    return HeadPart(module, role, label, shapes, params, arithmetic, tied, k if role == "head.classifier" else None)


def _why_k(role: str, k: int, class_name: str) -> str:
    if role == "head.qa" and k == 2:
        return " (start and end logits)"
    if role == "head.nsp" and k == 2:
        return " (is next sentence / is not)"
    if role == "head.classifier" and k == 1 and "MultipleChoice" in class_name:
        return " (one score per choice)"
    return ""


def _dot_shape(shape: tuple[int, ...]) -> str:
    return "·".join(str(d) for d in shape) if shape else "1"


def _sum_arithmetic(tensors) -> str:
    own = [(shape, numel) for _, shape, numel, _, canonical in tensors if canonical is None]
    total = sum(numel for _, numel in own)
    if len(own) == 1 and len(own[0][0]) <= 1:
        return f"{total:,}"
    return " + ".join(_dot_shape(shape) for shape, _ in own) + f" = {total:,}"


def _tied_arithmetic(tensors) -> str:
    items = [f"{name.rsplit('.', 1)[-1]} {'×'.join(map(str, shape))} is {canonical}"
             for name, shape, _, _, canonical in tensors if canonical is not None]
    return "; ".join(items) + " (tied): adds 0"


def _task_description(task: str | None) -> str | None:
    if not task:
        return None
    from .build import TASK_ALIASES  # no torch: build imports it lazily

    key = task.strip().lower().replace("_", "-")
    return TASK_HEADS.get(TASK_ALIASES.get(key, key))


def _suggestion_note(suggestion: LabelSuggestion, parts: list[HeadPart], k: int | None) -> str:
    n = suggestion.num_labels
    text = f"suggestion for {suggestion.use_case}: {n} labels ({suggestion.dataset})"
    classifier = next((p for p in parts if p.num_labels is not None), None)
    hidden = _hidden_of(classifier) if classifier is not None else None
    if hidden is not None:
        text += f"; --num-labels {n} gives {classifier.module} {classifier_arithmetic(hidden, n)}"
    if k is not None and k != n:
        text += f"; this head was built with K={k}, the config's num_labels (--num-labels always wins)"
    return text


def _hidden_of(part: HeadPart) -> int | None:
    match = re.match(r"^(\d+)·K", part.arithmetic)
    return int(match.group(1)) if match else None
