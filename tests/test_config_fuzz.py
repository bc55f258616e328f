"""Fuzzing the config loader: any bytes, any JSON, any field values give a config or one ParamscopeError.

Beside tests/test_checkpoint_hostile.py's header fuzzing: the same promise for config.json.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paramscope
from paramscope import ParamscopeError
from paramscope.build import validate_config_dict
from paramscope.sources import read_config_file

from conftest import bert_config

JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=20)
# Values a size field may hold in a hostile file: wrong types, edges, and far too large.
HOSTILE_NUMBERS = st.one_of(
    st.sampled_from([0, -1, 1, 2, 3, 7, 12, 2**31 - 1, 2**31, 2**63, 2**64 + 1, 10**12, 10**40]),
    st.integers(min_value=-(10**6), max_value=10**6), st.booleans(), st.none(), st.floats(), st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
)
SIZE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "max_position_embeddings", "type_vocab_size", "num_labels", "num_key_value_heads", "head_dim")
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(raw=st.binary(max_size=300))
def test_any_bytes_read_as_a_config_or_one_source_error(tmp_path, raw):
    path = tmp_path / "config.json"
    path.write_bytes(raw)
    try:
        config = read_config_file(path)
    except ParamscopeError as err:
        assert "\n" not in str(err)
    else:
        assert isinstance(config, dict)


@FUZZ
@given(document=JSON_VALUES)
def test_any_json_document_reads_or_fails_in_one_line(tmp_path, document):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document))
    try:
        config = read_config_file(path)
    except ParamscopeError as err:
        assert "\n" not in str(err)
    else:
        assert config == document


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(SIZE_FIELDS), HOSTILE_NUMBERS, max_size=6),
       nested=st.booleans())
def test_field_validation_accepts_or_names_the_field(fields, nested):
    config = {"model_type": "bert", **({"text_config": fields} if nested else fields)}
    try:
        validate_config_dict(config)
    except ParamscopeError as err:
        message = str(err)
        assert "\n" not in message and len(message) < 400
        assert any(name in message for name in SIZE_FIELDS), message


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(fields=st.dictionaries(st.sampled_from(SIZE_FIELDS),
                              st.one_of(st.integers(min_value=-2, max_value=40), st.sampled_from([2**31, 10**9])),
                              max_size=4))
def test_fuzzed_small_bert_configs_build_or_refuse(fields):
    """Past validation, the build itself: a report whose invariants hold, or one ParamscopeError."""
    config = bert_config(hidden_size=16, num_attention_heads=2, intermediate_size=32, num_hidden_layers=2,
                         vocab_size=50, max_position_embeddings=16)
    config.update(fields)
    try:
        report = paramscope.inspect(config, model_class="BertModel")
    except ParamscopeError as err:
        assert "\n" not in str(err)
    else:
        assert report.total == sum(report.breakdown.values()) == sum(p.numel for p in report.params)
