"""A transformers version the package ships no templates for: the nearest shipped template, checked, then kept."""

from __future__ import annotations

import pytest

import paramscope
import paramscope.disk_cache as disk_cache
import paramscope.template as template
import paramscope.template_adopt as template_adopt
from paramscope.api import as_source
from paramscope.cli import main

NEWER = "5.99.0"  # a release after every shipped one


@pytest.fixture
def newer_transformers(monkeypatch, tmp_path):
    """This process sees transformers NEWER, with an empty user cache and recording on."""
    for module in (disk_cache, template, template_adopt):
        monkeypatch.setattr(module, "installed_transformers_version", lambda: NEWER)
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PARAMSCOPE_RECORD_TEMPLATES", "wait")
    return tmp_path


def test_the_nearest_shipped_version_is_the_newest_not_newer(monkeypatch):
    monkeypatch.setattr(template_adopt, "shipped_versions", lambda: ["5.9.0", "5.23.0", "5.24.0"])
    assert template_adopt.nearest_shipped("5.25.1") == "5.24.0"
    assert template_adopt.nearest_shipped("5.23.5") == "5.23.0"
    assert template_adopt.nearest_shipped("5.10.0") == "5.9.0"  # numeric, not string, order
    assert template_adopt.nearest_shipped("5.1.0") == "5.9.0"  # older than all: the oldest
    assert template_adopt.nearest_shipped("5.24.0") is None  # shipped: nothing to adopt


def test_a_shipped_template_is_checked_and_kept_for_a_newer_version(newer_transformers, capsys):
    source = as_source("bert-base-uncased")
    assert template.lookup_template(source.config).template is None  # nothing for NEWER yet
    assert main(["inspect", "bert-base-uncased", "--json"]) == 0  # builds, then adopts
    capsys.readouterr()
    kept = template.lookup_template(source.config).template
    assert kept is not None and kept.spec.transformers_version == NEWER
    assert kept.spec.anchor["adopted_from"] == template_adopt.nearest_shipped(NEWER)
    answered = paramscope.inspect("bert-base-uncased")
    built = paramscope.inspect("bert-base-uncased", use_cache=False)
    assert answered.model.engine == "template" and built.model.engine == "build"
    assert answered.parameters.total == built.parameters.total == 109_514_298
    assert dict(answered.breakdown) == dict(built.breakdown)
    assert "kept for 5.99.0 after it equalled this version's builds" in answered.model.engine_detail


def test_a_template_that_differs_from_the_build_is_not_kept(newer_transformers):
    source = as_source("bert-base-uncased")
    other = paramscope.inspect("bert-large-uncased", use_cache=False)  # not what the template gives here
    adoption = template_adopt.adopt_template(other, source, model_class=None, task=None, num_labels=None)
    assert adoption.kept is None and adoption.why_not.startswith("at this config: ")
    assert template.lookup_template(source.config).template is None
