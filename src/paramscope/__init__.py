"""paramscope: exact, explained parameter counts for transformers models and any torch module.

    >>> import paramscope
    >>> report = paramscope.inspect("bert-base-uncased", model_class="BertModel")
    >>> report.parameters.total
    109482240

Importing this package imports neither torch, transformers nor rich; they load when first needed.
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
from .report import SCHEMA_VERSION, Component, ModelInfo, Report

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "BufferInfo",
    "CheckpointError",
    "Component",
    "ConfigError",
    "Counts",
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
    "inspect",
    "inspect_module",
]
