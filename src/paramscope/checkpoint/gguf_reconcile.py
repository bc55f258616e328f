"""A GGUF file held against the transformers class built from its own metadata (gguf_config.py): every tensor matched
to a parameter (gguf_names.py), the same parameters and the same roles, each difference named.

Pure: it takes the header (GGUFCheckpoint) and the class's counted parameters (a Report's `params`: names, shapes,
roles, tied aliases), never a tensor's values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..frozen import FrozenDict, freeze_fields
from .gguf_names import how_stored, parameter_gguf_names, stored_gguf_names
from .gguf_read import GGUFCheckpoint, GGUFTensor

_BLOCK = re.compile(r"^blk\.(\d+)\.")
# File tensors llama.cpp writes that are no parameter of the class, and what the class holds instead.
EXPLAINED_EXTRAS = {
    "rope_freqs.weight": "llama.cpp's rope frequency factors (rope scaling, e.g. Llama 3.1's); transformers computes "
                         "them into its rotary embedding's inv_freq buffer, no parameter",
}
EXPLAINED_PATTERNS = (
    (re.compile(r"^blk\.\d+\.exp_probs_b\.bias$"),
     "the router's score-correction bias (DeepSeek-V3's e_score_correction_bias): learned, written by the converter, "
     "and a buffer of the class, not a parameter"),
)


@dataclass(frozen=True)
class TensorMatch:
    """The GGUF tensors (one, or two for fused experts) that hold one parameter of the class."""

    parameter: str
    gguf: tuple[str, ...]
    shape: tuple[int, ...]  # the parameter's
    gguf_shapes: tuple[tuple[int, ...], ...]
    elements: int  # the file's (unpacked)
    nbytes: int  # the file's, exact
    ggml_types: tuple[str, ...]
    role: str  # the parameter's role; the GGUF names' role (gguf_role) is checked equal, else a difference
    how: str  # "as is", "rows permuted for rope ...", "fused: ...", "transposed ..."

    def to_dict(self) -> dict[str, Any]:
        return {"parameter": self.parameter, "gguf": list(self.gguf), "shape": list(self.shape),
                "gguf_shapes": [list(s) for s in self.gguf_shapes], "elements": self.elements, "bytes": self.nbytes,
                "ggml_types": list(self.ggml_types), "role": self.role, "how": self.how}


@dataclass(frozen=True)
class Difference:
    """One way the file and the class differ. `explained`: a known difference that leaves them reconciled (a tied
    head the file leaves out, llama.cpp's rope factors)."""

    kind: str  # "file only" | "class only" | "shape" | "role" | "tied"
    name: str
    elements: int
    why: str
    explained: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "elements": self.elements, "why": self.why,
                "explained": self.explained}


@dataclass(frozen=True)
class GGUFReconciliation:
    class_name: str
    file_parameters: int  # every tensor's unpacked elements
    class_parameters: int  # the class's unique parameters
    matched_parameters: int
    matches: tuple[TensorMatch, ...]
    differences: tuple[Difference, ...]
    roles: FrozenDict[str, tuple[int, int]]  # role → (file elements, class parameters)
    cannot: str | None = None  # why no reconciliation was tried, in words

    def __post_init__(self) -> None:
        freeze_fields(self, "roles")

    @property
    def equal(self) -> bool:
        """Every parameter matched at its shape and role, every file tensor matched or explained."""
        return self.cannot is None and all(d.explained for d in self.differences)

    @property
    def explained_extra(self) -> int:
        return sum(d.elements for d in self.differences if d.explained and d.kind == "file only")

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.class_name, "equal": self.equal, "cannot": self.cannot,
                "file_parameters": self.file_parameters, "class_parameters": self.class_parameters,
                "matched_parameters": self.matched_parameters,
                "roles": {k: {"file": f, "class": c} for k, (f, c) in self.roles.items()},
                "differences": [d.to_dict() for d in self.differences],
                "matches": [m.to_dict() for m in self.matches]}


def cannot_reconcile(ck: GGUFCheckpoint, class_name: str, why: str) -> GGUFReconciliation:
    return GGUFReconciliation(class_name, ck.elements, 0, 0, (), (), {}, cannot=why)


def block_count_problem(ck: GGUFCheckpoint, layers: int | None) -> str | None:
    """Why the file's blocks cannot be the metadata's layers (a header that says 32 over tensors for 2), or None."""
    found = sorted({int(m[1]) for t in ck.tensors if (m := _BLOCK.match(t.name))})
    arch = ck.architecture
    if layers is None:
        return f"the metadata gives no layer count ({arch}.block_count)"
    if len(found) != layers or (found and found[-1] != layers - 1):
        held = f"blk.{found[0]}–blk.{found[-1]}, {len(found)} blocks" if found else "no blk.N tensors"
        return f"the metadata says {layers} layers ({arch}.block_count), the file holds tensors for {held}"
    return None


def reconcile_gguf(ck: GGUFCheckpoint, params: Any, class_name: str, layers: int) -> GGUFReconciliation:
    """`ck` against the class's parameters `params` (count.ParameterInfo: name, shape, numel, role, aliases)."""
    arch = ck.architecture or ""
    problem = block_count_problem(ck, layers)
    if problem:
        return cannot_reconcile(ck, class_name, problem)
    by_name: dict[str, GGUFTensor] = {t.name: t for t in ck.tensors}
    used: set[str] = set()
    matches: list[TensorMatch] = []
    differences: list[Difference] = []
    roles: dict[str, list[int]] = {}
    for param in params:
        roles.setdefault(param.role, [0, 0])[1] += param.numel
        found = ()
        for name in (param.name, *param.aliases):
            for names in stored_gguf_names(arch, layers, name):
                if all(n in by_name for n in names):
                    found = names
                    break
            if found:
                break
        if not found:
            wanted = parameter_gguf_names(arch, layers, param.name)
            why = (f"the file has no {' and '.join(wanted)}" if wanted else
                   "llama.cpp's name table for this architecture has no name for it")
            differences.append(Difference("class only", param.name, param.numel, why))
            continue
        tensors = [by_name[n] for n in found]
        used.update(found)
        shapes = tuple(t.shape for t in tensors)
        how = how_stored(arch, found, shapes, tuple(param.shape))
        elements = sum(t.elements for t in tensors)
        if how is None:
            differences.append(Difference("shape", param.name, param.numel,
                                          f"{' + '.join(found)} {' + '.join('×'.join(map(str, s)) for s in shapes)} "
                                          f"≠ the class's {'×'.join(map(str, param.shape))}"))
            continue
        gguf_roles = {t.role for t in tensors}
        if gguf_roles != {param.role}:
            differences.append(Difference("role", param.name, param.numel,
                                          f"{', '.join(found)} read as {', '.join(sorted(gguf_roles))}, the class's "
                                          f"parameter as {param.role}"))
        for t in tensors:
            roles.setdefault(t.role, [0, 0])[0] += t.elements
        matches.append(TensorMatch(param.name, found, tuple(param.shape), shapes, elements,
                                   sum(t.nbytes for t in tensors), tuple(t.ggml_type for t in tensors), param.role,
                                   how))
        if param.aliases and "output.weight" not in by_name and any(a.startswith("lm_head") for a in param.aliases):
            differences.append(Difference("tied", next(a for a in param.aliases if a.startswith("lm_head")), 0,
                                          f"tied to {param.name}: the file has no output.weight (llama.cpp reads "
                                          "token_embd for the head)", explained=True))
    for t in ck.tensors:
        if t.name in used:
            continue
        roles.setdefault(t.role, [0, 0])[0] += t.elements
        why = EXPLAINED_EXTRAS.get(t.name) or next((w for p, w in EXPLAINED_PATTERNS if p.match(t.name)), None)
        differences.append(Difference("file only", t.name, t.elements, why or "no parameter of the class is stored "
                                      "under this name", explained=why is not None))
    return GGUFReconciliation(
        class_name=class_name,
        file_parameters=ck.elements,
        class_parameters=sum(p.numel for p in params),
        matched_parameters=sum(m.elements for m in matches),
        matches=tuple(matches),
        differences=tuple(differences),
        roles={k: (v[0], v[1]) for k, v in sorted(roles.items())},
    )
