"""paramscope: exact, explained parameter counts for transformers models and any torch module.

    >>> import paramscope
    >>> report = paramscope.inspect("bert-base-uncased", model_class="BertModel")
    >>> report.parameters.total
    109482240

    >>> paramscope.derive_formula("bert-base-chinese", model_class="BertForMaskedLM").value
    102290312

Importing this package imports neither torch, transformers, sympy nor rich; they load when first needed.
"""

from .api import inspect, inspect_module
from .count import BufferInfo, Counts, ModuleNode, ParameterInfo, TiedGroup
from .errors import (
    CheckpointError,
    ConfigError,
    ModelClassError,
    ParamscopeError,
    RemoteCodeError,
    SourceError,
)
from .formula import Formula, derive_formula
from .formula_cache import AssumptionError, FormulaError, FormulaMismatchError
from .report import SCHEMA_VERSION, Component, ModelInfo, Report

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "AssumptionError",
    "BufferInfo",
    "CheckpointError",
    "Component",
    "ConfigError",
    "Counts",
    "Formula",
    "FormulaError",
    "FormulaMismatchError",
    "ModelClassError",
    "ModelInfo",
    "ModuleNode",
    "ParameterInfo",
    "ParamscopeError",
    "RemoteCodeError",
    "Report",
    "SourceError",
    "TiedGroup",
    "__version__",
    "derive_formula",
    "inspect",
    "inspect_module",
]
