"""From a config dict to a model on the meta device: validate, choose the class, build.

torch and transformers are imported inside the functions, so that `import paramscope` stays light.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, ModelClassError, RemoteCodeError

# Pipeline task names and the notes' use-case names → transformers' auto-model mapping.
TASKS: dict[str, tuple[str, str]] = {
    "feature-extraction": ("MODEL_MAPPING_NAMES", "the bare model (AutoModel)"),
    "text-classification": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "sequence classification"),
    "token-classification": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "token classification"),
    "fill-mask": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "masked language modelling"),
    "question-answering": ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "extractive question answering"),
    "multiple-choice": ("MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES", "multiple choice"),
    "pretraining": ("MODEL_FOR_PRETRAINING_MAPPING_NAMES", "pretraining heads"),
    "next-sentence-prediction": ("MODEL_FOR_NEXT_SENTENCE_PREDICTION_MAPPING_NAMES", "next-sentence prediction"),
    "text-generation": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "causal language modelling (generation)"),
    "text2text-generation": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "sequence-to-sequence generation"),
}
TASK_ALIASES: dict[str, str] = {
    "sentiment": "text-classification",
    "sentiment-analysis": "text-classification",
    "topic": "text-classification",
    "spam": "text-classification",
    "intent": "text-classification",
    "sequence-classification": "text-classification",
    "ner": "token-classification",
    "pos": "token-classification",
    "chunking": "token-classification",
    "mlm": "fill-mask",
    "qa": "question-answering",
    "generation": "text-generation",
    "causal-lm": "text-generation",
    "summarization": "text2text-generation",
    "translation": "text2text-generation",
    "nsp": "next-sentence-prediction",
    "base": "feature-extraction",
}

# Size fields that must be positive integers wherever a config has them (None means "derived").
_POSITIVE_INT_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "max_position_embeddings", "head_dim", "embedding_size",
    "n_embd", "n_layer", "n_head", "n_positions", "n_inner", "n_ctx",
    "d_model", "d_ff", "d_kv", "num_layers", "num_heads", "num_decoder_layers",
    "dim", "hidden_dim", "n_layers", "n_heads",
    "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
    "encoder_ffn_dim", "decoder_ffn_dim",
    "num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size", "num_labels",
)
_NON_NEGATIVE_INT_FIELDS = ("type_vocab_size", "n_shared_experts", "first_k_dense_replace")
# (width field, heads field): the width must split evenly into heads unless head_dim is explicit.
_HEAD_SPLITS = (
    ("hidden_size", "num_attention_heads"),
    ("n_embd", "n_head"),
    ("dim", "n_heads"),
    ("d_model", "encoder_attention_heads"),
    ("d_model", "decoder_attention_heads"),
)


@dataclass(frozen=True)
class ClassChoice:
    name: str
    reason: str


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def validate_config_dict(config: dict[str, Any]) -> None:
    """Reject sizes that cannot describe a model, naming the field and the value."""
    for key in _POSITIVE_INT_FIELDS:
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"config field {key!r} must be an integer, got {value!r}")
        if value <= 0:
            raise ConfigError(f"config field {key!r} must be positive, got {value}")
    for key in _NON_NEGATIVE_INT_FIELDS:
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"config field {key!r} must be a non-negative integer, got {value!r}")
    if config.get("head_dim") is None and config.get("embedding_size") is None:
        for width_key, heads_key in _HEAD_SPLITS:
            width, heads = config.get(width_key), config.get(heads_key)
            if isinstance(width, int) and isinstance(heads, int) and heads > 0 and width % heads:
                raise ConfigError(
                    f"{width_key} {width} is not divisible by {heads_key} {heads} "
                    f"(each head would get {width / heads:g} dimensions)"
                )


def make_config(config_dict: dict[str, Any], *, num_labels: int | None = None, trust_remote_code: bool = False,
                source_path: str | None = None):
    """A PretrainedConfig for `config_dict`, plus notes on what was decided along the way."""
    from transformers import CONFIG_MAPPING

    notes: list[str] = []
    config_dict = dict(config_dict)
    model_type = config_dict.get("model_type")
    auto_map = config_dict.get("auto_map")
    if model_type is None:
        raise ConfigError("config has no 'model_type': paramscope cannot tell which architecture it describes")
    if not isinstance(model_type, str):
        raise ConfigError(f"config field 'model_type' must be a string, got {model_type!r}")
    validate_config_dict(config_dict)
    if num_labels is not None:
        if not isinstance(num_labels, int) or isinstance(num_labels, bool) or num_labels <= 0:
            raise ConfigError(f"--num-labels must be a positive integer, got {num_labels!r}")
        config_dict.pop("id2label", None)
        config_dict.pop("label2id", None)
        config_dict["num_labels"] = num_labels

    if model_type not in CONFIG_MAPPING:
        if auto_map:
            if not trust_remote_code:
                raise RemoteCodeError(
                    f"model_type {model_type!r} is not in transformers {transformers_version()}; the config's "
                    "auto_map names code from the hub. Rerun with --trust-remote-code to execute it"
                )
            return _remote_config(config_dict, source_path), notes
        raise ConfigError(f"unknown model_type {model_type!r}: not in transformers {transformers_version()}")
    if auto_map:
        config_dict.pop("auto_map")
        notes.append(
            f"auto_map names remote code, but model_type {model_type!r} is native to transformers "
            f"{transformers_version()}: the native class was used, no remote code ran"
        )
    rope = config_dict.get("rope_scaling")
    if isinstance(rope, dict) and rope.get("type") == "su" and "rope_type" not in rope:
        # Phi-3's first 128k configs called LongRoPE "su"; transformers 4 renamed it, transformers 5 rejects it.
        config_dict["rope_scaling"] = {**rope, "type": "longrope"}
        notes.append("rope_scaling type 'su' read as 'longrope' (its later name); it does not change the count")
    quantization = config_dict.pop("quantization_config", None)
    if isinstance(quantization, dict):
        method = quantization.get("quant_method") or "unknown"
        notes.append(
            f"quantization_config ({method}) not applied: logical parameters are counted, and no quantisation "
            "backend is needed (the storage line says how the checkpoint stores them)"
        )
    try:
        config = CONFIG_MAPPING[model_type].from_dict(config_dict)
    except Exception as err:  # transformers' strict validation names the field
        raise ConfigError(f"invalid {model_type} config: {_first_line(err)}") from err
    return config, notes


def _remote_config(config_dict: dict[str, Any], source_path: str | None):
    from pathlib import Path

    from transformers import AutoConfig

    if source_path is None:
        raise RemoteCodeError("remote code can only be loaded from a model directory or hub id")
    try:
        return AutoConfig.from_pretrained(str(Path(source_path).parent), trust_remote_code=True)
    except Exception as err:
        raise RemoteCodeError(f"could not load the remote config code: {_first_line(err)}") from err


def resolve_task(task: str) -> str:
    key = task.strip().lower().replace("_", "-")
    key = TASK_ALIASES.get(key, key)
    if key not in TASKS:
        known = ", ".join(sorted(set(TASKS) | set(TASK_ALIASES)))
        raise ModelClassError(f"unknown task {task!r}; known tasks: {known}")
    return key


def choose_class(config, config_dict: dict[str, Any], *, model_class: str | None = None,
                 task: str | None = None) -> ClassChoice:
    """Which transformers class to build, and why, in words the report can show."""
    import transformers
    from transformers.models.auto import modeling_auto

    model_type = config.model_type
    if model_class and task:
        raise ModelClassError("give --class or --task, not both")
    if model_class:
        cls = getattr(transformers, model_class, None)
        if cls is None or not isinstance(cls, type) or not hasattr(cls, "config_class"):
            raise ModelClassError(f"unknown class {model_class!r}: transformers {transformers.__version__} has no such model class")
        _check_fits(cls, model_type)
        return ClassChoice(model_class, f"--class {model_class}")
    if task:
        key = resolve_task(task)
        mapping_name, description = TASKS[key]
        mapping = getattr(modeling_auto, mapping_name)
        name = mapping.get(model_type)
        if name is None:
            raise ModelClassError(f"task {task!r} ({description}) has no class for model_type {model_type!r}")
        how = f"--task {task}" + (f" (= {key})" if key != task else "")
        return ClassChoice(name, f"{how}: {description}")
    architectures = config_dict.get("architectures") or []
    if architectures:
        name = architectures[0]
        cls = getattr(transformers, name, None) if isinstance(name, str) else None
        if cls is not None and _fits(cls, model_type):
            return ClassChoice(name, "the checkpoint's own class (config architectures[0])")
    if architectures and isinstance(architectures[0], str):
        # A remote-code class name (auto_map) for a native model_type: the native class for the same head.
        for suffix, mapping_name in _HEAD_SUFFIXES:
            if architectures[0].endswith(suffix):
                native = getattr(modeling_auto, mapping_name).get(model_type)
                if isinstance(native, str) and getattr(transformers, native, None) is not None:
                    return ClassChoice(native, f"architectures[0] {architectures[0]!r} is not a transformers class; "
                                               f"{native} is the native class with the same head")
    name = modeling_auto.MODEL_MAPPING_NAMES.get(model_type)
    if name is None:
        raise ModelClassError(f"transformers has no base model class for model_type {model_type!r}")
    why = "no architectures in the config" if not architectures else f"architectures[0] {architectures[0]!r} is not a transformers class"
    return ClassChoice(name, f"AutoModel fallback ({why})")


# architectures[0] suffix → the auto mapping of the same head, for class names transformers does not have.
_HEAD_SUFFIXES = (
    ("ForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("LMHeadModel", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("ForConditionalGeneration", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("ForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("ForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    ("ForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    ("ForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
)


def _fits(cls, model_type: str) -> bool:
    config_class = getattr(cls, "config_class", None)
    return getattr(config_class, "model_type", None) == model_type


def _check_fits(cls, model_type: str) -> None:
    if not _fits(cls, model_type):
        other = getattr(getattr(cls, "config_class", None), "model_type", "?")
        raise ModelClassError(f"class {cls.__name__} is for model_type {other!r}, but the config is {model_type!r}")


@contextlib.contextmanager
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


def build_on_meta(class_name: str, config, *, trust_remote_code: bool = False):
    """Instantiate `class_name` from `config` with every tensor on the meta device: no memory for weights."""
    import torch
    import transformers

    cls = getattr(transformers, class_name, None)
    try:
        with _quiet_transformers(), torch.device("meta"):
            if cls is None and trust_remote_code:
                return transformers.AutoModel.from_config(config, trust_remote_code=True)
            if cls is None:
                raise ModelClassError(f"unknown class {class_name!r}")
            return cls(config)
    except (ModelClassError, RemoteCodeError):
        raise
    except Exception as err:
        raise ConfigError(f"could not build {class_name} from this config: {_first_line(err)}") from err


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__
