"""Closed-form formulas (issue 3): derived from the config, general, checked, cached, shown.

The notes' hand derivation for bert-base-chinese is the yardstick: embeddings V·D + L·D + 2·D + 2·D, blocks
N·(12D² + 13D), MLM head V + D² + 3D, total 102,290,312.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sympy

import paramscope
from conftest import report_of
from paramscope.cli import main as formula_main
from paramscope.errors import ConfigError, ModelClassError, SourceError
from paramscope.formula import derive_formula
from paramscope.disk_cache import atomic_write_json
from paramscope.formula_cache import lookup
from paramscope.formula_spec import AssumptionError, FormulaError, FormulaMismatchError, FormulaSpec
from paramscope.presets import find_preset

CONFIGS = Path(paramscope.__file__).parent / "presets" / "configs"


def preset(name: str) -> str:
    """A preset config by file (presets not yet in the registry are found this way too)."""
    return str(CONFIGS / f"{name}.json")


@pytest.fixture(scope="module", autouse=True)
def formula_cache_dir(tmp_path_factory):
    """Every formula of this module is cached in one temporary directory, never in the user's."""
    path = tmp_path_factory.getbasetemp() / "formula-cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PARAMSCOPE_CACHE_DIR", str(path))
        yield path


@functools.lru_cache(maxsize=None)
def formula_of(model: str, model_class: str | None = None, num_labels: int | None = None):
    return derive_formula(model, model_class=model_class, num_labels=num_labels, use_cache=False)


def meta_total(model, model_class=None, num_labels=None) -> int:
    return paramscope.inspect(model, model_class=model_class, num_labels=num_labels).parameters.total


def symbols_of(formula) -> dict[str, sympy.Symbol]:
    return {name: sympy.Symbol(name) for name in formula.symbols}


def same(a, b) -> bool:
    return sympy.expand(a - b) == 0


def role_sum(formula, prefix: str):
    return sum((e for role, e in formula.by_role.items() if role.startswith(prefix)), sympy.Integer(0))


# ------------------------------------------------------------------------------------------------- the notes


def test_bert_base_chinese_is_the_notes_formula_derived():
    f = formula_of("bert-base-chinese", "BertForMaskedLM")
    assert f.value == 102_290_312
    assert f.value == report_of("bert-base-chinese", "BertForMaskedLM").parameters.total
    assert f.symbols == {"V": "vocab_size", "D": "hidden_size", "L": "max_position_embeddings",
                         "N": "num_hidden_layers", "I": "intermediate_size", "T": "type_vocab_size"}
    s = symbols_of(f)
    V, D, L, N, I, T = (s[k] for k in "VDLNIT")

    # embeddings: V·D + L·D + T·D + 2·D; the notes' "2·D" for token types is T·D at T = 2
    assert same(f.by_role["embeddings.word"], V * D)
    assert same(f.by_role["embeddings.position"], L * D)
    assert same(f.by_role["embeddings.token_type"], T * D)
    assert same(f.by_role["embeddings.norm"], 2 * D)
    embeddings = role_sum(f, "embeddings.")
    assert same(embeddings.subs(T, 2), V * D + 2 * D + L * D + 2 * D)

    # blocks: N·(4(D² + D) + 2D + (D·I + I) + (I·D + D) + 2D); with I = 4D the notes' N·(12D² + 13D)
    for role in ("attention.query", "attention.key", "attention.value", "attention.output"):
        assert same(f.by_role[role], N * (D**2 + D))
    assert same(f.by_role["mlp.up"], N * (D * I + I))
    assert same(f.by_role["mlp.down"], N * (I * D + D))
    blocks = role_sum(f, "attention.") + role_sum(f, "mlp.")
    assert same(blocks, N * (4 * D**2 + 2 * D * I + 9 * D + I))
    assert same(blocks.subs(I, 4 * D), N * (12 * D * D + 13 * D))

    # MLM head: V + D² + 3D (bias V, transform D² + D, its LayerNorm 2D; the decoder is tied)
    assert same(role_sum(f, "head."), V + D * D + 3 * D)

    notes_total = V * D + L * D + 4 * D + N * (12 * D * D + 13 * D) + V + D * D + 3 * D
    assert same(f.subs(I=4 * D, T=2), notes_total)
    assert notes_total.subs(f.values) == 102_290_312
    assert embeddings.subs(f.values) == 16_622_592
    assert blocks.subs(f.values) == 85_054_464
    assert "tie_word_embeddings = true" in f.assumptions


def test_the_notes_layout_is_rendered_derived(capsys):
    assert formula_main(["formula", "bert-base-chinese", "--class", "BertForMaskedLM", "--explain",
                         "--width", "140"]) == 0
    out = capsys.readouterr().out
    assert "P = V·D + L·D + T·D + 2·D + N·(4·D² + 2·D·I + 9·D + I) + D² + V + 3·D" in out
    assert "= 102,290,312" in out
    assert "with I = 4·D (true here): N·(12·D² + 13·D)" in out
    assert "16,622,592" in out and "85,054,464" in out
    # each role's figure next to its term and its arithmetic
    assert "attention.query         N·(D² + D)    12·(768² + 768)" in out
    assert "7,087,104" in out
    assert "V   vocab_size" in out and "does not depend on: num_attention_heads" in out


# ---------------------------------------------------------------------------------------- one formula, many configs


def test_bert_formula_derived_at_base_holds_at_large_and_chinese():
    f = formula_of("bert-base-uncased", "BertForMaskedLM")
    assert f.value == 109_514_298
    assert f.evaluate("bert-large-uncased") == 335_174_458 == meta_total("bert-large-uncased", "BertForMaskedLM")
    assert f.evaluate("bert-base-chinese") == 102_290_312
    assert f.evaluate("bert-base-multilingual-cased") == meta_total("bert-base-multilingual-cased", "BertForMaskedLM")


def test_llama2_formula_holds_for_grouped_query_llama3():
    f = formula_of(preset("meta-llama--Llama-2-7b-hf"))
    assert f.value == 6_738_415_616
    # K = H = 32 at Llama-2-7B, yet the key/value heads keep their own symbol
    assert f.symbols["K"] == "num_key_value_heads" and f.symbols["H"] == "num_attention_heads"
    assert {sympy.Symbol("K"), sympy.Symbol("H")} <= f.expression.free_symbols
    assert f.values["K"] == f.values["H"] == 32
    llama3 = preset("meta-llama--Meta-Llama-3-8B")
    assert f.evaluate(llama3) == 8_030_261_248 == meta_total(llama3)
    assert f.evaluate(preset("meta-llama--Llama-2-70b-hf")) == meta_total(preset("meta-llama--Llama-2-70b-hf"))


def test_gpt2_formula_the_notes_left_for_later():
    f = formula_of(preset("openai-community--gpt2"))
    s = symbols_of(f)
    V, D, L, N = (s[k] for k in "VDLN")
    assert f.value == 124_439_808
    assert same(f.expression, V * D + L * D + N * (12 * D**2 + 13 * D) + 2 * D)
    assert "n_inner is not set (the config class derives it)" in f.assumptions
    for other in ("openai-community--gpt2-medium", "openai-community--gpt2-xl", "distilbert--distilgpt2"):
        assert f.evaluate(preset(other)) == meta_total(preset(other)), other


def test_t5_formula_holds_across_sizes():
    f = formula_of(preset("google-t5--t5-small"))
    assert f.value == 60_506_624
    assert {"d_h", "B", "H"} <= set(f.symbols)  # head width d_kv and relative-position buckets
    for other in ("google-t5--t5-base", "google-t5--t5-large"):
        assert f.evaluate(preset(other)) == meta_total(preset(other)), other


def test_mixtral_formula_holds_at_8x22b():
    f = formula_of(preset("mistralai--Mixtral-8x7B-v0.1"))
    assert f.value == 46_702_792_704
    assert f.symbols["E"] == "num_local_experts"
    other = preset("mistralai--Mixtral-8x22B-v0.1")
    assert f.evaluate(other) == meta_total(other)


def test_classification_heads_carry_the_label_count():
    f = formula_of("bert-base-uncased", "BertForSequenceClassification", 2)
    assert f.value == 109_483_778
    C, D = sympy.symbols("C D")
    assert same(f.by_role["head.classifier"], C * D + C)
    assert f.evaluate("bert-base-uncased", num_labels=9) == meta_total("bert-base-uncased",
                                                                       "BertForSequenceClassification", 9)


# ------------------------------------------------------------------------------------------- structure and flags

SMALL_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 101, "hidden_size": 32,
               "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 44,
               "num_hidden_layers": 2, "tie_word_embeddings": False}


def test_tied_embeddings_is_an_assumption_not_a_wrong_number():
    untied = derive_formula(SMALL_LLAMA, use_cache=False)
    assert "tie_word_embeddings = false" in untied.assumptions
    tied_config = {**SMALL_LLAMA, "tie_word_embeddings": True}
    with pytest.raises(AssumptionError, match="tie_word_embeddings"):
        untied.evaluate(tied_config)
    assert isinstance(AssumptionError("x"), ConfigError)
    tied = derive_formula(tied_config, use_cache=False)
    assert "tie_word_embeddings = true" in tied.assumptions
    assert "head.lm" not in tied.by_role and "head.lm" in untied.by_role
    assert tied.value == meta_total(tied_config)


def test_bias_on_or_off_is_an_assumption():
    biased_config = {**SMALL_LLAMA, "attention_bias": True}
    plain = derive_formula(SMALL_LLAMA, use_cache=False)
    biased = derive_formula(biased_config, use_cache=False)
    assert "attention_bias = false" in plain.assumptions and "attention_bias = true" in biased.assumptions
    D = sympy.Symbol("D")
    N = sympy.Symbol("N")
    assert same(plain.by_role["attention.query"], N * D**2)
    assert same(biased.by_role["attention.query"], N * (D**2 + D))
    with pytest.raises(AssumptionError, match="attention_bias"):
        plain.evaluate(biased_config)
    assert biased.value == meta_total(biased_config)


def test_first_dense_layers_of_an_moe_carry_their_own_symbol():
    config = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 97,
              "hidden_size": 32, "intermediate_size": 40, "moe_intermediate_size": 12, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 4,
              "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
              "q_lora_rank": 16, "kv_lora_rank": 8, "qk_rope_head_dim": 4, "qk_nope_head_dim": 6,
              "v_head_dim": 5, "tie_word_embeddings": False}
    f = derive_formula(config, use_cache=False)
    assert f.symbols["N_dense"] == "first_k_dense_replace"
    N, N_dense, D, I = sympy.symbols("N N_dense D I")
    # dense MLPs in the first N_dense layers, experts (and their router) in the other N − N_dense
    assert same(f.by_role["mlp.gate"], N_dense * D * I)
    assert any(e.has(N - N_dense) for e in f.by_role.values())
    for changes in ({"first_k_dense_replace": 2}, {"first_k_dense_replace": 3, "num_hidden_layers": 5},
                    {"n_routed_experts": 6, "num_hidden_layers": 3}):
        other = {**config, **changes}
        assert f.evaluate(other) == meta_total(other), changes


def test_factorised_embedding_electra_equal_sizes_is_an_assumption():
    base = {"model_type": "electra", "architectures": ["ElectraModel"], "vocab_size": 90, "embedding_size": 24,
            "hidden_size": 24, "num_attention_heads": 4, "intermediate_size": 40, "num_hidden_layers": 2,
            "max_position_embeddings": 30}
    same_size = derive_formula(base, use_cache=False)
    assert any(a.startswith("embedding_size = hidden_size") for a in same_size.assumptions)
    factorised = {**base, "embedding_size": 8}
    with pytest.raises(AssumptionError, match="embedding_size"):
        same_size.evaluate(factorised)
    f = derive_formula(factorised, use_cache=False)
    assert f.symbols["D_emb"] == "embedding_size"
    assert f.value == meta_total(factorised)
    assert f.evaluate({**factorised, "embedding_size": 12, "hidden_size": 36}) == \
        meta_total({**factorised, "embedding_size": 12, "hidden_size": 36})


def test_albert_shares_its_layers_so_the_layer_count_drops_out():
    f = formula_of(preset("albert--albert-base-v2"))
    assert f.value == meta_total(preset("albert--albert-base-v2"))
    assert f.symbols["D_emb"] == "embedding_size"
    assert "num_hidden_layers" in f.spec.independent
    assert sympy.Symbol("N") not in f.expression.free_symbols


def test_a_structure_no_polynomial_describes_is_refused_in_one_line():
    """MoE every k-th layer: ⌊N/k⌋ MoE layers is no polynomial, so no formula rather than a wrong one."""
    config = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "vocab_size": 101,
              "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 40,
              "moe_intermediate_size": 12, "shared_expert_intermediate_size": 20, "num_experts": 4,
              "num_experts_per_tok": 2, "num_hidden_layers": 4, "decoder_sparse_step": 2,
              "tie_word_embeddings": False}
    with pytest.raises(FormulaError, match="decoder_sparse_step in no way a polynomial can express") as info:
        derive_formula(config, use_cache=False)
    assert not isinstance(info.value, FormulaMismatchError)


# ------------------------------------------------------------------------------------------------------ output


def test_json_formula_object_parses_with_plain_sympify(capsys):
    assert formula_main(["formula", "bert-base-chinese", "--class", "BertForMaskedLM", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    formula = doc["formula"]
    assert set(formula) == {"expression", "symbols", "by_role", "value", "assumptions"}
    assert formula["value"] == 102_290_312 == doc["parameters"]["total"]
    values = {sympy.Symbol(k): v for k, v in doc["values"].items()}
    assert set(doc["values"]) == set(formula["symbols"])
    expression = sympy.sympify(formula["expression"])  # N and I must not turn into sympy's N() and i
    assert expression.free_symbols == set(values)
    assert expression.subs(values) == 102_290_312
    for role, text in formula["by_role"].items():
        assert sympy.sympify(text).subs(values) == doc["by_role_values"][role], role
    assert formula["symbols"]["L"] == "max_position_embeddings"
    assert isinstance(formula["assumptions"], list)


def test_latex_output(capsys):
    assert formula_main(["formula", "bert-base-chinese", "--class", "BertForMaskedLM", "--latex"]) == 0
    out = capsys.readouterr().out
    assert r"\begin{align*}" in out and r"V \cdot D" in out
    assert r"N \cdot \left(4 \cdot D^{2} + 2 \cdot D \cdot I + 9 \cdot D + I\right)" in out
    assert r"102{,}290{,}312" in out and r"\texttt{vocab\_size}" in out
    assert r"\text{embeddings.token\_type}" in out
    body = "\n".join(line for line in out.splitlines() if not line.startswith("%"))
    assert body.count("{") == body.count("}") and body.count(r"\left(") == body.count(r"\right)")
    assert not re.search(r"\\text\{[^}]*(?<!\\)_", body)  # an unescaped _ in \text{} breaks LaTeX


def test_python_api_returns_sympy():
    f = formula_of("bert-base-chinese", "BertForMaskedLM")
    assert isinstance(f.expression, sympy.Expr)
    assert f.expression.subs({sympy.Symbol(k): v for k, v in f.values.items()}) == f.value
    assert f.to_dict()["value"] == f.value


# ------------------------------------------------------------------------------------------------------- cache


def test_cache_answers_without_torch_transformers_or_sympy(formula_cache_dir):
    assert formula_main(["formula", "bert-base-uncased", "--class", "BertForMaskedLM"]) == 0  # derives, stores
    watched = ("import sys; from paramscope.cli import main; code = main(sys.argv[1:]);"
               "heavy = {'torch', 'transformers', 'sympy'} & set(sys.modules);"
               "sys.exit(f'imported {sorted(heavy)}' if heavy else code)")
    env = {**os.environ, "PARAMSCOPE_CACHE_DIR": str(formula_cache_dir)}
    run = subprocess.run([sys.executable, "-c", watched, "formula", "bert-large-uncased", "--class",
                          "BertForMaskedLM", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["formula"]["value"] == 335_174_458
    assert doc["derivation"]["origin"] == "cache"
    run = subprocess.run([sys.executable, "-c", watched, "formula", "bert-base-chinese", "--class",
                          "BertForMaskedLM"], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "= 102,290,312" in run.stdout

    # with torch unavailable, a config that breaks an assumption is a one-line error naming it
    blocked = ("import sys; sys.modules.update(torch=None, transformers=None, sympy=None);"
               "from paramscope.cli import main; sys.exit(main(sys.argv[1:]))")

    untied = find_preset("bert-large-uncased").load_config()
    untied["tie_word_embeddings"] = False
    path = formula_cache_dir / "untied-bert.json"
    path.write_text(json.dumps(untied))
    run = subprocess.run([sys.executable, "-c", blocked, "formula", str(path), "--class", "BertForMaskedLM"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 2
    assert "tie_word_embeddings" in run.stderr and "needs torch" in run.stderr
    assert run.stderr.count("\n") == 1  # one line


def test_cache_hit_from_python_with_verify_is_checked_by_a_meta_build(tmp_path, monkeypatch):
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    first = derive_formula("bert-base-cased", model_class="BertForMaskedLM")
    again = derive_formula("bert-large-cased", model_class="BertForMaskedLM", verify=True)
    assert first.origin == "derived" and again.origin == "cache"
    assert again.value == again.checked == meta_total("bert-large-cased", "BertForMaskedLM") == 333_610_308
    assert again.cache_path == first.cache_path
    unchecked = derive_formula("bert-large-cased", model_class="BertForMaskedLM")  # as `paramscope formula`
    assert unchecked.origin == "cache" and unchecked.checked is None
    assert (unchecked.value, unchecked.expression) == (again.value, again.expression)


def forge_double_word_embeddings(path: Path) -> None:
    """Count the word embeddings twice in a cached formula, and re-anchor it so that it passes its own check:
    a wrong formula that only a meta build can catch."""
    data = json.loads(path.read_text())
    data["families"][0]["mult"] = [[2, {}]]
    evaluation = FormulaSpec.from_json(data).evaluate(data["anchor"]["values"])
    data["anchor"]["total"] = evaluation.total
    data["anchor"]["by_role"] = {role: n for role, n in evaluation.by_role.items() if n}
    atomic_write_json(path, data)


def test_a_tampered_cached_formula_is_discarded_by_its_own_anchor(tmp_path, monkeypatch):
    """Issue 9: an emptied cached formula printed `P = 0` beside "verified … 109,514,298"."""
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    f = derive_formula("google-bert/bert-base-uncased", model_class="BertModel")
    data = json.loads(Path(f.cache_path).read_text())
    data["families"][0]["mult"] = [[2, {}]]  # the word embeddings, counted twice; the anchor says otherwise
    atomic_write_json(Path(f.cache_path), data)
    hit = lookup(find_preset("bert-base-uncased").load_config(), model_class="BertModel")
    assert hit.spec is None
    assert hit.rejected == (f"cache entry {Path(f.cache_path).name} discarded: it gives 132,923,136 at the config "
                            "it was derived from, which counts 109,482,240",)
    again = derive_formula("bert-base-uncased", model_class="BertModel")
    assert again.origin == "derived" and again.value == 109_482_240


def test_a_cached_formula_wrong_elsewhere_is_a_bug_report_not_a_number(tmp_path, monkeypatch, capsys):
    # old test (a tampered entry raised FormulaMismatchError): such an entry is now discarded by its anchor
    # (above), so the entry is forged consistently to reach the meta-build check it exercises
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    f = derive_formula("google-bert/bert-base-uncased", model_class="BertModel")
    forge_double_word_embeddings(Path(f.cache_path))
    with pytest.raises(FormulaMismatchError, match="please report"):
        derive_formula("bert-base-uncased", model_class="BertModel", verify=True)
    capsys.readouterr()
    assert formula_main(["formula", "bert-base-uncased", "--class", "BertModel", "--verify"]) == 1  # a bug's code
    assert capsys.readouterr().err.startswith("paramscope: error: cached formula for BertModel gives 132,923,136 but "
                                              "the meta build counts 109,482,240: a paramscope bug, please report it")


def test_spec_round_trips_through_json():
    f = formula_of(preset("mistralai--Mixtral-8x7B-v0.1"))
    again = FormulaSpec.from_json(json.loads(json.dumps(f.spec.to_json())))
    assert again.evaluate(f.values) == f.spec.evaluate(f.values)
    assert list(again.symbols) == list(f.spec.symbols)


def test_lookup_never_matches_another_model_type():
    config = find_preset("bert-base-uncased").load_config()
    config["model_type"] = "roberta"
    assert lookup(config, model_class="BertForMaskedLM").spec is None


_HAMMER = ("import sys; from pathlib import Path; from paramscope.disk_cache import atomic_write_json\n"
           "w = int(sys.argv[2])\n"
           "for i in range(40): atomic_write_json(Path(sys.argv[1]), {'w': w, 'i': i, 'pad': 'x' * 4000 * (w + 1)})")


def test_concurrent_writers_never_leave_a_torn_file(tmp_path):
    target = tmp_path / "entry.json"
    atomic_write_json(target, {"w": -1})
    writers = [subprocess.Popen([sys.executable, "-c", _HAMMER, str(target), str(w)]) for w in range(3)]
    reads = 0
    while any(w.poll() is None for w in writers) or reads < 10:
        json.loads(target.read_text())  # only ever the old file or a complete new one
        reads += 1
    assert [w.wait() for w in writers] == [0, 0, 0]
    assert [p.name for p in tmp_path.iterdir()] == ["entry.json"]  # no temp files left behind


# ------------------------------------------------------------------------------------------------------ errors


def test_bad_inputs_are_one_line_errors(capsys):
    import torch

    with pytest.raises(ModelClassError):
        derive_formula(torch.nn.Linear(2, 2))
    with pytest.raises(SourceError):
        derive_formula("no-such-model-anywhere")
    assert formula_main(["formula", "bert-base-uncased", "--num-labels", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paramscope: error: --num-labels must be a positive integer, got 0")
    assert formula_main(["formula", "bert-base-uncased", "--class", "GPT2Model"]) == 2
    assert "is for model_type 'gpt2'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- inspect --explain link


def test_inspect_explain_puts_each_roles_formula_term_beside_its_arithmetic(capsys):
    assert formula_main(["inspect", "bert-base-uncased", "--class", "BertModel", "--explain", "--no-tree",
                         "--width", "160"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(" ") and line.split()}
    assert "7,087,104" in rows["attention.query"]
    assert "N·(D² + D): 768×768 + 768 = 590,592 per layer × 12 = 7,087,104" in rows["attention.query"]
    assert "V·D: 30522×768 = 23,440,896" in rows["embeddings.word"]
    assert "N·(D·I + I): 3072×768 + 3072 = 2,362,368 per layer × 12 = 28,348,416" in rows["mlp.up"]
    assert "D² + D: 768×768 + 768 = 590,592" in rows["pooler"]
    assert "P = V·D + L·D + T·D + 2·D + N·(4·D² + 2·D·I + 9·D + I) + D² + D" in out
    assert "  V = 30,522, D = 768, L = 512, N = 12, I = 3,072, T = 2\n" in out
    assert "`paramscope formula google-bert/bert-base-uncased --class BertModel` gives the legend" in out


def test_inspect_explain_terms_add_up_to_the_report(capsys):
    """Each role's term, evaluated at the config, is the role's figure in the report (checked, not assumed)."""
    f = derive_formula("bert-base-uncased", model_class="BertForSequenceClassification", num_labels=3)
    report = report_of("bert-base-uncased", "BertForSequenceClassification", None, 3)
    values = {sympy.Symbol(k): v for k, v in f.values.items()}
    assert {role: int(expr.subs(values)) for role, expr in f.by_role.items()} == {
        role: n for role, n in report.breakdown.items() if n}
    assert int(f.by_role["head.classifier"].subs(values)) == 768 * 3 + 3


def test_inspect_explain_without_a_formula_says_why_and_still_succeeds(write_config, capsys):
    path = write_config({"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "vocab_size": 101,
                         "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "intermediate_size": 40, "moe_intermediate_size": 12, "shared_expert_intermediate_size": 20,
                         "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 4,
                         "decoder_sparse_step": 2, "tie_word_embeddings": False})
    assert formula_main(["inspect", str(path), "--explain", "--no-tree", "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "Formula: none shown — no closed-form formula for Qwen2MoeForCausalLM" in out
    assert "decoder_sparse_step" in out


def test_formula_displays_as_text_and_as_latex_in_jupyter():
    f = formula_of(preset("google-bert--bert-base-chinese"), "BertForMaskedLM")
    assert repr(f) == ("<Formula BertForMaskedLM: P = V·D + L·D + T·D + 2·D + N·(4·D² + 2·D·I + 9·D + I) + D² + V "
                       "+ 3·D = 102,290,312>")
    latex = f._repr_latex_()
    assert latex.startswith("$P = V \\cdot D") and latex.endswith("= 102{,}290{,}312$")


def test_inspect_explain_checks_a_cached_formula_against_the_report(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    f = derive_formula("google-bert/bert-base-uncased", model_class="BertModel")
    forge_double_word_embeddings(Path(f.cache_path))  # passes its anchor check; only the report catches it
    assert formula_main(["inspect", "bert-base-uncased", "--class", "BertModel", "--explain", "--no-tree",
                         "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert ("Formula: none shown — the formula gives 132,923,136 but the model has 109,482,240 (or a role "
            "differs); please report this as a paramscope bug") in out
    assert "V·D:" not in out  # no term is shown from a formula that failed its check


# ------------------------------------------------------------------------ aliases: one field, several spellings

FORMULA_CONFIGS = Path(__file__).parent / "configs" / "formula"
QWEN3_MOE = str(FORMULA_CONFIGS / "Qwen--Qwen3-30B-A3B.json")
QWEN25_VL = str(FORMULA_CONFIGS / "Qwen--Qwen2.5-VL-7B-Instruct.json")
SMALL_QWEN3_MOE = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 101,
                   "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 12, "num_hidden_layers": 3,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_experts_per_tok": 2,
                   "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False}


def test_qwen3_moe_attribute_map_alias_is_one_symbol():
    """num_experts is an attribute_map alias of num_local_experts: varied together, one symbol E (issue 9)."""
    f = formula_of(QWEN3_MOE)
    assert f.value == 30_532_122_624 == meta_total(QWEN3_MOE)  # the card: 30.5B
    assert f.symbols["E"] == "num_local_experts"
    assert f.spec.aliases["num_local_experts"] == ("num_experts",)
    assert "num_experts" not in f.symbols.values() and "num_experts" not in f.spec.independent
    N, D, E, I_moe = sympy.symbols("N D E I_moe")
    assert same(f.by_role["moe.experts"], 3 * N * E * D * I_moe)
    # either spelling is read: 2·V·D + D + N·(2·D·H·d_h + 2·K·D·d_h + 3·E·D·I_moe + E·D + 2·d_h + 2·D)
    # = 6,464 + 32 + 3·(2,048 + 1,024 + 6,912 + 192 + 16 + 64) = 37,264 at E = 6
    for experts in ({"num_experts": 6}, {"num_local_experts": 6}):
        config = {**SMALL_QWEN3_MOE, **experts}
        assert f.evaluate(config) == meta_total(config) == 37_264, experts
    # both spellings, disagreeing: refused rather than guessed
    with pytest.raises(AssumptionError, match="spells one field two ways"):
        f.evaluate({**SMALL_QWEN3_MOE, "num_experts": 6, "num_local_experts": 4})


def test_qwen2_5_vl_flat_fields_and_text_config_are_one_symbol():
    """The hub config is flat; the class builds text_config from the flat fields: one symbol per field."""
    f = formula_of(QWEN25_VL)
    assert f.value == 8_292_166_656 == meta_total(QWEN25_VL)  # the card: 8.29B
    assert f.symbols["D"] == "text_config.hidden_size" and f.symbols["D_vision"] == "vision_config.hidden_size"
    assert f.spec.aliases["text_config.hidden_size"] == ("hidden_size",)
    assert f.symbols["N_vision"] == "vision_config.depth"  # attribute_map: depth is its num_hidden_layers
    assert not any(path in f.spec.independent for path in ("hidden_size", "vocab_size", "num_hidden_layers"))
    small_text = {"vocab_size": 101, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2}
    small_vision = {"depth": 2, "hidden_size": 16, "intermediate_size": 24, "num_heads": 2, "out_hidden_size": 32,
                    "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2,
                    "fullatt_block_indexes": [7, 15, 23, 31]}
    flat = {"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "tie_word_embeddings": False, **small_text, "vision_config": small_vision}
    nested = {**flat, "text_config": small_text}
    shadowed = {**flat, "text_config": {**small_text, "hidden_size": 64}}  # a given text_config wins
    for config in (flat, nested, shadowed):
        assert f.evaluate(config) == meta_total(config)
    assert f.evaluate(flat) == f.evaluate(nested) == 34_576
    assert f.evaluate(shadowed) != 34_576


@pytest.mark.parametrize("model", [QWEN3_MOE, QWEN25_VL])
def test_alias_formulas_round_trip_through_the_cache(model, tmp_path, monkeypatch):
    monkeypatch.setenv("PARAMSCOPE_CACHE_DIR", str(tmp_path))
    f = formula_of(model)
    again = FormulaSpec.from_json(json.loads(json.dumps(f.spec.to_json())))
    assert again.aliases == f.spec.aliases and again.anchor_problem() is None


# --------------------------------------------------------------------------- derived quantities: ViT's patches

VIT_BASE = {"model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": 768,
            "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "image_size": 224,
            "patch_size": 16, "num_channels": 3, "qkv_bias": True, "hidden_act": "gelu"}


def test_vit_positions_are_a_polynomial_in_patches_per_side():
    """No polynomial in image_size and patch_size gives (image_size // patch_size)² + 1 positions; one in the
    derived Q = image_size // patch_size does, at every image size (issue 9, point 4)."""
    f = derive_formula(VIT_BASE, num_labels=1000, use_cache=False)
    # 85,798,656 in the backbone (ViT-B/16) + the 1000-way classifier 768·1000 + 1000
    assert f.value == 86_567_656 == meta_total(VIT_BASE, num_labels=1000)
    assert f.spec.derived == {"Q": ("image_size", "patch_size")}
    assert f.spec.definitions() == {"Q": "image_size // patch_size"}
    assert f.values["Q"] == 14
    D, Q, N = sympy.symbols("D Q N")
    # the position table holds Q² patches and the class token's position; the patch projection is a convolution
    assert same(f.by_role["embeddings.position"], (Q**2 + 1) * D)
    assert same(f.by_role["vision.class_token"], D)
    assert same(f.by_role["vision.patch_embedding"],
                D * sympy.Symbol("num_channels") * sympy.Symbol("patch_size") ** 2 + D)
    assert same(f.by_role["attention.norm"] + f.by_role["mlp.norm"], 4 * N * D)
    assert "other" not in f.by_role
    for changes in ({"image_size": 384}, {"image_size": 225}, {"image_size": 200, "patch_size": 32},
                    {"image_size": 30, "patch_size": 7, "hidden_size": 48, "num_hidden_layers": 2}):
        config = {**VIT_BASE, **changes}
        assert f.evaluate(config, num_labels=1000) == meta_total(config, num_labels=1000), changes
    with pytest.raises(AssumptionError, match=r"image_size // patch_size \(Q\) is 0"):
        f.evaluate({**VIT_BASE, "image_size": 8}, num_labels=1000)


def test_derived_symbols_show_in_the_legend_and_the_json(capsys, write_config):
    path = write_config({**VIT_BASE, "hidden_size": 48, "num_hidden_layers": 2, "intermediate_size": 64})
    assert formula_main(["formula", str(path), "--no-cache", "--width", "140"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"Q\s+image_size // patch_size\s+14\s+derived: a whole-number quotient", out)
    assert formula_main(["formula", str(path), "--no-cache", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["formula"]["symbols"]["Q"] == "image_size // patch_size" and doc["values"]["Q"] == 14
    values = {sympy.Symbol(k): v for k, v in doc["values"].items()}
    assert sympy.sympify(doc["formula"]["expression"]).subs(values) == doc["parameters"]["total"]
