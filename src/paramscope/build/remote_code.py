"""Remote code (a model repo's own config and model classes, named by auto_map): the class imported from the
config file's folder or the Hub, offline first (remote_class); a remote config read by its class; and why a remote
config is refused without --trust-remote-code."""

from __future__ import annotations

import os
from typing import Any

from ..errors import RemoteCodeError, short_repr
from .quiet import first_line, quiet_transformers

# The endings of transformers' model classes (not its configs, tokenizers or PreTrainedModel bases).
_MODEL_CLASS_SUFFIXES = ("Model", "ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "ForMaskedLM",
                         "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
                         "ForMultipleChoice", "ForPreTraining", "ForImageClassification")


def names_remote_config(auto_map: Any) -> bool:
    """Whether `auto_map` names a remote config class, which is what makes transformers read the config with it."""
    return isinstance(auto_map, dict) and isinstance(auto_map.get("AutoConfig"), str)


def remote_refusal(model_type: str, auto_map: dict[str, Any], config_dict: dict[str, Any]) -> str:
    """Why a remote-code config is refused, and the way forward: --class when transformers has the class."""
    import transformers

    named = [ref.rsplit(".", 1)[-1] for ref in auto_map.values() if isinstance(ref, str) and "." in ref]
    architectures = config_dict.get("architectures") or []
    # transformers lists its names without importing their modules (and torch): a refusal stays quick
    exported = set(dir(transformers))
    natives = [name for name in dict.fromkeys([*architectures, *named])
               if name in exported and name.endswith(_MODEL_CLASS_SUFFIXES) and not name.endswith("PreTrainedModel")]
    message = (f"model_type {short_repr(model_type)} is not in transformers {transformers.__version__}; the config's "
               "auto_map names code from the model's repo. Rerun with --trust-remote-code to execute it")
    if natives:
        message += (f", or with --class {natives[0]} to build transformers' own {natives[0]} from this config "
                    "(no remote code runs)")
    return message


def remote_config(config_dict: dict[str, Any], auto_map: dict[str, Any], code_location: str | None):
    """The config class auto_map names, from `code_location`, reading exactly `config_dict` (the file given)."""
    reference = auto_map.get("AutoConfig")
    if not isinstance(reference, str):
        raise RemoteCodeError("the config's auto_map names no AutoConfig class, so its remote code cannot read it")
    config_class = remote_class(reference, code_location)
    try:
        with quiet_transformers():
            return config_class.from_dict(config_dict)
    except Exception as err:  # broad on purpose: remote code raises what it likes; the error names it
        raise RemoteCodeError(f"the remote config class {reference} rejects this config: {first_line(err)}") from err


def remote_class(reference: str, code_location: str | None):
    """The class `reference` ("modeling_x.MyModel") names, imported from the module file at `code_location`."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    if code_location is None:
        raise RemoteCodeError("remote code can only be loaded from a model directory, a config file's folder or a "
                              "hub id")
    # Offline first, as a hub id's config is read (sources.hub_offline_reason): code on the Hub (a "repo--module.Class"
    # reference, or a hub id's own files) is fetched only when HF_HUB_OFFLINE is unset and the Hub answers one quick
    # connect; otherwise only the local cache is read, and a miss is one line at once (huggingface_hub would retry a
    # dead connection five times, about 25 s, printing each).
    from ..sources import hub_offline, hub_offline_reason

    offline_because = None
    if "--" in reference or not os.path.isdir(code_location):
        offline_because = hub_offline_reason()
    try:
        with quiet_transformers(), hub_offline(offline_because is not None):
            return get_class_from_dynamic_module(reference, code_location, local_files_only=offline_because is not None)
    except Exception as err:  # broad on purpose: importing remote code runs it; the error names what it raised
        if offline_because is not None and isinstance(err, OSError):
            from huggingface_hub import constants

            raise RemoteCodeError(f"could not load remote code {reference} from {code_location}: {offline_because}, "
                                  f"and the code is not in the local cache ({constants.HF_HUB_CACHE}); nothing ran") \
                from None
        raise RemoteCodeError(f"could not load remote code {reference} from {code_location}: "
                              f"{first_line(err)}") from err
