"""A config dict read into transformers' PretrainedConfig (make_config), its sizes checked first, with notes on
what reading it decided (config_notes, torch-free, and extra_config_notes: fields describing weights transformers
does not build); a remote-code config read by its own class (remote_code.py)."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, RemoteCodeError, short_repr
from .field_checks import WINDOW_FIELDS
from .quiet import first_line, quiet_transformers
from .remote_code import names_remote_config, remote_config, remote_refusal
from .size_checks import check_num_labels, validate_config_dict


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def make_config(config_dict: dict[str, Any], *, num_labels: int | None = None, trust_remote_code: bool = False,
                code_location: str | None = None, model_class: str | None = None):
    """A PretrainedConfig for `config_dict`, plus notes on what was decided along the way.

    `code_location` is where a remote-code config's auto_map modules live: the folder of the config file given, or
    the hub id it came from. `model_class` lets a native class read a config whose model_type transformers lacks.
    """
    notes: list[str] = []
    config_dict = dict(config_dict)
    model_type = config_dict.get("model_type")
    auto_map = config_dict.get("auto_map")
    if model_type is None:
        raise ConfigError("config has no 'model_type': paramscope cannot tell which architecture it describes")
    validate_config_dict(config_dict)  # before importing transformers: bad input costs milliseconds
    check_num_labels(num_labels)
    from transformers import CONFIG_MAPPING

    if num_labels is not None:
        config_dict.pop("id2label", None)
        config_dict.pop("label2id", None)
        config_dict["num_labels"] = num_labels

    config_class = None
    if model_type not in CONFIG_MAPPING:
        native = _native_class(model_class)
        if native is not None:
            config_class = native.config_class
            config_dict.pop("auto_map", None)
            notes.append(f"model_type {model_type!r} is not in transformers {transformers_version()}; the config "
                         f"was read with {config_class.__name__}, the config class of --class {model_class}; "
                         "no remote code ran")
            notes.extend(config_notes(config_dict, transformers_version()))
        elif isinstance(auto_map, dict) and auto_map:
            if not trust_remote_code:
                raise RemoteCodeError(remote_refusal(model_type, auto_map, config_dict))
            return remote_config(config_dict, auto_map, code_location), notes
        else:
            raise ConfigError(f"unknown model_type {short_repr(model_type)}: not in transformers "
                              f"{transformers_version()}")
    elif trust_remote_code and names_remote_config(auto_map) and code_location is not None \
            and _native_class(model_class) is None:
        # transformers' AutoConfig, trusted, reads a config whose auto_map names an AutoConfig with that remote class
        # even when model_type is native, and the Auto model classes then build auto_map's class: so does the flag.
        try:
            config = remote_config(config_dict, auto_map, code_location)
        except RemoteCodeError as err:
            raise RemoteCodeError("{error} (without {0}, transformers' own {config_class} reads this config)",
                                  "trust_remote_code", error=str(err),
                                  config_class=CONFIG_MAPPING[model_type].__name__) from err
        notes.append(f"model_type {model_type!r} is native to transformers {transformers_version()}, but with "
                     "--trust-remote-code the config's auto_map classes were used, as transformers' Auto classes do")
        return config, notes
    else:
        notes.extend(config_notes(config_dict, transformers_version()))
        if trust_remote_code and isinstance(auto_map, dict) and auto_map and code_location is None:
            notes.append("--trust-remote-code: this source (an embedded preset or a config object) carries no code "
                         "files, so auto_map's classes could not be loaded and none ran")
        config_dict.pop("auto_map", None)
    rope = config_dict.get("rope_scaling")
    if isinstance(rope, dict) and rope.get("type") == "su" and "rope_type" not in rope:
        # Phi-3's first 128k configs called LongRoPE "su"; transformers 4 renamed it, transformers 5 rejects it.
        config_dict["rope_scaling"] = {**rope, "type": "longrope"}
    config_dict.pop("quantization_config", None)
    if config_class is None:
        config_class = CONFIG_MAPPING[model_type]
    else:
        config_dict.pop("model_type")
    try:
        with quiet_transformers():
            config = config_class.from_dict(config_dict)
    except Exception as err:  # transformers' strict validation names the field
        raise ConfigError(f"invalid {config_class.model_type or model_type} config: {first_line(err)}") from err
    return config, notes


def config_notes(config_dict: dict[str, Any], version: str) -> tuple[str, ...]:
    """What reading a config of a native model_type decides along the way, in words (torch-free: templates
    give the same notes as a build)."""
    notes = []
    model_type = config_dict.get("model_type")
    if config_dict.get("auto_map"):
        notes.append(f"auto_map names remote code, but model_type {model_type!r} is native to transformers "
                     f"{version}: the native class was used, no remote code ran")
    rope = config_dict.get("rope_scaling")
    if isinstance(rope, dict) and rope.get("type") == "su" and "rope_type" not in rope:
        notes.append("rope_scaling type 'su' read as 'longrope' (its later name); it does not change the count")
    quantization = config_dict.get("quantization_config")
    if isinstance(quantization, dict):
        method = quantization.get("quant_method") or "unknown"
        notes.append(
            f"quantization_config ({method}) not applied: logical parameters are counted, and no quantisation "
            "backend is needed (the storage line says how the checkpoint stores them)"
        )
    return tuple(notes)


def extra_config_notes(config: dict[str, Any]) -> tuple[str, ...]:
    """Config fields that describe weights transformers does not build, so the reader knows they are not counted."""
    notes = []
    for key in WINDOW_FIELDS:
        if config.get(key) == 0 and type(config.get(key)) is int:
            notes.append(f"{key}=0: no window, as transformers reads it; every layer attends to every token")
    labels, num_labels = config.get("id2label"), config.get("num_labels")
    if isinstance(labels, dict) and type(num_labels) is int and num_labels != len(labels):
        notes.append(f"num_labels={num_labels} and id2label's {len(labels)} labels disagree: transformers builds "
                     f"{num_labels} labels (it warns, and names them LABEL_0 …), and so does paramscope")
    mtp = config.get("num_nextn_predict_layers")
    if isinstance(mtp, int) and not isinstance(mtp, bool) and mtp > 0:
        notes.append(f"num_nextn_predict_layers={mtp}: the multi-token-prediction module ships in the checkpoint "
                     "but is not part of the transformers model, so it is not counted")
    return tuple(notes)


def _native_class(model_class: str | None):
    """The transformers class called `model_class`, if it is one (used to read an unknown model_type)."""
    if not model_class:
        return None
    import transformers

    cls = getattr(transformers, model_class, None)
    return cls if isinstance(cls, type) and getattr(cls, "config_class", None) is not None else None
