"""Bounded audits (issue 27 §11): a checkpoint of more than MAX_TENSORS tensors is refused while its header is parsed,
with the bound in the message; up to it, every answer (text, --all, --json) is what it always was, made by paths
that cost seconds and a few hundred MB at a million tensors. Timings live in bench/bench_header.py and
docs/benchmarks.md, never here: these tests check outcomes and texts.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramscope.audit import audit, audit_report
from paramscope.checkpoint import Checkpoint, CheckpointTensor, read, read_checkpoint
from paramscope.checkpoint.tensors import make_tensor
from paramscope.errors import CheckpointError
from paramscope.presets import find_preset
from paramscope.render import audit as render_audit

BERT = find_preset("bert-base-uncased").load_config()


def header_file(path: Path, entries: list[tuple[str, str]], data: int = 0) -> Path:
    """A safetensors file whose header is the JSON object of `entries` (name, raw JSON of its value), written as
    given: key order, duplicates and odd values included."""
    raw = ("{" + ",".join(f"{json.dumps(name)}:{value}" for name, value in entries) + "}").encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data)
    return path


def zero_size(n: int, prefix: str = "layer") -> list[tuple[str, str]]:
    return [(f"{prefix}.{i}", '{"dtype":"F32","shape":[0],"data_offsets":[0,0]}') for i in range(n)]


def checkpoint_folder(folder: Path, entries: list[tuple[str, str]], data: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    header_file(folder / "model.safetensors", entries, data)
    (folder / "config.json").write_text(json.dumps(BERT))
    return folder


# ---------------------------------------------------------------------------------------------
# The bound
# ---------------------------------------------------------------------------------------------


def test_the_bound_is_a_million_tensors():
    assert read.MAX_TENSORS == 1_000_000


@pytest.fixture
def bound_of_100(monkeypatch):
    monkeypatch.setattr(read, "MAX_TENSORS", 100)
    return 100


def test_a_header_over_the_bound_is_refused_with_the_bound(tmp_path, bound_of_100):
    path = header_file(tmp_path / "model.safetensors", zero_size(101))
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    assert str(info.value) == (f"{path}: more than 100 tensors, the most paramscope audits in one checkpoint "
                               "(the largest real checkpoints hold a few hundred thousand)")
    assert read_checkpoint(header_file(tmp_path / "ok.safetensors", zero_size(100))).tensors[99].name == "layer.99"
    metadata = [("__metadata__", '{"format":"pt"}')]
    assert len(read_checkpoint(header_file(tmp_path / "meta.safetensors", metadata + zero_size(100))).tensors) == 100


def test_the_parse_stops_at_the_bound(tmp_path, bound_of_100):
    """What follows the bound is never parsed: a name given twice after it, or broken JSON, is not reached."""
    twice = zero_size(150) + [("layer.0", '{"dtype":"F32","shape":[0],"data_offsets":[0,0]}')]
    for name, entries in (("twice", twice), ("broken", zero_size(150) + [("x", "{not json")])):
        path = header_file(tmp_path / f"{name}.safetensors", entries)
        with pytest.raises(CheckpointError, match="more than 100 tensors"):
            read_checkpoint(path)


def test_shards_count_together(tmp_path, bound_of_100):
    """The index names one tensor of each shard (transformers loads the others too): the shards' own count, 120."""
    names = {}
    for shard in ("a", "b"):
        header_file(tmp_path / f"{shard}.safetensors", zero_size(60, prefix=shard))
        names[f"{shard}.0"] = f"{shard}.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": names}))
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(tmp_path)
    assert str(info.value) == (f"{tmp_path / 'b.safetensors'}: more than 100 tensors with the 60 of the shards "
                               "before it, the most paramscope audits in one checkpoint (the largest real "
                               "checkpoints hold a few hundred thousand)")


def test_hub_headers_count_too(bound_of_100):
    from types import SimpleNamespace

    from paramscope.checkpoint import checkpoint_from_hub_metadata

    def file(prefix, n):
        info = SimpleNamespace(dtype="F32", shape=[0], data_offsets=[0, 0])
        return SimpleNamespace(tensors={f"{prefix}.{i}": info for i in range(n)})

    metadata = SimpleNamespace(files_metadata={"a.safetensors": file("a", 60), "b.safetensors": file("b", 60)},
                               weight_map={}, metadata=None, sharded=True)
    with pytest.raises(CheckpointError, match=r"hub:org/x/b\.safetensors: more than 100 tensors with the 60 "):
        checkpoint_from_hub_metadata("hub:org/x", metadata)


def test_the_cli_refuses_in_one_line(tmp_path, bound_of_100, capsys):
    from paramscope.cli import main

    folder = checkpoint_folder(tmp_path / "ckpt", zero_size(101))
    assert main(["audit", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err == (f"paramscope: error: {folder / 'model.safetensors'}: more than 100 tensors, the most paramscope "
                   "audits in one checkpoint (the largest real checkpoints hold a few hundred thousand)\n")


def test_the_issues_header_of_1_2_million_zero_size_tensors_is_refused(tmp_path):
    """The issue's 72 MB header: 1.2 million zero-size tensors, legal, under the 100 MB cap."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    raw = ("{" + ",".join(f'"t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}' for i in range(1_200_000))
           + "}").encode()
    assert 60e6 < len(raw) < 100e6
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    (folder / "config.json").write_text(json.dumps(BERT))
    out = subprocess.run([sys.executable, "-m", "paramscope", "audit", str(folder)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (f"paramscope: error: {folder / 'model.safetensors'}: more than 1,000,000 tensors, the most "
                          "paramscope audits in one checkpoint (the largest real checkpoints hold a few hundred "
                          "thousand)\n")


# ---------------------------------------------------------------------------------------------
# Reading: the entries digested while parsing read as _parse_entry reads them
# ---------------------------------------------------------------------------------------------

SHAPES = st.one_of(st.lists(st.integers(0, 3), max_size=3).map(json.dumps),
                   st.sampled_from(["[true]", "[-1]", "[1.0]", '"2"', "[[1]]", "[]", "null", "[2,2,2,2,2,1]"]))
DTYPES = st.sampled_from(['"F32"', '"BF16"', '"U8"', '"F4"', '"BOOL"', '"X"', "1", "null"])


@st.composite
def entries(draw):
    """A header's entries: mostly well-formed (contiguous offsets), with stray orders, keys and values."""
    out = []
    offset = 0
    for i in range(draw(st.integers(0, 6))):
        dtype, shape = draw(DTYPES), draw(SHAPES)
        try:
            numel = 1
            for d in json.loads(shape):
                numel *= d
            size = numel * {'"F32"': 4, '"BF16"': 2, '"U8"': 1, '"BOOL"': 1}.get(dtype, 0)
        except Exception:
            size = 0
        begin, end = offset, offset + (size if isinstance(size, int) else 0)
        end += draw(st.sampled_from([0, 0, 0, 1, -1]))
        offset = max(end, offset)
        fields = [("dtype", dtype), ("shape", shape), ("data_offsets", f"[{begin},{end}]")]
        fields = draw(st.permutations(fields)) if draw(st.booleans()) else fields
        if draw(st.integers(0, 9)) == 0:
            fields = fields[:draw(st.integers(0, 2))] + draw(st.sampled_from([[], [("extra", "1")], [fields[0]]]))
        value = "{" + ",".join(f'"{k}":{v}' for k, v in fields) + "}"
        out.append((draw(st.sampled_from(["w", "dtype", "shape", "a.b", "ü", "__metadata__"])) + str(i), value))
    if draw(st.booleans()):
        out.append(draw(st.sampled_from([("__metadata__", '{"format":"pt"}'), ("__metadata__", '{"dtype":"F32",'
                                         '"shape":[0],"data_offsets":[0,0]}'), ("t", '{"dtype":{"dtype":"F32",'
                                         '"shape":[0],"data_offsets":[0,0]},"shape":[0],"data_offsets":[0,0]}')])))
    return out, offset


def read_outcome(path: Path):
    try:
        ck = read_checkpoint(path)
    except CheckpointError as err:
        return str(err)
    return [(t.name, t.dtype, t.shape, t.numel, t.nbytes, t.role, t.logical_numel) for t in ck.tensors], ck.metadata


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=entries())
def test_digested_entries_read_as_parse_entry_reads_them(tmp_path_factory, monkeypatch, case):
    items, data = case
    folder = tmp_path_factory.mktemp("h")
    path = header_file(folder / "model.safetensors", items, max(data, 0))
    digested = read_outcome(path)
    with monkeypatch.context() as m:  # every entry left a dict, for _parse_entry alone
        m.setattr(read, "_Entry", type("_Never", (tuple,), {}))
        m.setattr(read, "_entry_hook", lambda *a: __import__("paramscope.safe_io").safe_io.reject_duplicates)
        plain = read_outcome(path)
    assert digested == plain


def test_a_whole_header_shaped_like_an_entry_is_read_as_the_object_it_is(tmp_path):
    path = header_file(tmp_path / "x.safetensors",
                       [("dtype", '"F32"'), ("shape", "[1]"), ("data_offsets", "[0,4]")], data=4)
    with pytest.raises(CheckpointError, match=r"tensor 'data_offsets': entry must be a JSON object, got an array"):
        read_checkpoint(path)


def test_a_nested_entry_is_quoted_as_json_in_a_message(tmp_path):
    path = header_file(tmp_path / "x.safetensors", [
        ("t", '{"dtype":"F32","shape":[{"dtype":"F32","shape":[0],"data_offsets":[0,0]}],"data_offsets":[0,0]}')])
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    assert "got [{'dtype': 'F32', 'shape': [0], 'data_offsets': [0, 0]}]" in str(info.value)


def test_overlap_and_gap_messages_name_the_tensors_by_name_order(tmp_path):
    same = '{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
    path = header_file(tmp_path / "x.safetensors", [("b", same), ("a", same), ("c", same)], data=4)
    with pytest.raises(CheckpointError, match=r"tensor 'b' \(bytes 0\.\.4\) overlaps tensor 'a' \(ends at 4\)"):
        read_checkpoint(path)
    gap = header_file(tmp_path / "g.safetensors", [("z", '{"dtype":"F32","shape":[1],"data_offsets":[4,8]}')], 8)
    with pytest.raises(CheckpointError, match=r"4 unaccounted bytes before tensor 'z' \(offset 4, expected 0\)"):
        read_checkpoint(gap)


@pytest.mark.parametrize("kwargs", [{}, {"role": "packed"}, {"role": "packed", "logical_numel": 7, "packing": "gptq"},
                                    {"role": "quant_aux", "packing": "fp8", "note": "scale"},
                                    {"logical_numel": None}])
def test_make_tensor_is_the_dataclass(kwargs):
    made = make_tensor("w", "F32", (2, 3), 6, 24, "f", **kwargs)
    plain = CheckpointTensor("w", "F32", (2, 3), 6, 24, "f", **kwargs)
    assert type(made) is CheckpointTensor and made == plain and repr(made) == repr(plain) and hash(made) == hash(plain)
    with pytest.raises(AttributeError):
        made.name = "x"  # still frozen


def test_checkpoint_sums_are_the_per_tensor_sums():
    tensors = tuple(make_tensor(f"t{i}", dtype, (i,), i, i * size, f"f{i % 3}")
                    for i, (dtype, size) in enumerate([("F32", 4), ("BF16", 2), ("F32", 4), ("U8", 1)] * 5))
    ck = Checkpoint("p", "safetensors", tensors)
    assert ck.elements == sum(t.numel for t in tensors) and ck.nbytes == sum(t.nbytes for t in tensors)
    assert ck.files == ("f0", "f1", "f2")
    for dtype in ("F32", "BF16", "U8"):
        mine = [t for t in tensors if t.dtype == dtype]
        assert ck.by_dtype[dtype] == {"tensors": len(mine), "elements": sum(t.numel for t in mine),
                                      "bytes": sum(t.nbytes for t in mine)}
    assert list(ck.by_dtype) == ["BF16", "F32", "U8"]


# ---------------------------------------------------------------------------------------------
# Rendering: the fast paths write what rich and json.dumps write
# ---------------------------------------------------------------------------------------------

NAMES = ["layer", "experts", "w", "[bold]", "[/b]", "a b", "x" * 130, "ü", "名字", "tab\tx", "×", "cls.predictions",
         "pooler.dense", "bert.encoder.layer.0.output.dense.weight", "LayerNorm.gamma", "q\"uote", "back\\slash"]


@pytest.fixture(scope="module")
def mixed_audit(tmp_path_factory):
    """An audit of 1,500 tensors with every kind of name: head words, markup, wide characters, tabs, long words,
    quotes; GPTQ packed weights with their scales; fp8 scales; 2-D shapes (×); a buffer; matched tensors."""
    import random

    rng = random.Random(7)
    items, offset = [], 0
    for i in range(1500):
        name = ".".join(rng.choice(NAMES) for _ in range(rng.randint(1, 5))) + f".{i}"
        shape = rng.choice([[0], [3, 0], [0, 2, 2], [], [1]])
        n = 4 if shape in ([], [1]) else 0
        items.append((name, json.dumps({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n]})))
        offset += n
    for i in range(30):
        for part, dtype, shape in (("qweight", "I32", [0, 8]), ("scales", "F16", [0, 8]), ("qzeros", "I32", [0, 1])):
            items.append((f"g.{i}.{part}", json.dumps({"dtype": dtype, "shape": shape, "data_offsets": [offset] * 2})))
        items.append((f"f.{i}.weight_scale_inv", json.dumps({"dtype": "F32", "shape": [0],
                                                             "data_offsets": [offset] * 2})))
    for name, shape in (("embeddings.word_embeddings.weight", [30522, 0]), ("embeddings.position_ids", [1, 0]),
                        ("embeddings.LayerNorm.gamma", [0])):
        items.append((name, json.dumps({"dtype": "F32", "shape": shape, "data_offsets": [offset] * 2})))
    folder = checkpoint_folder(tmp_path_factory.mktemp("mixed"), items, offset)
    return audit(str(folder))


@pytest.mark.parametrize("width", [30, 80, 160])
@pytest.mark.parametrize("color", [False, True])
def test_all_keys_laid_out_by_hand_read_as_rich_lays_them_out(mixed_audit, monkeypatch, width, color):
    fast = render_audit.render_audit_text(mixed_audit, width, color=color, all_keys=True)
    monkeypatch.setattr(render_audit, "_FAST_ROWS", 10**9)  # rich lays out every row
    assert fast == render_audit.render_audit_text(mixed_audit, width, color=color, all_keys=True)
    if width >= 80:
        assert "[bold]" in fast and "[/b]" in fast  # names are never taken as markup


def test_the_json_written_in_pieces_is_json_dumps(mixed_audit):
    streamed = "".join(render_audit.iter_audit_json(mixed_audit))
    assert streamed == json.dumps(mixed_audit.to_dict(), indent=2, ensure_ascii=False)
    assert render_audit.render_audit_json(mixed_audit, indent=None) == json.dumps(mixed_audit.to_dict(),
                                                                                   ensure_ascii=False)
    document = json.loads(streamed)["checkpoint"]
    assert len(document["packed"]) == 30 and document["packed"][0]["logical_elements"] == 0
    assert len(document["unexpected"]) + len(document["non_parameters"]) + document["matched_count"] >= 1500


def test_an_audit_with_nothing_to_list_streams_empty_lists(tmp_path):
    folder = checkpoint_folder(tmp_path, [])
    result = audit(str(folder))
    streamed = "".join(render_audit.iter_audit_json(result))
    assert streamed == json.dumps(result.to_dict(), indent=2, ensure_ascii=False)
    assert json.loads(streamed)["checkpoint"]["unexpected"] == []


@settings(max_examples=1000, deadline=None)
@given(words=st.lists(st.text(alphabet="ab×.:0", min_size=1, max_size=40), min_size=1, max_size=12),
       width=st.integers(1, 30))
def test_line_breaks_are_rich_s(words, width):
    from rich._wrap import divide_line

    text = " ".join(words)
    assert render_audit._breaks(text, width) == [0, *divide_line(text, width, fold=True), len(text)]


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet="ab ", max_size=60), width=st.integers(1, 20))
def test_line_breaks_with_any_spaces_are_rich_s(text, width):
    from rich._wrap import divide_line

    assert render_audit._breaks(text, width) == [0, *divide_line(text, width, fold=True), len(text)]


def test_a_large_audit_in_all_three_forms(tmp_path, monkeypatch):
    """5,000 unexpected tensors (past _FAST_ROWS): the text, --all and --json, each as the slow paths write it."""
    from paramscope.cli import main

    folder = checkpoint_folder(tmp_path / "ckpt", [
        (f"model.layers.{i // 100}.mlp.experts.{i % 100}.w.weight",
         json.dumps({"dtype": "F32", "shape": [1, 1] if i % 2 else [1], "data_offsets": [4 * i, 4 * i + 4]}))
        for i in range(5000)], data=20000)
    result = audit(str(folder))
    assert len(result.audit.unexpected) == 5000 and len(result.audit.missing) == 202
    pieces = {}
    for args in ([], ["--all"], ["--json"]):
        main(["audit", str(folder), "--width", "90", *args])
    for all_keys in (False, True):
        pieces[all_keys] = render_audit.render_audit_text(result, 90, all_keys=all_keys)
    monkeypatch.setattr(render_audit, "_FAST_ROWS", 10**9)
    assert pieces[True] == render_audit.render_audit_text(result, 90, all_keys=True)
    assert pieces[False] == render_audit.render_audit_text(result, 90, all_keys=False)
    assert "… and 4980 more (--all lists them)" in pieces[False]
    assert len(pieces[True].splitlines()) > 5000


def test_the_cli_writes_what_the_renderers_write(tmp_path, capsys):
    from paramscope.cli import main

    folder = checkpoint_folder(tmp_path / "ckpt", zero_size(300))
    result = audit(str(folder))
    for args, expected in ((["--all"], render_audit.render_audit_text(result, 100, all_keys=True)),
                           (["--json"], render_audit.render_audit_json(result) + "\n")):
        capsys.readouterr()
        assert main(["audit", str(folder), "--width", "100", *args]) == 0
        assert capsys.readouterr().out == expected


def test_audit_report_of_a_checkpoint_made_in_memory():
    """audit_report (the pure glue) answers for a Checkpoint built from tensors, not read from a file."""
    from paramscope.api import inspect

    report = inspect("bert-base-uncased")
    tensors = tuple(make_tensor(p.name, "F32", p.shape, 1, 4, "mem") for p in report.params[:3])
    result = audit_report(report, Checkpoint("mem", "safetensors", tensors))
    assert len(result.audit.matched) == 3 and result.checkpoint_dict()["unexpected"] == []


def test_an_index_listing_more_than_the_bound_is_refused_before_any_shard_is_read(tmp_path, bound_of_100):
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {f"t{i}": "missing-shard.safetensors" for i in range(101)}}))
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'model.safetensors.index.json'}: more than 100 tensors, the most")
