"""What the installed PEFT (and transformers) decide a LoRA plan by, read from their source with `ast`, without
importing them (importing peft takes 2 s and imports torch): the default target modules by model type, the
all-linear shorthand and what it leaves out, the sequence classifier's modules to save, and transformers 5's MoE
conversion. Never copied here: a PEFT upgrade changes these answers as it changes a build's (plan_arithmetic.py
reads them; tests/test_plan_nobuild.py holds its answers to PEFT's own)."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .frozen import FrozenDict, freeze_fields


@dataclass(frozen=True)
class PeftFacts:
    """What the installed PEFT decides a LoRA plan by, read from its source with `ast` (importing peft takes 2 s
    and imports torch), never copied here: a PEFT upgrade changes these answers as it changes the build's."""

    # model_type → module names (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)
    default_targets: FrozenDict[str, Any]
    all_linear: str  # INCLUDE_LINEAR_LAYERS_SHORTHAND
    seq_cls_heads: tuple[str, ...]  # SEQ_CLS_HEAD_NAMES: the classifier all-linear leaves out
    condense_from: int  # MIN_TARGET_MODULES_FOR_OPTIMIZATION: from this many targets PEFT keeps the shortest suffixes
    seq_cls_saved: tuple[str, ...]  # PeftModelForSequenceClassification's classifier_module_names: modules_to_save
    mamba_types: frozenset[str]  # _check_lora_target_modules_mamba: where LoRA refuses these module names
    mamba_refused: frozenset[str]
    # transformers 5's MoE conversion (peft/utils/transformers_weight_conversion.py): conversion pattern → the module
    # names PEFT turns into target parameters, and transformers' model_type → conversion pattern
    moe_renamed: FrozenDict[str, frozenset[str]]
    conversion_patterns: FrozenDict[str, str]

    def __post_init__(self) -> None:
        freeze_fields(self, "default_targets", "moe_renamed", "conversion_patterns")




@functools.lru_cache(maxsize=None)
def peft_facts() -> PeftFacts | None:
    """PeftFacts of the installed PEFT, or None (not installed, or its source no longer reads as expected: the
    build then answers, and says when PEFT is missing)."""
    root = _package_directory("peft")
    if root is None:
        return None
    try:
        return _read_peft(root)
    except (OSError, SyntaxError, ValueError, KeyError, TypeError):  # a PEFT laid out otherwise: the build answers
        return None


def _read_peft(root: Path) -> PeftFacts:
    constants = _module_literals(_parse(root / "utils" / "constants.py"))
    mapping = constants["TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"]
    if not isinstance(mapping, dict):
        raise ValueError("the default target modules are not a dict")
    tuners = _parse(root / "tuners" / "tuners_utils.py")
    mamba = _function_literals(tuners, "_check_lora_target_modules_mamba")
    classifier = _function_literals(_parse(root / "peft_model.py"), "__init__", "PeftModelForSequenceClassification")
    renamed, patterns = _moe_conversion(root)
    return PeftFacts(
        default_targets={k: v if isinstance(v, str) else tuple(v) for k, v in mapping.items()},
        all_linear=str(constants["INCLUDE_LINEAR_LAYERS_SHORTHAND"]),
        seq_cls_heads=tuple(constants["SEQ_CLS_HEAD_NAMES"]),
        condense_from=int(constants["MIN_TARGET_MODULES_FOR_OPTIMIZATION"]),
        seq_cls_saved=tuple(classifier["classifier_module_names"]),
        mamba_types=frozenset(mamba["mamba_model_types"]),
        mamba_refused=frozenset(mamba["incompatible_modules"]),
        moe_renamed=renamed, conversion_patterns=patterns)


def _moe_conversion(root: Path) -> tuple[dict[str, frozenset[str]], dict[str, str]]:
    """(conversion pattern → the module names PEFT converts to target parameters, transformers' model_type →
    pattern). A model type that names a pattern itself counts as its own (PEFT maps mixtral → mixtral)."""
    path = root / "utils" / "transformers_weight_conversion.py"
    if not path.is_file():
        return {}, {}  # a PEFT without the conversion converts nothing
    mapping = _module_literals(_parse(path))["_MOE_TARGET_MODULE_MAPPING"]
    transformers = _package_directory("transformers")
    conversions = None if transformers is None else transformers / "conversion_mapping.py"
    # transformers 4 has no conversion (PEFT converts nothing then): a model type that names a pattern still counts
    # as converted, which only ever sends a plan to the build
    patterns = {} if conversions is None or not conversions.is_file() else _module_literals(
        _parse(conversions))["_MODEL_TO_CONVERSION_PATTERN"]
    return {pattern: frozenset(names) for pattern, names in mapping.items()}, dict(patterns)


def _package_directory(name: str) -> Path | None:
    """Where an installed package's source is, found without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a broken install reads as none
        return None
    locations = None if spec is None else spec.submodule_search_locations
    return Path(list(locations)[0]) if locations else None


@functools.lru_cache(maxsize=64)
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text("utf-8"), str(path))


def _module_literals(tree: ast.Module) -> dict[str, Any]:
    """Every top-level `NAME = <literal>` (annotated or not); a name assigned again, or changed in place
    (NAME[k] = …, NAME.update(…)), is left out: its value is not the literal."""
    found = _literals(tree.body)
    changed = {node.value.id for node in ast.walk(tree) if isinstance(node, (ast.Subscript, ast.Attribute))
               and isinstance(node.value, ast.Name) and (isinstance(node.ctx, ast.Store) or (
                   isinstance(node, ast.Attribute) and node.attr not in ("copy", "get", "keys", "items", "values")))}
    return {name: value for name, value in found.items() if name not in changed}


def _function_literals(tree: ast.Module, function: str, owner: str | None = None) -> dict[str, Any]:
    """The literals a function (of class `owner`) assigns at its top level."""
    scope: Any = tree
    if owner is not None:
        scope = _named(tree.body, ast.ClassDef, owner)
    return _literals(_named(scope.body, ast.FunctionDef, function).body)


def _named(body: list[ast.stmt], kind: type, name: str) -> Any:
    found = next((node for node in body if isinstance(node, kind) and node.name == name), None)
    if found is None:
        raise KeyError(name)  # PEFT laid out otherwise: peft_facts answers None
    return found


def _literals(body: list[ast.stmt]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    repeated: set[str] = set()
    for node in body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        for target in targets:
            if not isinstance(target, ast.Name):
                continue
            if target.id in found:
                repeated.add(target.id)
            try:
                found[target.id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, RecursionError):  # not a literal (a call, a name): not read
                repeated.add(target.id)
    return {name: value for name, value in found.items() if name not in repeated}


def class_chain(name: str, model_type: str | None) -> list[ast.ClassDef] | None:
    """Class `name` and its bases, as written in its transformers modeling file (models/<model_type>/modeling_*.py,
    and modeling_layers.py's generic heads), down to PreTrainedModel; None where a base is defined elsewhere."""
    root = _package_directory("transformers")
    if root is None or not model_type:
        return None
    folder = root / "models" / model_type.replace("-", "_")
    try:
        files = sorted(folder.glob("modeling_*.py")) + [root / "modeling_layers.py"]
        classes = {node.name: node for path in files for node in _parse(path).body if isinstance(node, ast.ClassDef)}
    except (OSError, SyntaxError, ValueError):  # an unreadable source: the build answers
        return None
    known = ("PreTrainedModel", "GenerationMixin", "nn.Module")
    chain: list[ast.ClassDef] = []
    pending = [name]
    while pending:
        current = pending.pop(0)
        node = classes.get(current)
        if node is None:
            return None
        chain.append(node)
        for base in node.bases:
            written = ast.unparse(base)
            if written not in known and written not in (c.name for c in chain):
                pending.append(written)
    return chain


def defines(chain: list[ast.ClassDef], method: str) -> bool:
    return any(isinstance(node, ast.FunctionDef) and node.name == method for cls in chain for node in cls.body)


def class_attribute(chain: list[ast.ClassDef], name: str) -> str | None:
    for cls in chain:
        value = _literals(cls.body).get(name)
        if isinstance(value, str):
            return value
    return None
