"""Templates on a transformers version the package ships none for: the nearest shipped one, checked, then kept.

Templates are exact for the transformers version they were recorded with, so a user on a newer release (5.25 where
the package ships 5.23 and 5.24) would otherwise pay a template's full recording, 30–50 meta builds, for every class
they use. A class rarely changes between minor releases, so after a build has answered a config, the nearest shipped
version's template for its class is checked against two builds instead:

    the build that just answered (this config)   → the template's report must equal it key for key
    one more build, at the template's anchor      → the template's report there must equal that build's too

Only then is it kept in the user cache under the installed version (its spec says which version it came from, and
the report's `engine` line names the check). A template that differs at either config is not kept, and the usual
recording derives one for this version. Nothing is adopted for a version the package ships.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .disk_cache import installed_transformers_version, route_key
from .document_diff import comparable, first_difference
from .formula_spec import set_path
from .template import FORMAT, SHIPPED, lookup_template, report_from_template, shipped_directory, store_template


def shipped_versions() -> list[str]:
    """The transformers versions the package ships templates for, oldest first."""
    try:
        names = [p.name for p in (SHIPPED / f"v{FORMAT}").iterdir() if p.is_dir()]
    except OSError:
        return []
    return sorted(names, key=_version_key)


def _version_key(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def nearest_shipped(version: str) -> str | None:
    """The newest shipped version not newer than `version`, else the oldest shipped one; None when `version` is
    shipped itself or nothing is."""
    shipped = shipped_versions()
    if not shipped or version in shipped:
        return None
    older = [v for v in shipped if _version_key(v) <= _version_key(version)]
    return older[-1] if older else shipped[0]


@dataclasses.dataclass(frozen=True)
class Adoption:
    """What became of a shipped template from another transformers version for this class."""

    kept: Path | None  # where it was kept in the cache; None when it was not
    donor: str | None  # the shipped version it came from
    why_not: str | None = None  # when not kept: the first difference, in words


def adopt_template(report: Any, source: Any, *, model_class: str | None, task: str | None,
                   num_labels: int | None) -> Adoption:
    """Check the nearest shipped version's template for `report`'s class against `report` (a build of `source`)
    and against a build at the template's anchor; keep it for the installed version when both agree."""
    from .api import inspect
    from .render.json import report_to_dict

    version = installed_transformers_version()
    donor = nearest_shipped(version) if version else None
    if donor is None:
        return Adoption(None, None, "templates ship for this transformers version")
    found = lookup_template(source.config, model_class=model_class, task=task, num_labels=num_labels,
                            directories=[shipped_directory(donor)], version=donor)
    template = found.template
    if template is None:
        return Adoption(None, donor, found.why_not or "no shipped template for this class")
    reason = found.class_reason or template.class_reason
    route = route_key(source.config, model_class=model_class, task=task)
    here = report_from_template(template, source, num_labels=num_labels, class_reason=reason)
    difference = _difference(report_to_dict(report), report_to_dict(here))
    if difference:
        return Adoption(None, donor, f"at this config: {difference}")
    anchor_config = json.loads(json.dumps(source.config))
    for symbol, path in template.spec.symbols.items():
        if symbol in template.spec.anchor["values"]:
            set_path(anchor_config, path, template.spec.anchor["values"][symbol])
    anchor_source = dataclasses.replace(source, config=anchor_config)
    built = inspect(anchor_config, model_class=template.class_name, num_labels=num_labels, use_cache=False)
    at_anchor = report_from_template(template, anchor_source, num_labels=num_labels, class_reason=reason)
    difference = _difference(_unlabelled(report_to_dict(built)), _unlabelled(report_to_dict(at_anchor)))
    if difference:
        return Adoption(None, donor, f"at its anchor: {difference}")
    spec = dataclasses.replace(template.spec, transformers_version=version,
                               anchor={**template.spec.anchor, "adopted_from": donor})
    kept = store_template(dataclasses.replace(template, spec=spec), route)
    return Adoption(kept, donor)


def _difference(built: dict[str, Any], answered: dict[str, Any]) -> str | None:
    """The first difference of two report documents, but the engine and the transformers version they name."""
    documents = []
    for document in (built, answered):
        document = comparable(document)
        document["model"] = {k: v for k, v in document["model"].items() if k != "transformers_version"}
        documents.append(document)
    return first_difference(*documents)


def _unlabelled(document: dict[str, Any]) -> dict[str, Any]:
    """A report document without what names where its config came from (the anchor's is built from a dict)."""
    document = dict(document)
    document["model"] = {k: v for k, v in document["model"].items()
                         if k not in ("source", "source_kind", "label", "class_reason", "notes")}
    return document
