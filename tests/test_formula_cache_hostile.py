"""The formula-cache reader on hostile entries (issue 9, point 6): bounded, never stuck, never wrong.

A cache entry is data someone else may have written. Reading one must cost at most an lstat when it is no regular
file (a symlink to /dev/zero, a FIFO), refuse out-of-bounds numbers before any arithmetic, and reproduce its own
anchor count before use. Whatever the entry holds, `lookup` gives a correct hit or a miss with a note: it raises
for no cache content.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramscope.formula import derive_formula
from paramscope.disk_cache import (
    MAX_ENTRY_BYTES,
    atomic_write_json,
    installed_transformers_version,
    route_file,
    route_key,
)
from paramscope.formula_cache import formula_directory, lookup

CLASS = "BertModel"
ANCHOR = {"model_type": "bert", "vocab_size": 97, "hidden_size": 24, "num_attention_heads": 4,
          "intermediate_size": 40, "max_position_embeddings": 33, "type_vocab_size": 3, "num_hidden_layers": 2}


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """A real entry, derived once: (its path, its JSON, the meta count at the anchor)."""
    root = tmp_path_factory.mktemp("hostile-formula-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PARAMSCOPE_CACHE_DIR", str(root))
        formula = derive_formula(ANCHOR, model_class=CLASS)
        path = Path(formula.cache_path)
        yield path, json.loads(path.read_text()), formula.checked


@pytest.fixture
def entry(cached, monkeypatch):
    """The real entry's path, restored before each test, with the cache pointed at it."""
    path, data, _ = cached
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(path.parents[5]))  # <root>/paramscope-<version>/formulas/v…/<tf>/<class>
    for other in path.parent.iterdir():
        other.unlink()
    atomic_write_json(path, data)
    return path


def quick_lookup(seconds: float = 5.0):
    """lookup at the anchor, in a thread: a reader that blocks (a FIFO) fails the test instead of hanging it."""
    result = {}
    started = time.perf_counter()
    worker = threading.Thread(target=lambda: result.update(hit=lookup(ANCHOR, model_class=CLASS)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "the cache reader blocked"
    return result["hit"], time.perf_counter() - started


def test_the_real_entry_is_a_hit_at_its_anchor(cached, entry):
    hit, _ = quick_lookup()
    assert hit.spec is not None and hit.path == entry
    # embeddings V·D + L·D + T·D + 2·D = 2,328 + 792 + 72 + 48 = 3,240;
    # blocks 2 × (4·(D² + D) + 2·D·I + 9·D + I) = 2 × 4,480 = 8,960; pooler D² + D = 600; total 12,800
    assert hit.spec.evaluate(hit.values).total == cached[2] == 12_800


def test_a_symlink_to_dev_zero_costs_nothing(entry):
    entry.unlink()
    entry.symlink_to("/dev/zero")
    hit, seconds = quick_lookup()
    assert hit.spec is None and seconds < 1
    assert hit.rejected == (f"cache entry {entry.name} skipped: not a readable JSON file of at most 4 MiB",)


def test_a_symlink_to_a_good_entry_is_not_followed(cached, entry, tmp_path):
    elsewhere = tmp_path / "entry.json"
    elsewhere.write_text(json.dumps(cached[1]))
    entry.unlink()
    entry.symlink_to(elsewhere)
    hit, _ = quick_lookup()
    assert hit.spec is None and "skipped" in hit.rejected[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_costs_nothing(entry):
    entry.unlink()
    os.mkfifo(entry)
    hit, seconds = quick_lookup()
    assert hit.spec is None and seconds < 1 and "skipped" in hit.rejected[0]


def test_an_oversized_entry_is_not_read(entry):
    with open(entry, "r+b") as handle:  # sparse: costs no disk, and must cost no memory either
        handle.truncate(MAX_ENTRY_BYTES + 1)
    hit, seconds = quick_lookup()
    assert hit.spec is None and seconds < 1 and "skipped" in hit.rejected[0]


def test_json_nested_deeper_than_python_recurses_is_a_miss(entry):
    entry.write_text("[" * 200_000 + "]" * 200_000)
    hit, _ = quick_lookup()
    assert hit.spec is None and "skipped" in hit.rejected[0]


def rewrite(entry: Path, data) -> None:
    entry.write_text(json.dumps(data))


def test_an_exponent_of_a_billion_is_refused_before_evaluation(cached, entry):
    data = copy.deepcopy(cached[1])
    data["families"][0]["shape"][0] = [[1, {"V": 10**9}]]
    rewrite(entry, data)
    hit, seconds = quick_lookup()
    assert hit.spec is None and seconds < 1
    assert hit.rejected == (f"cache entry {entry.name} discarded: an exponent is not an integer within ±6",)


@pytest.mark.parametrize("coefficient", [10**30, "1/0", "1e1000000000", "-" + "9" * 40, True, 1.5, None])
def test_a_huge_or_malformed_coefficient_is_refused(cached, entry, coefficient):
    data = copy.deepcopy(cached[1])
    data["families"][0]["mult"] = [[coefficient, {}]]
    rewrite(entry, data)
    hit, seconds = quick_lookup()
    assert hit.spec is None and seconds < 1 and "coefficient" in hit.rejected[0]


def test_an_emptied_formula_is_discarded_not_shown_as_zero(cached, entry):
    data = copy.deepcopy(cached[1])
    data["families"] = []
    rewrite(entry, data)
    hit, _ = quick_lookup()
    assert hit.spec is None
    assert hit.rejected == (f"cache entry {entry.name} discarded: it gives 0 at the config it was derived from, "
                            "which counts 12,800",)


def test_an_entry_without_its_anchor_counts_is_discarded(cached, entry):
    data = copy.deepcopy(cached[1])
    del data["anchor"]["by_role"]  # as format 1 wrote it
    rewrite(entry, data)
    hit, _ = quick_lookup()
    assert hit.spec is None and "by role" in hit.rejected[0]


def test_changed_conditions_do_not_match_the_file_they_are_filed_under(cached, entry):
    data = copy.deepcopy(cached[1])
    data["conditions"] = [c for c in data["conditions"] if c["kind"] != "equals"]
    rewrite(entry, data)
    hit, _ = quick_lookup()
    assert hit.spec is None and "filed under" in hit.rejected[0]


WRONG_SHAPES = [
    None, 0, "x", [], [1, 2], {"format": 2},
    lambda d: {**d, "format": True},
    lambda d: {**d, "symbols": ["V"]},
    lambda d: {**d, "symbols": {**d["symbols"], "V": 3}},
    lambda d: {**d, "families": {"pattern": "x"}},
    lambda d: {**d, "families": [None]},
    lambda d: {**d, "families": [{**d["families"][0], "shape": [[[1]]]}]},
    lambda d: {**d, "families": [{**d["families"][0], "mult": [[1, {"Q": 1}]]}]},
    lambda d: {**d, "conditions": [{"kind": "nonsense", "path": "x", "value": 1, "default": 1, "text": ""}]},
    lambda d: {**d, "conditions": [{"kind": "same_as", "path": "x", "value": 1, "default": 1, "text": ""}]},
    lambda d: {**d, "defaults": {"vocab_size": "big"}},
    lambda d: {**d, "anchor": []},
    lambda d: {**d, "anchor": {**d["anchor"], "values": {**d["anchor"]["values"], "V": 0}}},
    lambda d: {**d, "anchor": {**d["anchor"], "seconds": "soon"}},
    lambda d: {**d, "anchor": {**d["anchor"], "total": "many"}},
    lambda d: {**d, "sympy_names": None},
    lambda d: {**d, "independent": [1]},
]


@pytest.mark.parametrize("shape", range(len(WRONG_SHAPES)))
def test_entries_of_the_wrong_shape_are_discarded_with_a_note(cached, entry, shape):
    make = WRONG_SHAPES[shape]
    rewrite(entry, make(copy.deepcopy(cached[1])) if callable(make) else make)
    hit, _ = quick_lookup()
    assert hit.spec is None
    assert len(hit.rejected) == 1 and hit.rejected[0].startswith(f"cache entry {entry.name} discarded: ")


@pytest.mark.parametrize("content", ["[", '{"class": 7}', '{"class": ["BertModel"]}', "/dev/zero"])
def test_a_corrupt_route_file_is_a_miss(entry, content):
    """Without --class the class comes from a route file: it is read as carefully as an entry."""
    route = route_file(formula_directory(installed_transformers_version()),
                       route_key(ANCHOR, model_class=None, task=None))
    route.parent.mkdir(parents=True, exist_ok=True)
    route.unlink(missing_ok=True)
    if content == "/dev/zero":
        route.symlink_to(content)
    else:
        route.write_text(content)
    started = time.perf_counter()
    assert lookup(ANCHOR).spec is None
    assert time.perf_counter() - started < 1
    route.unlink()


# --------------------------------------------------------------------------------------------- fuzzing

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def paths_of(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths_of(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from paths_of(value, prefix + (i,))


def mutated(data, path, value, delete: bool):
    if not path:
        return value
    out = copy.deepcopy(data)
    node = out
    for step in path[:-1]:
        node = node[step]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(data=st.data(), value=json_values, delete=st.booleans())
def test_fuzz_mutated_real_entries_give_a_correct_hit_or_a_clean_miss(cached, entry, data, value, delete):
    original = cached[1]
    path = data.draw(st.sampled_from(list(paths_of(original))))
    rewrite(entry, mutated(original, path, value, delete and bool(path)))
    hit = lookup(ANCHOR, model_class=CLASS)  # raises nothing, whatever the entry holds
    if hit.spec is not None:
        assert hit.spec.evaluate(hit.values).total == cached[2]
    else:
        assert hit.rejected and all(isinstance(note, str) and "\n" not in note for note in hit.rejected)


@FUZZ
@given(value=json_values)
def test_fuzz_random_json_entries_are_a_clean_miss(entry, value):
    rewrite(entry, value)
    hit = lookup(ANCHOR, model_class=CLASS)
    assert hit.spec is None and hit.rejected[0].startswith(f"cache entry {entry.name} discarded: ")


@FUZZ
@given(raw=st.binary(max_size=64))
def test_fuzz_random_bytes_are_a_clean_miss(entry, raw):
    entry.write_bytes(raw)
    hit = lookup(ANCHOR, model_class=CLASS)
    assert hit.spec is None and hit.rejected


def test_the_reader_needs_neither_torch_nor_transformers_nor_sympy(entry):
    """Corrupt entries are judged on the cached path, which must not import the heavy packages."""
    entry.write_text('{"format": 2, "families": [[1, {"V": 1e9}]]}')
    script = ("import sys, json; sys.modules.update(torch=None, sympy=None);"
              "from paramscope.formula_cache import lookup;"
              "hit = lookup(json.loads(sys.argv[1]), model_class=sys.argv[2]);"
              "heavy = {'torch', 'transformers', 'sympy'} & {m for m, v in sys.modules.items() if v is not None};"
              "print(json.dumps([hit.spec is None, list(hit.rejected), sorted(heavy)]))")
    run = subprocess.run([sys.executable, "-c", script, json.dumps(ANCHOR), CLASS], capture_output=True, text=True,
                         env=dict(os.environ), timeout=60)
    assert run.returncode == 0, run.stderr
    miss, rejected, heavy = json.loads(run.stdout)
    assert miss and heavy == [] and rejected[0].startswith(f"cache entry {entry.name} discarded: ")


# ------------------------------------------------------------------------------ names that reach sympify (issue 30)
# `formula --json` writes expression strings that users pass to sympy.sympify, an eval. A name planted in a cache
# entry must never reach one: the entry is discarded when read (and rebuilt), and every name is checked again where
# an expression string is made.

PLANTED = "__import__('os').system('touch {marker}')"


def renamed_symbol(data, old: str, new: str):
    """`data` (an entry's JSON) with symbol `old` renamed `new` everywhere, so that only the name is wrong."""
    text = json.dumps(data).replace(json.dumps(old), json.dumps(new))
    return json.loads(text)


@pytest.mark.parametrize("tamper", ["sympy_name", "symbol", "path"])
def test_a_planted_name_is_discarded_and_nothing_runs(cached, entry, tmp_path, tamper):
    marker = tmp_path / "ran"
    planted = PLANTED.format(marker=marker)
    data = copy.deepcopy(cached[1])
    if tamper == "sympy_name":
        data["sympy_names"]["N"] = planted
    elif tamper == "symbol":
        data = renamed_symbol(data, "V", planted)
    else:
        data["symbols"]["V"] = planted
    rewrite(entry, data)
    hit, _ = quick_lookup()
    assert hit.spec is None and len(hit.rejected) == 1
    assert hit.rejected[0].startswith(f"cache entry {entry.name} discarded: ")
    assert "\n" not in hit.rejected[0] and not marker.exists()


def test_a_planted_sympy_name_is_rebuilt_and_the_json_is_safe(cached, entry, tmp_path, capsys):
    """End to end: `formula --json` on the tampered cache derives afresh, rewrites the entry, and its expression
    strings sympify to symbols and numbers; the planted call never runs."""
    from paramscope.cli import main

    marker = tmp_path / "ran"
    data = copy.deepcopy(cached[1])
    data["sympy_names"]["N"] = PLANTED.format(marker=marker)
    rewrite(entry, data)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(ANCHOR))
    assert main(["formula", str(config), "--class", CLASS, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["derivation"]["origin"] == "derived" and doc["derivation"]["cache_file"] == str(entry)
    assert json.loads(entry.read_text())["sympy_names"]["N"] == "Symbol('N')"  # rebuilt
    check_sympifies_to(doc, 12_800)
    assert not marker.exists()


def test_an_expression_is_never_written_with_an_unchecked_name():
    """The second check, where the string is made: a spec that never passed through from_json still cannot plant
    a call."""
    from paramscope.errors import FormulaError
    from paramscope.polynomial import Poly
    from paramscope.render.formula import format_poly

    assert format_poly(Poly.var("D", 2) + Poly.var("N"), ["N", "D"], "sympy") == "D**2 + Symbol('N')"
    for name in ["__import__('os').system('true')", "__class__", "lambda", "a b", "x" * 65, "", "1x", "é"]:
        with pytest.raises(FormulaError, match="refusing to write a formula expression"):
            format_poly(Poly.var(name), [], "sympy")


def test_the_plain_names_are_the_ones_sympify_reads_as_symbols():
    """PLAIN_SYMPY_NAMES (written bare) against the installed sympy; every other name is written Symbol('name')."""
    import sympy

    from paramscope.formula_spec import FACTOR_ORDER, PLAIN_SYMPY_NAMES, sympy_spelling

    for name in [*FACTOR_ORDER, "Q", "Q2", "S", "O", "beta", "position_buckets", "f_lambda"]:
        assert sympy.sympify(sympy_spelling(name), locals={}) == sympy.Symbol(name), name
        assert (sympy_spelling(name) == name) == (name in PLAIN_SYMPY_NAMES), name
    assert {name for name in FACTOR_ORDER if sympy.sympify(name) != sympy.Symbol(name)} == {"N", "I", "E"}


def test_a_template_with_a_planted_sympy_name_is_refused():
    """Templates (shipped and cached) carry the same spec, read by the same FormulaSpec.from_json."""
    from paramscope.disk_cache import CacheEntryError
    from paramscope.template import Template

    shipped = sorted(Path(__file__).parents[1].glob("src/paramscope/presets/templates/v1/*/GPT2LMHeadModel/*.json"))
    data = json.loads(shipped[0].read_text())
    Template.from_json(copy.deepcopy(data))  # as shipped: valid
    data["spec"]["sympy_names"]["N"] = "__import__('os').getcwd()"
    with pytest.raises(CacheEntryError, match="neither the symbol nor Symbol"):
        Template.from_json(data)


def check_sympifies_to(doc, total: int) -> None:
    """Every expression string of a `formula --json` document parses with sympify(s, locals={}) to a tree of
    symbols, numbers, sums, products and powers only, and gives the document's counts at its values."""
    import sympy

    values = {sympy.Symbol(name): value for name, value in doc["values"].items()}
    strings = {"expression": doc["formula"]["expression"], **doc["formula"]["by_role"]}
    for where, text in strings.items():
        parsed = sympy.sympify(text, locals={})
        for node in sympy.preorder_traversal(parsed):
            assert isinstance(node, (sympy.Symbol, sympy.Rational, sympy.Add, sympy.Mul, sympy.Pow)), (where, node)
        assert parsed.free_symbols <= set(values), where
        want = total if where == "expression" else doc["by_role_values"][where]
        assert parsed.subs(values) == want, where
    assert doc["parameters"]["total"] == doc["formula"]["value"] == total


@pytest.mark.parametrize("preset, total", [
    ("bert-base-uncased", 109_514_298),   # N and I: Symbol('N'), Symbol('I')
    ("mixtral-8x7b", 46_702_792_704),     # E: Symbol('E')
    ("deberta-v3-base", 183_831_552),     # position_buckets: a field outside the notes' symbols
    ("t5-small", 60_506_624),             # N_dec, d_h, B
])
def test_every_expression_string_of_formula_json_sympifies_safely(capsys, preset, total):
    import paramscope
    from paramscope.cli import main

    assert main(["formula", preset, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert paramscope.inspect(preset).total == total
    check_sympifies_to(doc, total)
