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

from ._version import __version__
from .errors import (
    AssumptionError,
    CheckpointError,
    ConfigError,
    FormulaError,
    FormulaMismatchError,
    ModelClassError,
    OptionError,
    ParamscopeError,
    RemoteCodeError,
    SourceError,
    TemplateError,
    UnsupportedError,
)

if TYPE_CHECKING:
    from .api import inspect, inspect_module
    from .count import BufferInfo, Counts, ModuleNode, ParameterInfo, TiedGroup
    from .formula import Formula, derive_formula
    from .report import SCHEMA_VERSION, Component, ModelInfo, Report
    from .cost.memory.serving import MemoryOptions
    from .cost.memory.serving_answer import estimate_memory
    from .cost.memory.result import MemoryEstimate
    from .cost.memory.training import TrainingOptions, estimate_training
    from .cost.flops.estimate import FlopOptions, estimate_flops
    from .cost.flops.result import FlopEstimate
    from .cost.speed.answer import ServeOptions, estimate_serving
    from .cost.speed.roofline import ServeSpeed
    from .cost.memory.llama_cpp import LlamaCppOptions
    from .cost.memory.llama_cpp_answer import LlamaCppEstimate, estimate_llama_cpp
    from .cost.memory.vllm import VllmOptions
    from .cost.memory.vllm_answer import VllmEstimate, estimate_vllm
    from .api import inspect_with_module
    from .plan import Plan, PlanOptions, make_plan, plan_flops, plan_memory
    from .cost.parallel.layout import ParallelLayout, layout_for
    from .cost.parallel.search import LayoutSearch, SearchOptions
    from .cost.parallel.search_answer import find_layout

# The public names each load their module on first use (PEP 562), so that `paramscope formula` answering from
# its cache, and `paramscope --version`, pay for nothing they do not use.
_LAZY = {
    "inspect": "api", "inspect_module": "api",
    "BufferInfo": "count", "Counts": "count", "ModuleNode": "count", "ParameterInfo": "count", "TiedGroup": "count",
    "Formula": "formula", "derive_formula": "formula",
    "SCHEMA_VERSION": "report", "Component": "report", "ModelInfo": "report", "Report": "report",
    "estimate_memory": "cost.memory.serving_answer", "MemoryOptions": "cost.memory.serving",
    "MemoryEstimate": "cost.memory.result",
    "estimate_training": "cost.memory.training", "TrainingOptions": "cost.memory.training",
    "estimate_flops": "cost.flops.estimate", "FlopOptions": "cost.flops.estimate", "FlopEstimate": "cost.flops.result",
    "estimate_serving": "cost.speed.answer", "ServeOptions": "cost.speed.answer", "ServeSpeed": "cost.speed.roofline",
    "estimate_llama_cpp": "cost.memory.llama_cpp_answer", "LlamaCppOptions": "cost.memory.llama_cpp",
    "LlamaCppEstimate": "cost.memory.llama_cpp_answer",
    "estimate_vllm": "cost.memory.vllm_answer", "VllmOptions": "cost.memory.vllm",
    "VllmEstimate": "cost.memory.vllm_answer",
    "inspect_with_module": "api", "Plan": "plan", "PlanOptions": "plan", "make_plan": "plan",
    "plan_memory": "plan", "plan_flops": "plan",
    "ParallelLayout": "cost.parallel.layout", "layout_for": "cost.parallel.layout",
    "LayoutSearch": "cost.parallel.search", "SearchOptions": "cost.parallel.search",
    "find_layout": "cost.parallel.search_answer",
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
    "LayoutSearch",
    "LlamaCppEstimate",
    "LlamaCppOptions",
    "MemoryEstimate",
    "MemoryOptions",
    "ModelClassError",
    "ModelInfo",
    "ModuleNode",
    "OptionError",
    "ParallelLayout",
    "ParameterInfo",
    "ParamscopeError",
    "Plan",
    "PlanOptions",
    "RemoteCodeError",
    "Report",
    "SearchOptions",
    "ServeOptions",
    "ServeSpeed",
    "SourceError",
    "TemplateError",
    "TiedGroup",
    "TrainingOptions",
    "UnsupportedError",
    "VllmEstimate",
    "VllmOptions",
    "__version__",
    "derive_formula",
    "estimate_flops",
    "estimate_llama_cpp",
    "estimate_memory",
    "estimate_serving",
    "estimate_training",
    "estimate_vllm",
    "find_layout",
    "inspect",
    "inspect_module",
    "inspect_with_module",
    "layout_for",
    "make_plan",
    "plan_flops",
    "plan_memory",
]
