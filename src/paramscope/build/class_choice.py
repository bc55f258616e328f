"""Which class to build, and why, in words the report can show (choose_class): --class, --task (TASKS, and the
use-case names in TASK_ALIASES), the config's architectures[0], a remote-code class from auto_map, else AutoModel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ModelClassError

# Pipeline task names and the notes' use-case names → transformers' auto-model mapping, what it builds in words,
# and the auto class whose auto_map entry names a remote-code model's class for it.
TASKS: dict[str, tuple[str, str, str]] = {
    "feature-extraction": ("MODEL_MAPPING_NAMES", "the bare model (AutoModel)", "AutoModel"),
    "text-classification": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "sequence classification",
                            "AutoModelForSequenceClassification"),
    "token-classification": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "token classification",
                             "AutoModelForTokenClassification"),
    "fill-mask": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "masked language modelling", "AutoModelForMaskedLM"),
    "question-answering": ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "extractive question answering",
                           "AutoModelForQuestionAnswering"),
    "multiple-choice": ("MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES", "multiple choice", "AutoModelForMultipleChoice"),
    "pretraining": ("MODEL_FOR_PRETRAINING_MAPPING_NAMES", "pretraining heads", "AutoModelForPreTraining"),
    "next-sentence-prediction": ("MODEL_FOR_NEXT_SENTENCE_PREDICTION_MAPPING_NAMES", "next-sentence prediction",
                                 "AutoModelForNextSentencePrediction"),
    "text-generation": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "causal language modelling (generation)",
                        "AutoModelForCausalLM"),
    "text2text-generation": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "sequence-to-sequence generation",
                             "AutoModelForSeq2SeqLM"),
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


@dataclass(frozen=True)
class ClassChoice:
    name: str
    reason: str
    code_ref: str | None = None  # auto_map reference of a remote-code class ("modeling_x.MyModel")


def resolve_task(task: str) -> str:
    key = task.strip().lower().replace("_", "-")
    key = TASK_ALIASES.get(key, key)
    if key not in TASKS:
        known = ", ".join(sorted(set(TASKS) | set(TASK_ALIASES)))
        raise ModelClassError(f"unknown task {task!r}; known tasks: {known}")
    return key


def choose_class(config, config_dict: dict[str, Any], *, model_class: str | None = None,
                 task: str | None = None, remote_code: bool = False) -> ClassChoice:
    """Which transformers class to build, and why, in words the report can show.

    `remote_code`: --trust-remote-code was given and the source has code files to load. Then, as transformers'
    Auto classes do, auto_map's entry for the auto class asked for wins over the native class."""
    import transformers
    from transformers.models.auto import modeling_auto

    model_type = config.model_type
    if model_class and task:
        raise ModelClassError("give {0} or {1}, not both", "model_class", "task")
    if not type(config).__module__.startswith("transformers."):
        return _remote_choice(config_dict.get("auto_map") or {}, config_dict, model_class, task)
    if remote_code and isinstance(config_dict.get("auto_map"), dict):
        choice = _remote_for_native_config(config_dict["auto_map"], config_dict, model_class, task)
        if choice is not None:
            return choice
    if model_class:
        cls = getattr(transformers, model_class, None)
        if cls is None or not isinstance(cls, type) or not hasattr(cls, "config_class"):
            raise ModelClassError(f"unknown class {model_class!r}: transformers {transformers.__version__} has no such model class")
        _check_fits(cls, model_type)
        return ClassChoice(model_class, f"--class {model_class}")
    if task:
        key = resolve_task(task)
        mapping_name, description, _ = TASKS[key]
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


def _remote_choice(auto_map: dict[str, Any], config_dict: dict[str, Any], model_class: str | None,
                   task: str | None) -> ClassChoice:
    """A remote-code model's class: the auto_map entry for --class, --task, architectures[0], else AutoModel."""
    references = {key: ref for key, ref in auto_map.items() if isinstance(ref, str) and key != "AutoConfig"}
    by_class = {ref.rsplit(".", 1)[-1]: ref for ref in references.values()}
    if model_class:
        if model_class not in by_class:
            raise ModelClassError("{0} {model_class}: the config's auto_map names no such class (it names {named})",
                                  "model_class", model_class=model_class, named=", ".join(by_class) or "none")
        return ClassChoice(model_class, f"--class {model_class} (remote code {by_class[model_class]})",
                           by_class[model_class])
    if task:
        key = resolve_task(task)
        auto_class = TASKS[key][2]
        if auto_class not in references:
            raise ModelClassError(f"task {task!r} needs auto_map[{auto_class!r}], which the config does not name")
        ref = references[auto_class]
        return ClassChoice(ref.rsplit(".", 1)[-1], f"--task {task}: auto_map[{auto_class!r}] = {ref} (remote code)",
                           ref)
    architectures = config_dict.get("architectures") or []
    if architectures and architectures[0] in by_class:
        return ClassChoice(architectures[0], f"the checkpoint's own class (config architectures[0]), remote code "
                                             f"{by_class[architectures[0]]}", by_class[architectures[0]])
    if "AutoModel" in references:
        ref = references["AutoModel"]
        return ClassChoice(ref.rsplit(".", 1)[-1], f"auto_map['AutoModel'] = {ref} (remote code)", ref)
    raise ModelClassError("the config's auto_map names no model class to build (no AutoModel entry, and "
                          "architectures[0] is not among its classes)")


def _remote_for_native_config(auto_map: dict[str, Any], config_dict: dict[str, Any], model_class: str | None,
                              task: str | None) -> ClassChoice | None:
    """The remote class transformers' Auto class would build from a native config whose auto_map names model
    classes but no AutoConfig (so transformers' own config class read it), or None when it would build the native
    class: --class naming a transformers class, or an auto class that auto_map does not name."""
    import transformers

    references = {key: ref for key, ref in auto_map.items() if isinstance(ref, str) and key != "AutoConfig"}
    by_class = {ref.rsplit(".", 1)[-1]: ref for ref in references.values()}
    if model_class:
        if model_class in by_class and not isinstance(getattr(transformers, model_class, None), type):
            return ClassChoice(model_class, f"--class {model_class} (remote code {by_class[model_class]})",
                               by_class[model_class])
        return None
    if task:
        auto_class = TASKS[resolve_task(task)][2]
        ref = references.get(auto_class)
        return None if ref is None else ClassChoice(
            ref.rsplit(".", 1)[-1], f"--task {task}: auto_map[{auto_class!r}] = {ref} (remote code)", ref)
    architectures = config_dict.get("architectures") or []
    if architectures and architectures[0] in by_class:
        return ClassChoice(architectures[0], f"the checkpoint's own class (config architectures[0]), remote code "
                                             f"{by_class[architectures[0]]}", by_class[architectures[0]])
    native = architectures and isinstance(architectures[0], str) and hasattr(transformers, architectures[0])
    if "AutoModel" in references and not native:  # the native choice would be AutoModel's: auto_map's wins
        ref = references["AutoModel"]
        return ClassChoice(ref.rsplit(".", 1)[-1], f"auto_map['AutoModel'] = {ref} (remote code)", ref)
    return None


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
