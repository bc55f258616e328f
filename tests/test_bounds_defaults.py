"""The bounds refuse hostile configs, never real architectures: every configuration class transformers ships
passes validation with its own defaults, except a few whose defaults are not a buildable model as written."""

from __future__ import annotations

import warnings

from paramscope.build import validate_config_dict
from paramscope.errors import ParamscopeError

# Defaults whose dict does not give the head size their real checkpoints give (GLM-4.5 and Qwen3-Omni ship
# head_dim 128 in config.json); refused as written, with a message naming the two fields.
REFUSED_DEFAULTS = {"glm4_moe", "glm4v_moe_text", "qwen3_omni_moe_text"}


def test_every_transformers_default_config_passes_the_bounds():
    from transformers import CONFIG_MAPPING
    from transformers.utils import logging

    refused, checked = {}, 0
    previous = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for model_type in list(CONFIG_MAPPING.keys()):
                try:
                    config = CONFIG_MAPPING[model_type]().to_dict()
                except Exception:  # a few classes need arguments to exist at all
                    continue
                checked += 1
                try:
                    validate_config_dict(config)
                except ParamscopeError as err:
                    refused[model_type] = str(err)
    finally:
        logging.set_verbosity(previous)
    assert checked > 700
    assert set(refused) <= REFUSED_DEFAULTS, {k: v for k, v in refused.items() if k not in REFUSED_DEFAULTS}
    assert all("is not divisible by" in message for message in refused.values())
