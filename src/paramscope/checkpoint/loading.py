"""What loading a checkpoint into a model would do (`reconcile` → `Audit`): checkpoint keys mapped onto the model's
parameter names the way transformers 5 maps them while loading (legacy renames, adding or stripping the base-model
prefix, tied aliases), and what would be missing, unused, mismatched, or not a parameter.

Only transformers' model-independent "legacy" renames are mirrored. Model-specific conversions (transformers 5
fuses e.g. per-expert MoE weights while loading) are not, so such checkpoints show those tensors as unexpected and
the fused parameters as missing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable, Iterable, Mapping

from ..frozen import FrozenDict, freeze_fields
from .tensors import Checkpoint, CheckpointTensor


@dataclass(frozen=True, slots=True)  # slots: a 100 MB header can list a million unexpected tensors
class Finding:
    """A name and why it is listed: a missing parameter, an unused tensor, or a non-parameter."""

    name: str
    reason: str
    shape: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "reason": self.reason}


class _FindingFilling:
    """Finding's slots, settable: `_finding` fills one and makes it the frozen Finding it equals (the layouts are
    the same), as tensors.make_tensor does for a tensor: a million findings, a third of the time."""

    __slots__ = Finding.__slots__  # type: ignore[attr-defined]

    def __init__(self, name: str, reason: str, shape: tuple[int, ...] = ()) -> None:
        self.name = name
        self.reason = reason
        self.shape = shape
        self.__class__ = Finding  # type: ignore[assignment]


_finding: Any = _FindingFilling
try:  # where `__class__` cannot be assigned (another Python), the dataclass's own constructor
    if _finding("n", "r", (1,)) != Finding("n", "r", (1,)) or type(_finding("n", "r")) is not Finding:
        raise TypeError("_finding differs")
except TypeError:
    _finding = Finding


@dataclass(frozen=True)
class Mismatch:
    name: str  # the model's name
    checkpoint_key: str
    checkpoint_shape: tuple[int, ...]
    model_shape: tuple[int, ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "checkpoint_key": self.checkpoint_key,
            "checkpoint_shape": list(self.checkpoint_shape),
            "model_shape": list(self.model_shape),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Audit:
    """What loading `checkpoint` into the model would do, parameter by parameter."""

    format: str
    matched: tuple[str, ...]  # model names filled from the checkpoint (tied aliases included)
    missing: tuple[Finding, ...]  # model parameters absent from the checkpoint
    unexpected: tuple[Finding, ...]  # checkpoint tensors that map to nothing
    non_parameters: tuple[Finding, ...]  # buffers, quantisation scales/state
    mismatched: tuple[Mismatch, ...]
    renamed: tuple[tuple[str, str], ...]  # (checkpoint key, model name) where the two differ
    parameters: int  # unique parameter elements the checkpoint provides
    elements: int  # every stored element in the checkpoint
    bytes: int
    by_dtype: FrozenDict[str, FrozenDict[str, int]]

    def __post_init__(self) -> None:
        freeze_fields(self, "by_dtype")

    @property
    def complete(self) -> bool:
        """True when every model parameter is loaded from the checkpoint with the right shape."""
        return not self.missing and not self.mismatched

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "parameters": self.parameters,
            "elements": self.elements,
            "bytes": self.bytes,
            "matched_count": len(self.matched),
            "missing": [f.to_dict() for f in self.missing],
            "unexpected": [f.to_dict() for f in self.unexpected],
            "non_parameters": [f.to_dict() for f in self.non_parameters],
            "mismatched": [m.to_dict() for m in self.mismatched],
            "renamed": dict(self.renamed),
            "by_dtype": {k: dict(v) for k, v in self.by_dtype.items()},
        }


# transformers 5 (conversion_mapping.py, "legacy") renames these keys for every model while loading.
# Patterns are used as transformers compiles them: a literal that ends on a name boundary.
_LEGACY_RENAMES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"LayerNorm.gamma(?!\w)"), "LayerNorm.weight"),
    (re.compile(r"LayerNorm.beta(?!\w)"), "LayerNorm.bias"),
    (re.compile(r".weight_g(?!\w)"), ".parametrizations.weight.original0"),
    (re.compile(r".weight_v(?!\w)"), ".parametrizations.weight.original1"),
    (re.compile(r"^language_model\.model\.model(?!\w)|^model\.language_model\.model(?!\w)"), "model.language_model"),
)

# Buffers older versions saved and current models recreate (transformers drops them silently).
_LEGACY_BUFFER = re.compile(r"(^|\.)(position_ids|rotary_emb\.inv_freq|masked_bias|attn\.bias)$")

_LEGACY_BUFFER_ENDINGS = ("position_ids", "inv_freq", "masked_bias", "attn.bias")  # _LEGACY_BUFFER's, a precheck

# One search that tells whether any rename can fire: most keys need none (reconcile runs once per tensor).
_ANY_LEGACY_RENAME = re.compile("|".join(f"(?:{pattern.pattern})" for pattern, _ in _LEGACY_RENAMES))

_name = attrgetter("name")

_TASK_HEADS = frozenset(("classifier", "score", "qa_outputs", "lm_head", "head", "heads", "seq_relationship"))
# A substring of every component _unexpected_reason looks for ("head" is in lm_head and heads): a precheck.
_HEAD_WORD = re.compile("cls|pooler|head|classifier|score|qa_outputs|seq_relationship")


def reconcile(
    checkpoint: Checkpoint,
    expected_params: Mapping[str, tuple[int, ...]],
    *,
    expected_buffers: Iterable[str] = (),
    tied_aliases: Mapping[str, str] = {},  # noqa: B006 - read-only
    base_model_prefix: str = "",
    model_class: str = "",
) -> Audit:
    """Say what loading `checkpoint` into a model with these parameters would do.

    `expected_params` maps each unique parameter name to its shape; `tied_aliases` maps another name
    under which a tied parameter is reachable to its canonical name; `expected_buffers` names the
    model's buffers. `model_class` is only used in the reasons ("... that BertModel does not have").
    """
    params = {name: tuple(int(d) for d in shape) for name, shape in expected_params.items()}
    aliases = dict(tied_aliases)
    for alias, canonical in aliases.items():
        if canonical not in params:
            raise ValueError(f"tied alias {alias!r} points to {canonical!r}, which is not in expected_params")
    buffers = set(expected_buffers)
    model_keys = set(params) | set(aliases) | buffers
    who = model_class or "the model"

    filled: dict[str, str] = {}  # canonical name -> checkpoint key that provides it
    claimed: dict[str, str] = {}  # model name (alias or canonical) -> checkpoint key
    matched: list[str] = []
    unexpected: list[Finding] = []
    non_parameters: list[Finding] = []
    mismatched: list[Mismatch] = []
    renamed: list[tuple[str, str]] = []
    reasons: dict[str, str] = {}  # one string per distinct reason, not one per tensor (a million, at 100 MB)
    unused = _unexpected_reason("", who)  # the reason of a name no head word is in: most unexpected tensors'
    map_key = _key_mapper(model_keys, base_model_prefix)

    for t in checkpoint.tensors:
        target = map_key(t.name)
        if target not in params and target not in aliases and t.role == "packed":
            target = _packed_target(t.name, map_key, model_keys) or target

        if target in params or target in aliases:
            canonical = aliases.get(target, target)
            model_shape = params[canonical]
            if not _fits(t, model_shape):
                mismatched.append(
                    Mismatch(
                        name=target,
                        checkpoint_key=t.name,
                        checkpoint_shape=t.shape,
                        model_shape=model_shape,
                        reason="shapes differ: loading fails unless ignore_mismatched_sizes=True, "
                        "which re-initialises it",
                    )
                )
                continue
            if target in claimed:
                unexpected.append(
                    Finding(t.name, f"duplicate: {target} is already loaded from {claimed[target]}", t.shape)
                )
                continue
            claimed[target] = t.name
            filled.setdefault(canonical, t.name)
            matched.append(target)
            if target != t.name:
                renamed.append((t.name, target))
        elif target in buffers:
            non_parameters.append(Finding(t.name, "buffer, not a parameter", t.shape))
        elif t.role == "quant_aux":
            reason = f"{t.note}: not a parameter"
            non_parameters.append(_finding(t.name, reasons.setdefault(reason, reason), t.shape))
        elif target.endswith(_LEGACY_BUFFER_ENDINGS) and _LEGACY_BUFFER.search(target):
            non_parameters.append(
                Finding(t.name, "buffer saved by older versions; the model recreates it, not a parameter", t.shape)
            )
        elif not _HEAD_WORD.search(target):
            unexpected.append(_finding(t.name, unused, t.shape))
        else:
            reason = _unexpected_reason(target, who)
            unexpected.append(_finding(t.name, reasons.setdefault(reason, reason), t.shape))

    mismatched_names = {aliases.get(m.name, m.name) for m in mismatched}
    missing = [
        Finding(name, _missing_reason(name), shape)
        for name, shape in params.items()
        if name not in filled and name not in mismatched_names
    ]
    return Audit(
        format=checkpoint.format,
        matched=tuple(sorted(matched)),
        missing=tuple(sorted(missing, key=_name)),
        unexpected=tuple(sorted(unexpected, key=_name)),
        non_parameters=tuple(sorted(non_parameters, key=_name)),
        mismatched=tuple(sorted(mismatched, key=_name)),
        renamed=tuple(sorted(renamed)),
        parameters=sum(math.prod(params[name]) for name in filled),
        elements=checkpoint.elements,
        bytes=checkpoint.nbytes,
        by_dtype=checkpoint.by_dtype,
    )


def _apply_legacy_renames(key: str) -> str:
    # Every rule that matches fires, in order, as in transformers' apply_renamings. Each rule's literal holds one of
    # these substrings; testing them first is ten times cheaper than the regex, and most keys need no rename.
    if ("gamma" not in key and "beta" not in key and "weight_" not in key and "language_model" not in key) or (
            not _ANY_LEGACY_RENAME.search(key)):
        return key
    for pattern, replacement in _LEGACY_RENAMES:
        m = pattern.search(key)
        if m:
            key = key.replace(m.group(0), replacement, 1)
    return key


def _key_mapper(model_keys: set[str], prefix: str) -> Callable[[str], str]:
    """The model name a checkpoint key loads into, as transformers maps it (legacy renames, then the base-model
    prefix); what depends only on the model is worked out once, since a checkpoint may hold a million keys."""
    dotted = f"{prefix}."
    cut = len(dotted)
    # dotted + key is a model key exactly when key is in `added`
    added = {key[cut:]: key for key in model_keys if key.startswith(dotted)} if prefix else {}

    def fix_prefix(key: str) -> str:
        # Per key, as transformers does: strip the base-model prefix when the model lacks it (a
        # BertModel loading a BertForMaskedLM checkpoint), add it when the model has it (a
        # BertForSequenceClassification loading a BertModel checkpoint).
        if not prefix:
            return key
        if key.startswith(dotted) and key[cut:] in model_keys:
            return key[cut:]
        return added.get(key, key)

    def map_key(key: str) -> str:
        renamed = fix_prefix(_apply_legacy_renames(key))
        if renamed not in model_keys and key in model_keys:
            # The rename should not have fired: the key already names a model entry.
            renamed = fix_prefix(key)
        return renamed

    return map_key


def _packed_target(key: str, map_key: Callable[[str], str], model_keys: set[str]) -> str | None:
    # A GPTQ `X.qweight` or compressed-tensors `X.weight_packed` stands for the model's `X.weight`, gpt-oss's MXFP4
    # `X.gate_up_proj_blocks` for `X.gate_up_proj` (transformers' Mxfp4 conversion joins it with its `_scales`).
    stem, _, last = key.rpartition(".")
    if last.endswith("_blocks"):
        target = map_key(key[:-len("_blocks")])
        return target if target in model_keys else None
    if last not in ("qweight", "weight_packed"):
        return None
    target = map_key(f"{stem}.weight" if stem else "weight")
    return target if target in model_keys else None


def _fits(t: CheckpointTensor, model_shape: tuple[int, ...]) -> bool:
    if t.role != "packed":
        return t.shape == model_shape
    wanted = math.prod(model_shape)
    if t.logical_numel is not None:
        return t.logical_numel == wanted
    if t.packing == "bnb-4bit":
        # ceil(n / 2) bytes hold n values.
        return (wanted + 1) // 2 == t.numel
    if t.packing == "compressed-tensors" and model_shape:
        # compressed-tensors packs each row's n values of b bits (1 to 8) into ⌈n·b/32⌉ int32 words
        # (pack_quantized/helpers.py, pack_to_int32): the rows are the model's, the last dimension is packed.
        return t.shape[:-1] == model_shape[:-1] and any(
            -(-model_shape[-1] * bits // 32) == t.shape[-1] for bits in range(1, 9))
    return False


def _components(name: str) -> list[str]:
    return name.split(".")


def _unexpected_reason(name: str, who: str) -> str:
    if not _HEAD_WORD.search(name):  # no component can be a head's: the common case, one cheap search
        return f"no parameter of that name in {who}: unused when loaded"
    parts = set(_components(name))
    if "cls" in parts and "predictions" in parts:
        return f"part of the MLM pretraining head that {who} does not have"
    if "cls" in parts and "seq_relationship" in parts:
        return f"part of the next-sentence-prediction pretraining head that {who} does not have"
    if "lm_head" in parts:
        return f"language-modelling head that {who} does not have: unused when loaded"
    if "pooler" in parts:
        return f"pooler that {who} does not have: unused when loaded"
    if not _TASK_HEADS.isdisjoint(parts):
        return f"task head that {who} does not have: unused when loaded"
    return f"no parameter of that name in {who}: unused when loaded"


def _missing_reason(name: str) -> str:
    parts = _components(name)
    if any(p in _TASK_HEADS for p in parts) or ("cls" in parts and "predictions" in parts):
        return "task head not in the checkpoint: newly initialised, must be trained"
    if "pooler" in parts:
        return "pooler not in the checkpoint: newly initialised when loaded"
    return "not in the checkpoint: newly initialised when loaded"
