"""Audit a real checkpoint against the architecture its config describes, reading headers only.

Glue: locate the checkpoint (file, directory, Hugging Face cache folder, hub id in the local cache, or hub id
read over HTTP range requests when online) →
`paramscope.inspect` its config → `checkpoint.read_checkpoint` (headers only) → `checkpoint.reconcile` (keys
matched the way transformers loads them) → the counts reconciled (`reconcile_counts`). No tensor data is read,
no weight is downloaded (from the Hub: config.json and the safetensors headers only), and none is allocated.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .errors import SourceError
from .sources import HUB_ID, check_hub_id, snapshot_name
from .report import Report

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Located:
    checkpoint: Path  # a file, an index, or a directory read_checkpoint understands
    config_dir: Path | None  # where config.json sits, when it does
    description: str  # plain words: how the checkpoint was found
    hub_id: str | None = None  # set when the headers are to be read from the Hub itself


@dataclass(frozen=True)
class AuditResult:
    report: Report
    checkpoint: Any  # paramscope.checkpoint.Checkpoint
    audit: Any  # paramscope.checkpoint.Audit
    counts: Any  # paramscope.reconcile_counts.CountsExplanation
    located: Located
    source: Any = None  # the sources.Source the model's config came from (the CLI records a template from it)
    packed: Any = None  # checkpoint.packed.PackedAudit of a quantised checkpoint (or config), else None

    def checkpoint_dict(self) -> dict[str, Any]:
        """The `"checkpoint"` object of `audit --json`."""
        lists = self.long_lists()
        return self._checkpoint_dict({
            key: [packed_dict(t) for t in items] if key == "packed" else [f.to_dict() for f in items]
            for key, items in lists.items()})

    def to_dict(self) -> dict[str, Any]:
        """The inspect JSON of the model, plus `"checkpoint"`."""
        return self.to_dict_with(None)

    def to_dict_with(self, stand_ins: dict[str, Any] | None) -> dict[str, Any]:
        """`to_dict`, or with `stand_ins` (a value for each key of `long_lists`), that document with each of the
        checkpoint's long lists replaced by its stand-in: what `audit --json` writes first, then each list streamed
        in its place (render.audit.iter_audit_json)."""
        from .render.json import report_to_dict

        out = report_to_dict(self.report)
        out["checkpoint"] = self.checkpoint_dict() if stand_ins is None else self._checkpoint_dict(stand_ins)
        return out

    def long_lists(self) -> dict[str, Any]:
        """The lists of `checkpoint_dict` that grow with the checkpoint (a million entries at the bound): the
        findings (`Finding.to_dict` each) and the packed tensors (`packed_dict` each), by key."""
        audit = self.audit
        return {"missing": audit.missing, "unexpected": audit.unexpected, "non_parameters": audit.non_parameters,
                "packed": [t for t in self.checkpoint.tensors if t.role == "packed"]}

    def _checkpoint_dict(self, lists: dict[str, Any]) -> dict[str, Any]:
        ck, audit = self.checkpoint, self.audit
        out = {"path": ck.path, "format": ck.format, "files": list(ck.files), "tensors": len(ck.tensors),
               "found": self.located.description}
        # Audit.to_dict without its long lists (they are `lists`' values, in the same places).
        out.update(replace(audit, missing=(), unexpected=(), non_parameters=()).to_dict())
        out["complete"] = bool(audit.complete)
        out["packed"] = []
        out["counts"] = self.counts.to_dict()
        if self.packed is not None:
            out["quantization"] = self.packed.to_dict()
        out.update(lists)  # each key is in place already: the order of the keys stays
        return out


def packed_dict(t: Any) -> dict[str, Any]:
    """A packed tensor in `audit --json`'s `"packed"` list."""
    return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "stored_elements": t.numel,
            "logical_elements": t.logical_numel, "packing": t.packing, "note": t.note}


def locate_checkpoint(spec: str | os.PathLike[str], *, revision: str | None = None) -> Located:
    """Find a checkpoint: a file, a directory, a cache folder (models--org--name), or a hub id: in the local
    cache when a checkpoint of it is there, else on the Hub (headers only) when the Hub can be reached."""
    text = os.fspath(spec).strip() if not isinstance(spec, str) else spec.strip()
    if not text:
        raise SourceError("empty checkpoint path: give a file, a directory or a hub id")
    path = Path(text).expanduser()
    if path.is_dir():
        snapshot = _cache_snapshot(path, revision)
        if snapshot is not None:
            return Located(snapshot, snapshot if (snapshot / "config.json").is_file() else None,
                           f"cache folder {path}, snapshot {snapshot.name}")
        return Located(path, path if (path / "config.json").is_file() else None, f"directory {path}")
    if path.exists():  # a file; read_checkpoint refuses anything else (a FIFO, a device) in one line
        parent = path.parent
        return Located(path, parent if (parent / "config.json").is_file() else None, f"file {path}")
    if HUB_ID.match(text) and not text.endswith((".json", ".safetensors", ".bin")):
        from huggingface_hub import constants

        check_hub_id(text)
        cache = Path(constants.HF_HUB_CACHE)
        repo = cache / ("models--" + text.replace("/", "--"))
        snapshot = _cache_snapshot(repo, revision) if repo.is_dir() else None
        if snapshot is not None and not _has_checkpoint(snapshot):
            snapshot = None  # a cache that holds only config.json (paramscope inspect put it there)
        if snapshot is None:
            from .sources import hub_offline_reason

            why = hub_offline_reason()  # HF_HUB_OFFLINE, or the quick connect's bound, named
            if why is None:
                return Located(Path(text), None, f"hub id {text}: safetensors headers read from the Hub", hub_id=text)
            raise SourceError(
                f"hub id {text}: {why}, and no checkpoint of it is in the local cache ({cache}); download it "
                "first or give a path"
            )
        return Located(snapshot, snapshot if (snapshot / "config.json").is_file() else None,
                       f"hub id {text}, local cache snapshot {snapshot.name}")
    raise SourceError(f"no such file or directory: {text}")


def audit(path_or_id: str | os.PathLike[str], *, config: Any = None, model_class: str | None = None,
          task: str | None = None, num_labels: int | None = None, trust_remote_code: bool = False,
          revision: str | None = None, use_cache: bool = True) -> AuditResult:
    """Reconcile the checkpoint at `path_or_id` with the model its config (or `config`) describes.

    `config` may be anything `paramscope.inspect` takes (preset, config.json, directory, hub id, dict); without
    it, the config.json next to the checkpoint is used. `use_cache=False` builds the model on meta even where a
    structure template would answer.
    """
    from . import progress
    from .api import as_source, inspect_source
    from .checkpoint import read_checkpoint

    located = locate_checkpoint(path_or_id, revision=revision)
    if located.hub_id is not None:
        from .checkpoint import read_hub_checkpoint

        with progress.status(f"reading the safetensors headers of {located.hub_id} from the Hub"):
            checkpoint = read_hub_checkpoint(located.hub_id, revision=revision)
        if config is None:
            from .sources import resolve

            config = resolve(located.hub_id, revision=revision)  # config.json only
    else:
        # the checkpoint first: a folder that holds none (an empty `x.gguf/`) is named so, not sent for a config
        with progress.status(f"reading the checkpoint's headers ({located.checkpoint})"):
            checkpoint = read_checkpoint(located.checkpoint)
        if config is None:
            if located.config_dir is None:
                raise SourceError("no config.json next to checkpoint {checkpoint}: name the model with {0}", "config",
                                  checkpoint=located.checkpoint)
            config = str(located.config_dir)
    from .checkpoint.packed import read_shape_records, with_shape_records

    records = read_shape_records(checkpoint)  # compressed-tensors' weight_shape: 16 bytes each, local files only
    checkpoint = with_shape_records(checkpoint, records)
    config_revision = None if located.config_dir else revision
    # A template answers without torch, with stand-in modules enough for the conventions the audit reports: a
    # 100 MB header is then audited without building the model (3.5 s of its budget).
    source = as_source(config, config_revision)
    report, counted = inspect_source(source, model_class=model_class, task=task, num_labels=num_labels,
                                     trust_remote_code=trust_remote_code, use_cache=use_cache)
    quantization = source.config.get("quantization_config") if isinstance(source.config, dict) else None
    return replace(audit_report(report, checkpoint, module=counted, located=located, quantization_config=quantization,
                                shape_records=records), source=source)


def audit_report(report: Report, checkpoint: Any, *, module: Any = None, located: Located | None = None,
                 quantization_config: Any = None, shape_records: Any = None) -> AuditResult:
    """Pure glue: reconcile `checkpoint` with the parameters, ties and buffers of `report`; a quantised one (or one
    whose config declares quantisation) is also reconciled per role and checked against `quantization_config`."""
    from . import progress
    from .checkpoint import reconcile
    from .reconcile_counts import reconcile_counts
    from .safe_io import gc_paused

    expected = {p.name: p.shape for p in report.params}
    aliases = {alias: p.name for p in report.params for alias in p.aliases}
    # gc paused: a million findings would start the cyclic collector over and over (4.8 s → 2.4 s)
    with progress.status(f"matching {len(checkpoint.tensors):,} checkpoint tensors with {report.model.class_name}"), \
            gc_paused():
        result = reconcile(
            checkpoint,
            expected,
            expected_buffers=[b.name for b in report.buffers],
            tied_aliases=aliases,
            base_model_prefix=_prefix(report),
            model_class=report.model.class_name,
        )
        counts = reconcile_counts(report, module, checkpoint=checkpoint, audit=result)
    if located is None:
        path = Path(checkpoint.path)
        located = Located(path, None, f"file {path}")
    return AuditResult(report, checkpoint, result, counts, located,
                       packed=_packed(report, checkpoint, result, quantization_config, shape_records or {}))


def _packed(report: Report, checkpoint: Any, result: Any, quantization_config: Any, records: Any) -> Any:
    from .checkpoint.packed import analyse, is_quantised

    if not is_quantised(checkpoint, quantization_config):
        return None
    parameter_of = dict(result.renamed)
    loaded = set(parameter_of.values())
    parameter_of.update((name, name) for name in result.matched if name not in loaded)
    roles = {p.name: p.role for p in report.params}
    shapes = {p.name: p.shape for p in report.params}
    canonical = {alias: p.name for p in report.params for alias in p.aliases}
    parameter_of = {key: canonical.get(name, name) for key, name in parameter_of.items()}  # a tied copy: its owner
    return analyse(checkpoint, parameter_of=parameter_of, roles=roles, shapes=shapes,
                   quantization_config=quantization_config, shape_records=records)


def _prefix(report: Report) -> str:
    prefix = getattr(report.model, "base_model_prefix", None)
    return prefix or ""


def _has_checkpoint(snapshot: Path) -> bool:
    return any(snapshot.glob("*.safetensors")) or any(snapshot.glob("*.index.json")) or any(snapshot.glob("*.bin"))


def _cache_snapshot(repo: Path, revision: str | None) -> Path | None:
    """The snapshot folder of a Hugging Face cache repo folder (models--org--name), or None if it is not one."""
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    if revision and _COMMIT.match(revision) and (snapshots / revision).is_dir():
        return snapshots / revision
    ref = repo / "refs" / (revision or "main")
    if ref.exists():
        commit = snapshot_name(ref)
        if (snapshots / commit).is_dir():
            return snapshots / commit
    if revision:
        raise SourceError(f"{repo}: no snapshot for revision {revision!r} in the local cache")
    found = sorted(p for p in snapshots.iterdir() if p.is_dir())
    if len(found) == 1:
        return found[0]
    return None
