"""GGUF as a model input (issue 29 §1): `inspect` and `memory` build the transformers class from a GGUF header's
metadata (never its tensors), `memory` prices the weights at the file's own ggml types to the byte, and `audit`
reconciles the file with that class: every tensor matched to a parameter at its shape and role, the differences
named, and "cannot reconcile: ..." for a file that no class can be built from.

Files are written with gguf's GGUFWriter, with the metadata llama.cpp's convert_hf_to_gguf.py writes for each
architecture, tensors in the shapes it writes them (PyTorch order), a few quantised with gguf.quants.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from paramscope.api import inspect_source  # noqa: E402
from paramscope.checkpoint.gguf_config import gguf_config  # noqa: E402
from paramscope.checkpoint.gguf_memory import gguf_file_format  # noqa: E402
from paramscope.checkpoint.gguf_read import read_gguf  # noqa: E402
from paramscope.cli import main  # noqa: E402

from gguf_files import add_tensors_and_close  # noqa: E402
from paramscope.cost.memory.weights import weight_memory  # noqa: E402
from paramscope.sources import resolve  # noqa: E402

Q = gguf.GGMLQuantizationType
H, I, HEADS, KV, VOCAB = 64, 128, 4, 2, 100  # noqa: E741 - width, intermediate, heads, KV heads, vocabulary


def write(path: Path, arch: str, kv: dict, tensors: dict[str, tuple[tuple[int, ...], Q]], *,
          split_max_tensors: int = 0) -> Path:
    """A GGUF (or shard set) of `arch` with metadata `kv` ({key after "{arch}.": value}) and these tensors."""
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_name("test model")
    for key, value in kv.items():
        if isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    add_tensors_and_close(w, tensors, lambda shape: np.full(shape, 0.5, dtype=np.float32))
    return path


def llama_kv(layers: int = 2) -> dict:
    # what convert_hf_to_gguf.py's LlamaModel writes (rope.dimension_count = head_dim)
    return {"context_length": 4096, "embedding_length": H, "block_count": layers, "feed_forward_length": I,
            "attention.head_count": HEADS, "attention.head_count_kv": KV, "rope.dimension_count": H // HEADS,
            "rope.freq_base": 500000.0, "attention.layer_norm_rms_epsilon": 1e-5}


def llama_tensors(layers: int = 2, *, head: bool = True) -> dict:
    kv = KV * H // HEADS
    out = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32)}
    if head:
        out["output.weight"] = ((VOCAB, H), Q.F16)
    for i in range(layers):
        out |= {f"blk.{i}.attn_norm.weight": ((H,), Q.F32), f"blk.{i}.attn_q.weight": ((H, H), Q.Q4_0),
                f"blk.{i}.attn_k.weight": ((kv, H), Q.Q4_0), f"blk.{i}.attn_v.weight": ((kv, H), Q.Q8_0),
                f"blk.{i}.attn_output.weight": ((H, H), Q.Q4_0), f"blk.{i}.ffn_norm.weight": ((H,), Q.F32),
                f"blk.{i}.ffn_gate.weight": ((I, H), Q.Q4_0), f"blk.{i}.ffn_up.weight": ((I, H), Q.Q4_0),
                f"blk.{i}.ffn_down.weight": ((H, I), Q.Q8_0)}
    return out


def run_json(capsys: pytest.CaptureFixture[str], *argv: str, cache: bool = False) -> dict:
    """A command's JSON; `cache`: with the session's cache (memory's check of the analytic engine against a traced
    prefill is made once per config and compute dtype, not on every call)."""
    assert main([*argv, "--json", *(() if cache else ("--no-cache",))]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    tied = llama_tensors(head=False) | {"rope_freqs.weight": ((H // HEADS // 2,), Q.F32)}
    moe = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32),
           "output.weight": ((VOCAB, H), Q.Q8_0)}
    for i in range(2):
        moe |= {f"blk.{i}.attn_norm.weight": ((H,), Q.F32), f"blk.{i}.attn_q.weight": ((H, H), Q.Q8_0),
                f"blk.{i}.attn_q.bias": ((H,), Q.F32), f"blk.{i}.attn_k.weight": ((32, H), Q.Q8_0),
                f"blk.{i}.attn_k.bias": ((32,), Q.F32), f"blk.{i}.attn_v.weight": ((32, H), Q.Q8_0),
                f"blk.{i}.attn_v.bias": ((32,), Q.F32), f"blk.{i}.attn_output.weight": ((H, H), Q.Q8_0),
                f"blk.{i}.ffn_norm.weight": ((H,), Q.F32), f"blk.{i}.ffn_gate_inp.weight": ((4, H), Q.F32),
                f"blk.{i}.ffn_gate_exps.weight": ((4, 32, H), Q.Q4_0),
                f"blk.{i}.ffn_up_exps.weight": ((4, 32, H), Q.Q4_0),
                f"blk.{i}.ffn_down_exps.weight": ((4, H, 32), Q.Q8_0),
                f"blk.{i}.ffn_gate_inp_shexp.weight": ((1, H), Q.F32),
                f"blk.{i}.ffn_gate_shexp.weight": ((96, H), Q.Q8_0), f"blk.{i}.ffn_up_shexp.weight": ((96, H), Q.Q8_0),
                f"blk.{i}.ffn_down_shexp.weight": ((H, 96), Q.Q8_0)}
    moe_kv = {k: v for k, v in llama_kv().items() if k != "rope.dimension_count"} | {
        "expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32,
        "expert_shared_feed_forward_length": 96}
    # Mixtral as convert_hf_to_gguf.py writes it: architecture llama with llama.expert_count, experts as 3-D tensors
    mixtral = {k: v for k, v in llama_tensors().items()
               if not any(f".{n}." in k for n in ("ffn_gate", "ffn_up", "ffn_down"))}
    for i in range(2):
        mixtral |= {f"blk.{i}.ffn_gate_inp.weight": ((4, H), Q.F32),
                    f"blk.{i}.ffn_gate_exps.weight": ((4, I, H), Q.Q4_0),
                    f"blk.{i}.ffn_up_exps.weight": ((4, I, H), Q.Q4_0),
                    f"blk.{i}.ffn_down_exps.weight": ((4, H, I), Q.Q8_0)}
    # Gemma 2: head_dim 32 ≠ 64 / 4 (attention.key_length), four norms a layer, tied head, soft-capping
    gemma2 = {"token_embd.weight": ((VOCAB, H), Q.Q8_0), "output_norm.weight": ((H,), Q.F32)}
    for i in range(2):
        gemma2 |= {f"blk.{i}.attn_norm.weight": ((H,), Q.F32), f"blk.{i}.attn_q.weight": ((128, H), Q.Q8_0),
                   f"blk.{i}.attn_k.weight": ((64, H), Q.Q8_0), f"blk.{i}.attn_v.weight": ((64, H), Q.Q8_0),
                   f"blk.{i}.attn_output.weight": ((H, 128), Q.Q8_0),
                   f"blk.{i}.post_attention_norm.weight": ((H,), Q.F32), f"blk.{i}.ffn_norm.weight": ((H,), Q.F32),
                   f"blk.{i}.ffn_gate.weight": ((I, H), Q.Q8_0), f"blk.{i}.ffn_up.weight": ((I, H), Q.Q8_0),
                   f"blk.{i}.ffn_down.weight": ((H, I), Q.Q8_0), f"blk.{i}.post_ffw_norm.weight": ((H,), Q.F32)}
    gemma2_kv = {k: v for k, v in llama_kv().items() if k != "rope.dimension_count"} | {
        "attention.key_length": 32, "attention.value_length": 32, "attention.sliding_window": 512,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
    shards = root / "shards"
    shards.mkdir()
    write(shards / "model.gguf", "llama", llama_kv(), llama_tensors(), split_max_tensors=8)
    wide = llama_tensors() | {f"blk.{i}.ffn_up.weight": ((96, H), Q.F32) for i in range(2)}
    return {
        "llama": write(root / "llama.gguf", "llama", llama_kv(), llama_tensors()),
        "tied": write(root / "tied.gguf", "llama", llama_kv(), tied),
        "qwen2moe": write(root / "qwen2moe.gguf", "qwen2moe", moe_kv, moe),
        "shards": shards,
        "mixtral": write(root / "mixtral.gguf", "llama", llama_kv() | {"expert_count": 4, "expert_used_count": 2},
                         mixtral),
        "gemma2": write(root / "gemma2.gguf", "gemma2", gemma2_kv, gemma2),
        "hostile_layers": write(root / "layers.gguf", "llama", llama_kv(layers=32), llama_tensors(layers=2)),
        "unknown": write(root / "unknown.gguf", "nosucharch", llama_kv(), llama_tensors()),
        "huge": write(root / "huge.gguf", "llama", llama_kv() | {"embedding_length": 2**31}, llama_tensors()),
        "shape": write(root / "shape.gguf", "llama", llama_kv(), wide),
    }


def test_the_config_transformers_would_build_from_the_metadata(files: dict[str, Path]) -> None:
    built = gguf_config(read_gguf(files["llama"]))
    assert built.class_name == "LlamaForCausalLM" and built.architecture == "llama"
    assert built.config == {"model_type": "llama", "max_position_embeddings": 4096, "num_hidden_layers": 2,
                            "intermediate_size": I, "hidden_size": H, "head_dim": 16, "rope_theta": 500000.0,
                            "num_attention_heads": HEADS, "num_key_value_heads": KV,
                            "rms_norm_eps": float(np.float32(1e-5)),  # a float32 in the file, as transformers reads it
                            "vocab_size": VOCAB, "tie_word_embeddings": False, "architectures": ["LlamaForCausalLM"]}
    assert built.notes == ("vocab_size 100 from the length of tokenizer.ggml.tokens (as transformers takes it)",)
    moe = gguf_config(read_gguf(files["qwen2moe"]))
    assert (moe.model_type, moe.class_name) == ("qwen2_moe", "Qwen2MoeForCausalLM")
    assert {k: moe.config[k] for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                       "shared_expert_intermediate_size")} == {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 96}
    assert any("moe_intermediate_size from qwen2moe.expert_feed_forward_length" in n for n in moe.notes)
    assert gguf_config(read_gguf(files["tied"])).config["tie_word_embeddings"] is True


def test_inspect_a_gguf_file_a_shard_set_and_a_cache_folder(files: dict[str, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    ck = read_gguf(files["llama"])
    doc = run_json(capsys, "inspect", str(files["llama"]))
    assert doc["model"]["class"] == "LlamaForCausalLM" and doc["model"]["source_kind"] == "gguf"
    assert doc["parameters"]["total"] == ck.elements == 86_848
    assert doc["breakdown"] == {role: row["elements"] for role, row in ck.by_role().items()} | doc["breakdown"]
    assert main(["inspect", str(files["shards"]), "--no-cache", "--no-tree"]) == 0
    text = capsys.readouterr().out
    assert "LlamaForCausalLM's config from its header's metadata" in text and "(3 shards)" in text
    repo = tmp_path / "models--org--Model-GGUF"
    (repo / "snapshots" / ("b" * 40)).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("b" * 40)
    (repo / "blobs").mkdir()  # as huggingface_hub lays a download out: the snapshot links to its blob
    (repo / "blobs" / ("c" * 64)).write_bytes(files["llama"].read_bytes())
    (repo / "snapshots" / ("b" * 40) / "m.gguf").symlink_to(Path("..", "..", "blobs", "c" * 64))
    shard = sorted(files["shards"].glob("*.gguf"))[1]
    assert "-00002-of-00003" in shard.name
    for given in (shard, repo):  # any shard names its set; a cache folder its snapshot's file
        source = resolve(str(given))
        assert source.kind == "gguf" and source.config == resolve(str(files["llama"])).config
        assert source.checkpoint.elements == 86_848


def test_memory_prices_the_weights_at_the_files_own_types(files: dict[str, Path],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    ck = read_gguf(files["llama"])
    llama = run_json(capsys, "memory", str(files["llama"]), "--seq", "512", cache=True)["memory"]
    assert llama["weights"]["by_dtype"] == {t.lower(): row["bytes"] for t, row in ck.by_type().items()}
    assert llama["settings"]["dtype"] == "gguf-file"
    assert llama["weights"]["bytes"] == ck.nbytes == 72_592
    # the MoE's weights priced by the same format, without the serving answer around them (memory/weights.py)
    moe = read_gguf(files["qwen2moe"])
    report, _ = inspect_source(resolve(str(files["qwen2moe"])), use_cache=False)
    fmt = gguf_file_format(moe, 2)
    weights = weight_memory(report.params, report.buffers, fmt, quantized=fmt.quantized_names(report.params))
    assert dict(weights.by_dtype) == {t.lower(): row["bytes"] for t, row in moe.by_type().items()}
    # a layer: Q8_0 q, k, v, o, down_exps and the shared expert (20,480 values / 32 × 34 B = 41,344), Q4_0 gate_exps
    # and up_exps (16,384 / 32 × 18 = 9,216), F32 norms, biases and routers (576 × 4 = 2,304); 2 layers + Q8_0
    # token_embd and output (2 × 6,800) + F32 output_norm (256)
    assert weights.bytes == moe.nbytes == 2 * (41_344 + 9_216 + 2_304) + 2 * 6_800 + 256 == 119_584
    assert weights.quantized == moe.by_type()["Q8_0"]["elements"] + moe.by_type()["Q4_0"]["elements"]
    # the KV cache from the built config: 2 layers × 2 (K, V) × 2 KV heads × 16 × 512 tokens × 2 B (llama.cpp's f16)
    assert llama["kv_cache"]["bytes"] == 2 * 2 * 2 * 16 * 512 * 2
    # --dtype still prices the class in one type instead
    fp32 = run_json(capsys, "memory", str(files["llama"]), "--dtype", "fp32", "--seq", "512", cache=True)["memory"]
    assert fp32["weights"]["bytes"] == 86_848 * 4
    # tp 2: a rank holds half of every matrix in its own ggml type (whole rows or whole blocks), the F32 norms whole
    rank = run_json(capsys, "memory", str(files["llama"]), "--tp", "2", "--seq", "512", cache=True)["memory"]
    rank = rank["layout"]["device"]
    assert rank["weights"]["by_dtype"] == {"q4_0": 29_952 // 2, "q8_0": 28_560 // 2, "f16": 12_800 // 2, "f32": 1_280}


def test_audit_reconciles_a_llama_with_its_class(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    rec = run_json(capsys, "audit", str(files["llama"]))["checkpoint"]["reconcile"]
    assert (rec["class"], rec["equal"], rec["cannot"]) == ("LlamaForCausalLM", True, None)
    assert rec["file_parameters"] == rec["class_parameters"] == rec["matched_parameters"] == 86_848
    assert rec["differences"] == [] and len(rec["matches"]) == 21
    assert all(r["file"] == r["class"] for r in rec["roles"].values()) and len(rec["roles"]) == 12
    q = next(m for m in rec["matches"] if m["parameter"] == "model.layers.1.self_attn.q_proj.weight")
    assert q == {"parameter": "model.layers.1.self_attn.q_proj.weight", "gguf": ["blk.1.attn_q.weight"],
                 "shape": [H, H], "gguf_shapes": [[H, H]], "elements": H * H, "bytes": H * H // 32 * 18,
                 "ggml_types": ["Q4_0"], "role": "attention.query",
                 "how": "rows permuted for rope (convert_hf_to_gguf.py), shape kept"}
    assert main(["audit", str(files["llama"]), "--no-cache"]) == 0
    text = capsys.readouterr().out
    assert "reconciles with LlamaForCausalLM: equal — 86,848 parameters" in text
    assert "4 tensors: rows permuted for rope" in text


def test_audit_takes_the_class_asked(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """--class is honoured, not ignored: the bare LlamaModel holds no head, so the file's output.weight is its own."""
    rec = run_json(capsys, "audit", str(files["llama"]), "--class", "LlamaModel")["checkpoint"]["reconcile"]
    assert (rec["class"], rec["equal"]) == ("LlamaModel", False)
    assert [d["name"] for d in rec["differences"]] == ["output.weight"]


def test_a_tied_head_and_llama_cpps_rope_factors_are_named(files: dict[str, Path],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    rec = run_json(capsys, "audit", str(files["tied"]))["checkpoint"]["reconcile"]
    assert rec["equal"] is True
    assert rec["file_parameters"] == 86_848 - VOCAB * H + 8 and rec["class_parameters"] == 86_848 - VOCAB * H
    assert [(d["kind"], d["name"], d["elements"], d["explained"]) for d in rec["differences"]] == [
        ("tied", "lm_head.weight", 0, True), ("file only", "rope_freqs.weight", 8, True)]
    # memory: the tied head costs nothing more, and the file's rope factors (8 × 4 B) are no parameter
    ck = read_gguf(files["tied"])
    report, _ = inspect_source(resolve(str(files["tied"])), use_cache=False)
    fmt = gguf_file_format(ck, 2)
    weights = weight_memory(report.params, report.buffers, fmt, quantized=fmt.quantized_names(report.params))
    assert weights.bytes == ck.nbytes - 32 == 59_792
    assert fmt.label.endswith("its rope_freqs (32 B) is the class's rotary buffer here")


def test_a_qwen2_moe_with_fused_experts_and_a_shared_expert(files: dict[str, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    ck = read_gguf(files["qwen2moe"])
    rec = run_json(capsys, "audit", str(files["qwen2moe"]))["checkpoint"]["reconcile"]
    assert (rec["class"], rec["equal"]) == ("Qwen2MoeForCausalLM", True), rec["differences"]
    assert rec["file_parameters"] == rec["class_parameters"] == ck.elements == 124_608
    fused = next(m for m in rec["matches"] if m["parameter"] == "model.layers.0.mlp.experts.gate_up_proj")
    assert fused["gguf"] == ["blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"]
    assert (fused["shape"], fused["gguf_shapes"]) == ([4, 64, H], [[4, 32, H], [4, 32, H]])
    assert fused["bytes"] == 2 * 4 * 32 * H // 32 * 18 and fused["how"].startswith("fused: gate ‖ up")


@pytest.mark.parametrize(("key", "cls", "params", "how"), [
    # 2 layers × (norms 128 + q 4,096 + k, v 2 × 2,048 + o 4,096 + router 256 + 3 × 4 × 128 × 64 experts)
    # + token_embd, output 2 × 6,400 + output_norm 64
    ("mixtral", "MixtralForCausalLM", 2 * (128 + 4_096 + 2 * 2_048 + 4_096 + 256 + 3 * 4 * I * H) + 2 * 6_400 + 64,
     {"as is": 15, "rows permuted for rope (convert_hf_to_gguf.py), shape kept": 4,
      "fused: gate ‖ up along dim 1 (transformers' gate_up_proj)": 2}),
    # 2 layers × (4 norms 256 + q, o 2 × 8,192 + k, v 2 × 4,096 + gate, up, down 3 × 8,192) + token_embd 6,400 + 64
    ("gemma2", "Gemma2ForCausalLM", 2 * (256 + 2 * 8_192 + 2 * 4_096 + 3 * 8_192) + 6_400 + 64, {"as is": 24}),
])
def test_mixtral_written_as_llama_and_gemma_2_reconcile(files: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                                        key: str, cls: str, params: int, how: dict) -> None:
    rec = run_json(capsys, "audit", str(files[key]))["checkpoint"]["reconcile"]
    assert (rec["class"], rec["equal"]) == (cls, True), rec["differences"]
    assert rec["file_parameters"] == rec["class_parameters"] == read_gguf(files[key]).elements == params
    ways: dict[str, int] = {}
    for m in rec["matches"]:
        ways[m["how"]] = ways.get(m["how"], 0) + 1
    assert ways == how
    if key == "gemma2":
        config = gguf_config(read_gguf(files[key])).config
        assert (config["head_dim"], config["sliding_window"], config["attn_logit_softcapping"],
                config["final_logit_softcapping"], config["tie_word_embeddings"]) == (32, 512, 50.0, 30.0, True)


def test_a_file_that_differs_from_its_class_names_each_difference(files: dict[str, Path],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rec = run_json(capsys, "audit", str(files["shape"]))["checkpoint"]["reconcile"]
    assert rec["equal"] is False
    assert [(d["kind"], d["name"]) for d in rec["differences"]] == [
        ("shape", "model.layers.0.mlp.up_proj.weight"), ("shape", "model.layers.1.mlp.up_proj.weight")]
    assert "blk.0.ffn_up.weight 96×64 ≠ the class's 128×64" in rec["differences"][0]["why"]
    assert main(["audit", str(files["shape"]), "--no-cache"]) == 0
    assert "does not reconcile with LlamaForCausalLM: 2 differences" in capsys.readouterr().out


@pytest.mark.parametrize(("key", "why"), [
    ("hostile_layers", "the metadata says 32 layers (llama.block_count), the file holds tensors for blk.0–blk.1, "
                       "2 blocks"),
    ("unknown", "transformers has no config mapping for architecture 'nosucharch'"),
    ("huge", "hidden_size = 2147483648 from its metadata is no count between 0 and 1,048,576"),
])
def test_a_file_no_class_can_be_built_from(files: dict[str, Path], capsys: pytest.CaptureFixture[str], key: str,
                                           why: str) -> None:
    rec = run_json(capsys, "audit", str(files[key]))["checkpoint"]["reconcile"]
    assert rec["equal"] is False and rec["cannot"].startswith(why)
    assert main(["audit", str(files[key]), "--no-cache"]) == 0
    assert f"cannot reconcile: {why}" in capsys.readouterr().out
    for command in ("inspect", "memory"):
        assert main([command, str(files[key]), "--no-cache"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err and "Traceback" not in err


def test_a_full_size_llama_3_8b_header_reconciles_to_the_parameter(tmp_path: Path) -> None:
    """Meta-Llama-3-8B's 291 tensors in a Q4_K_M-like mixture (attn_v and ffn_down Q6_K in llama.cpp's use_more_bits
    layers, output Q6_K), header only: the data section is a sparse hole, so the file costs no disk."""
    from paramscope.checkpoint.gguf_reconcile import reconcile_gguf

    hidden, inter, layers, vocab = 4096, 14336, 32, 128256
    path = tmp_path / "Meta-Llama-3-8B-Q4_K_M.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"context_length": 8192, "embedding_length": hidden, "block_count": layers,
                       "feed_forward_length": inter, "attention.head_count": 32, "attention.head_count_kv": 8,
                       "rope.dimension_count": 128}.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.rope.freq_base", 500000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)

    def info(name: str, shape: tuple[int, ...], qtype: Q) -> None:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = int(np.prod(shape)) // block * size
        if qtype == Q.F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
        else:  # the writer takes a quantised tensor's shape in bytes per row
            w.add_tensor_info(name, (*shape[:-1], shape[-1] // block * size), np.dtype(np.uint8), nbytes,
                              raw_dtype=qtype)

    info("token_embd.weight", (vocab, hidden), Q.Q4_K)
    info("output_norm.weight", (hidden,), Q.F32)
    info("output.weight", (vocab, hidden), Q.Q6_K)
    for i in range(layers):
        more = i < 4 or i >= 28 or (i - 4) % 3 == 2  # llama.cpp's use_more_bits over 32 layers
        for name, shape, qtype in (("attn_norm", (hidden,), Q.F32), ("attn_q", (hidden, hidden), Q.Q4_K),
                                   ("attn_k", (1024, hidden), Q.Q4_K),
                                   ("attn_v", (1024, hidden), Q.Q6_K if more else Q.Q4_K),
                                   ("attn_output", (hidden, hidden), Q.Q4_K), ("ffn_norm", (hidden,), Q.F32),
                                   ("ffn_gate", (inter, hidden), Q.Q4_K), ("ffn_up", (inter, hidden), Q.Q4_K),
                                   ("ffn_down", (hidden, inter), Q.Q6_K if more else Q.Q4_K)):
            info(f"blk.{i}.{name}.weight", shape, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    data = sum(-(-ti.nbytes // 32) * 32 for ti in w.tensors[0].values())
    with open(path, "r+b") as f:
        f.truncate(-(-path.stat().st_size // 32) * 32 + data)
    if path.stat().st_blocks * 512 > 64 * 2**20:
        pytest.skip("this filesystem writes sparse files out")
    ck = read_gguf(path)
    assert (len(ck.tensors), ck.nbytes) == (291, 4_912_898_048)  # 4.58 GiB, 4.89 bits per weight, as llama.cpp says
    source = resolve(str(path))
    assert source.config["vocab_size"] == vocab  # from token_embd's rows: this header has no tokenizer
    report, _ = inspect_source(source, use_cache=False)
    rec = reconcile_gguf(ck, report.params, report.model.class_name, layers)
    assert rec.equal and rec.file_parameters == rec.class_parameters == 8_030_261_248
    assert sum(1 for m in rec.matches if m.how != "as is") == 64  # q and k of every layer, rope-permuted
