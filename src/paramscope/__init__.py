"""paramscope: exact, explained parameter counts for transformers models and any torch module.

    >>> import paramscope
    >>> report = paramscope.inspect("bert-base-uncased", model_class="BertModel")
    >>> report.parameters.total
    109482240

    >>> paramscope.derive_formula("bert-base-chinese", model_class="BertForMaskedLM").value
    102290312

Importing this package imports neither torch, transformers, sympy nor rich; they load when first needed.
"""

from typing import TYPE_CHECKING

from .errors import (
    CheckpointError,
    ConfigError,
    ModelClassError,
    ParamscopeError,
    RemoteCodeError,
    SourceError,
)

if TYPE_CHECKING:
    from .api import inspect, inspect_module
    from .count import BufferInfo, Counts, ModuleNode, ParameterInfo, TiedGroup
    from .formula import Formula, derive_formula
    from .formula_cache import AssumptionError, FormulaError, FormulaMismatchError
    from .report import SCHEMA_VERSION, Component, ModelInfo, Report
    from .cost.estimate import MemoryOptions, estimate_memory
    from .cost.memory import MemoryEstimate
    from .cost.training_estimate import TrainingOptions, estimate_training
    from .cost.flop_estimate import FlopOptions, estimate_flops
    from .cost.flops import FlopEstimate
    from .api import inspect_with_module
    from .plan import Plan, PlanOptions, make_plan, plan_flops, plan_memory

# The public names each load their module on first use (PEP 562), so that `paramscope formula` answering from
# its cache, and `paramscope --version`, pay for nothing they do not use.
_LAZY = {
    "inspect": "api", "inspect_module": "api",
    "BufferInfo": "count", "Counts": "count", "ModuleNode": "count", "ParameterInfo": "count", "TiedGroup": "count",
    "Formula": "formula", "derive_formula": "formula",
    "AssumptionError": "formula_cache", "FormulaError": "formula_cache", "FormulaMismatchError": "formula_cache",
    "SCHEMA_VERSION": "report", "Component": "report", "ModelInfo": "report", "Report": "report",
    "estimate_memory": "cost.estimate", "MemoryOptions": "cost.estimate", "MemoryEstimate": "cost.memory",
    "estimate_training": "cost.training_estimate", "TrainingOptions": "cost.training_estimate",
    "estimate_flops": "cost.flop_estimate", "FlopOptions": "cost.flop_estimate", "FlopEstimate": "cost.flops",
    "inspect_with_module": "api", "Plan": "plan", "PlanOptions": "plan", "make_plan": "plan",
    "plan_memory": "plan", "plan_flops": "plan",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'paramscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "AssumptionError",
    "BufferInfo",
    "CheckpointError",
    "Component",
    "ConfigError",
    "Counts",
    "FlopEstimate",
    "FlopOptions",
    "Formula",
    "FormulaError",
    "FormulaMismatchError",
    "MemoryEstimate",
    "MemoryOptions",
    "ModelClassError",
    "ModelInfo",
    "ModuleNode",
    "ParameterInfo",
    "ParamscopeError",
    "Plan",
    "PlanOptions",
    "RemoteCodeError",
    "Report",
    "SourceError",
    "TiedGroup",
    "TrainingOptions",
    "__version__",
    "derive_formula",
    "estimate_flops",
    "estimate_memory",
    "estimate_training",
    "inspect",
    "inspect_module",
    "inspect_with_module",
    "make_plan",
    "plan_flops",
    "plan_memory",
]
