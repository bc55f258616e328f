"""Every hostile or mistaken input, as a user would type it: one line, a non-zero exit, seconds and megabytes.

Each case runs `python -m paramscope …` in its own process, offline, and is measured: exit code, stderr is one
line naming the problem, nothing on stdout, no traceback, at most MAX_RSS of peak resident memory (the child's own,
from wait4) and at most MAX_SECONDS of wall time. MAX_SECONDS guards against minutes (retries, loops, reading
/dev/zero), not a timing: the figures are measured one process at a time (docs/benchmarks.md, "Hostile input and the
bounds": slowest 6.7 s, the cases that import a model class); under CI's two workers on two cores the same case has
taken 11.7 s. Each case's test runs its own process, as a user runs it (not one
fixture for all: under xdist every worker would run all of them).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from conftest import bert_config

MAX_SECONDS = 30.0  # a guard against minutes; the measured times are docs/benchmarks.md's
MAX_RSS_BYTES = 1 << 30
SRC = Path(__file__).resolve().parent.parent / "src"
SHA = "0123456789abcdef0123456789abcdef01234567"


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[Path], list[str]]  # builds its files under a folder of its own, returns the argv
    expect: tuple[str, ...]  # fragments the one line must hold


def _config(tmp: Path, content, name: str = "config.json") -> str:
    path = tmp / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def inspect_config(content, *extra: str) -> Callable[[Path], list[str]]:
    return lambda tmp: ["inspect", _config(tmp, content), *extra]


def memory_config(content, *extra: str) -> Callable[[Path], list[str]]:
    return lambda tmp: ["memory", _config(tmp, content), *extra]


def mixtral(**fields) -> dict:
    return {"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
            "num_experts_per_tok": 2, **fields}


def llama(**fields) -> dict:
    return {"model_type": "llama", "vocab_size": 32000, "hidden_size": 5120, "intermediate_size": 13824,
            "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40, **fields}


def nested(depth: int, opener: str = "[", closer: str = "]") -> str:
    return '{"model_type": "bert", "x": ' + opener * depth + closer * depth + "}"


def fifo(tmp: Path, name: str) -> str:
    path = tmp / name
    os.mkfifo(path)
    return str(path)


def fifo_config_dir(tmp: Path) -> list[str]:
    folder = tmp / "model"
    folder.mkdir()
    fifo(folder, "config.json")
    return ["inspect", str(folder)]


def cache_repo(tmp: Path, ref: bytes | None, *, snapshot: str = SHA) -> Path:
    repo = tmp / "models--someorg--model"
    (repo / "snapshots" / snapshot).mkdir(parents=True)
    (repo / "snapshots" / snapshot / "config.json").write_text(json.dumps(bert_config()))
    (repo / "refs").mkdir()
    if ref is not None:
        (repo / "refs" / "main").write_bytes(ref)
    return repo


def fifo_ref(tmp: Path) -> Path:
    repo = cache_repo(tmp, None)
    os.mkfifo(repo / "refs" / "main")
    return repo


def climbing_ref(tmp: Path) -> list[str]:
    """refs/main naming ../../.. must not lead to a config.json outside the cache folder."""
    (tmp / "config.json").write_text(json.dumps(bert_config()))
    repo = tmp / "cache" / "models--someorg--model"
    (repo / "refs").mkdir(parents=True)
    (repo / "snapshots").mkdir()
    (repo / "refs" / "main").write_text("../..")
    return ["inspect", str(repo)]


def safetensors_bytes(header: bytes | dict, data: bytes = b"", length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def checkpoint_dir(tmp: Path, files: dict[str, bytes | str | None]) -> Path:
    """A model folder: BERT's config.json plus `files` (bytes, a symlink target given as str, or None: a FIFO)."""
    folder = tmp / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(bert_config()))
    for name, content in files.items():
        if content is None:
            os.mkfifo(folder / name)
        elif isinstance(content, str):
            os.symlink(content, folder / name)
        else:
            (folder / name).write_bytes(content)
    return folder


def audit_dir(files: dict[str, bytes | str | None]) -> Callable[[Path], list[str]]:
    return lambda tmp: ["audit", str(checkpoint_dir(tmp, files))]


ONE_TENSOR = safetensors_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
INDEX = json.dumps({"weight_map": {"a": "shard.safetensors"}}).encode()
KIMI = {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                     "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}}
REMOTE = {"model_type": "my_custom", "auto_map": {"AutoConfig": "configuration_x.XConfig",
                                                   "AutoModel": "modeling_x.XModel"}}
DIMENSION = 2**31 - 1

CASES = [
    # --- the config file itself ---------------------------------------------------------------------------------
    Case("malformed-json", inspect_config('{"model_type": "bert", '), ("malformed JSON", "line 1")),
    Case("json-array", inspect_config("[1, 2, 3]"), ("expected a JSON object, got list",)),
    Case("json-string", inspect_config('"bert"'), ("expected a JSON object, got str",)),
    Case("json-null", inspect_config("null"), ("expected a JSON object",)),
    Case("empty-file", inspect_config(""), ("malformed JSON",)),
    Case("not-utf8", inspect_config(b'{"model_type": "\xff\xfe"}'), ("not UTF-8",)),
    Case("nul-bytes", inspect_config(b"\0" * 64), ("malformed JSON",)),
    Case("5000-digit-int", inspect_config('{"model_type": "bert", "vocab_size": ' + "9" * 5000 + "}"),
         ("5,000 digits",)),
    Case("50-digit-int", inspect_config('{"model_type": "bert", "seed": ' + "7" * 50 + "}"), ("50 digits",)),
    Case("nested-1e5-lists", inspect_config(nested(100_000)), ("nested too deeply",)),
    Case("nested-1e5-objects", inspect_config('{"model_type": "bert", "x": ' + '{"a": ' * 100_000 + "1"
                                              + "}" * 100_001), ("nested too deeply",)),
    Case("nested-100", inspect_config(nested(100)), ("nested too deeply", "64")),
    Case("lone-surrogate-model-type", inspect_config('{"model_type": "\\ud800bert"}'), ("lone surrogate",)),
    Case("lone-surrogate-key", inspect_config('{"model_type": "bert", "\\udfff": 1}'), ("lone surrogate",)),
    Case("config-over-16mib", inspect_config('{"model_type": "bert"}' + " " * (17 << 20)), ("16,777,216-byte",)),
    Case("dev-zero", lambda tmp: ["inspect", "/dev/zero"], ("character device",)),
    Case("dev-null", lambda tmp: ["inspect", "/dev/null"], ("character device",)),
    Case("fifo-config", lambda tmp: ["inspect", fifo(tmp, "config.json")], ("FIFO",)),
    Case("fifo-config-in-dir", fifo_config_dir, ("FIFO",)),
    Case("dir-without-config", lambda tmp: ["inspect", str(tmp)], ("no config.json",)),
    Case("missing-file", lambda tmp: ["inspect", str(tmp / "none" / "config.json")], ("no such file",)),
    Case("empty-name", lambda tmp: ["inspect", ""], ("empty model name",)),
    Case("unknown-preset", lambda tmp: ["inspect", "bert-base-uncasd"], ("unknown model 'bert-base-uncasd'",)),
    Case("preset-misspelled", lambda tmp: ["inspect", "lama-3-8b"], ("unknown model 'lama-3-8b'",
                                                                      "did you mean 'llama-3-8b'?")),
    Case("preset-hub-id-misspelled", lambda tmp: ["inspect", "google-bert/bert-base-uncasd"],
         ("HF_HUB_OFFLINE", "did you mean 'google-bert/bert-base-uncased'?")),
    Case("command-misspelled", lambda tmp: ["inpsect", "gpt2"], ("unknown command 'inpsect'; did you mean 'inspect'?",)),
    Case("command-misspelled-option-first", lambda tmp: ["--debug", "memroy", "gpt2", "--seq", "64"],
         ("unknown command 'memroy'; did you mean 'memory'?",)),
    Case("command-unknown", lambda tmp: ["explode", "gpt2"], ("unknown command 'explode'", "inspect, presets")),
    Case("command-misspelled-alone", lambda tmp: ["inpsect"], ("unknown model 'inpsect'", "the command 'inspect'")),
    Case("two-models-no-command", lambda tmp: ["gpt2", "bert-base-uncased"],
         ("inspect takes one model", "'bert-base-uncased'", "paramscope compare")),
    # --- fields ---------------------------------------------------------------------------------------------------
    Case("no-model-type", inspect_config({"hidden_size": 768}), ("no 'model_type'",)),
    Case("model-type-int", inspect_config({"model_type": 123}), ("'model_type' must be a string", "123")),
    Case("model-type-list", inspect_config({"model_type": ["bert"]}), ("'model_type' must be a string",)),
    Case("unknown-model-type", inspect_config(bert_config(model_type="bertish")), ("unknown model_type 'bertish'",)),
    Case("architectures-string", inspect_config(bert_config(architectures="BertModel")),
         ("'architectures' must be a list",)),
    Case("architectures-ints", inspect_config(bert_config(architectures=[1, 2])),
         ("'architectures' must be a list",)),
    Case("architectures-nested", inspect_config(bert_config(architectures=[["BertModel"]])),
         ("'architectures' must be a list",)),
    Case("layers-1e5", inspect_config(bert_config(num_hidden_layers=10**5)), ("'num_hidden_layers'", "100,000")),
    Case("layers-1e9", inspect_config(bert_config(num_hidden_layers=10**9)), ("'num_hidden_layers'", "1,024")),
    Case("layers-1e12", inspect_config(bert_config(num_hidden_layers=10**12)), ("'num_hidden_layers'",)),
    Case("layers-zero", inspect_config(bert_config(num_hidden_layers=0)), ("'num_hidden_layers' must be positive",)),
    Case("layers-negative", inspect_config(bert_config(num_hidden_layers=-1)), ("'num_hidden_layers'", "-1")),
    Case("layers-string", inspect_config(bert_config(num_hidden_layers="12")), ("must be an integer", "'12'")),
    Case("layers-bool", inspect_config(bert_config(num_hidden_layers=True)), ("must be an integer", "True")),
    Case("layers-float", inspect_config(bert_config(num_hidden_layers=1.5)), ("must be an integer", "1.5")),
    Case("layers-list-of-text", inspect_config(bert_config(num_hidden_layers=[12, "x"])), ("must be an integer",)),
    Case("gpt2-n-layer-1e6", inspect_config({"model_type": "gpt2", "n_layer": 10**6}), ("'n_layer'",)),
    Case("t5-num-layers-1e6", inspect_config({"model_type": "t5", "num_layers": 10**6}), ("'num_layers'",)),
    Case("bart-decoder-layers-1e6", inspect_config({"model_type": "bart", "decoder_layers": 10**6}),
         ("'decoder_layers'",)),
    Case("vocab-2pow64", inspect_config(bert_config(vocab_size=2**64 + 1)), ("'vocab_size'", "2^31")),
    Case("vocab-2pow31", inspect_config(bert_config(vocab_size=2**31)), ("'vocab_size'", "2,147,483,648")),
    Case("hidden-zero", inspect_config(bert_config(hidden_size=0)), ("'hidden_size' must be positive",)),
    Case("intermediate-negative", inspect_config(bert_config(intermediate_size=-3072)), ("'intermediate_size'",)),
    Case("position-zero", inspect_config(bert_config(max_position_embeddings=0)), ("'max_position_embeddings'",)),
    Case("head-dim-negative", inspect_config(llama(head_dim=-128)), ("'head_dim'",)),
    Case("type-vocab-negative", inspect_config(bert_config(type_vocab_size=-1)), ("'type_vocab_size'",)),
    Case("three-dims-overflow", inspect_config(llama(vocab_size=DIMENSION, hidden_size=DIMENSION - 1,
                                                      num_attention_heads=1, num_key_value_heads=1,
                                                      intermediate_size=DIMENSION)),
         ("overflows a 64-bit element count",)),
    Case("heads-not-dividing", inspect_config(bert_config(hidden_size=770)), ("770", "not divisible", "12")),
    Case("kv-heads-7-of-40", inspect_config(llama(num_key_value_heads=7)), ("40", "num_key_value_heads 7")),
    Case("kv-heads-more-than-heads", inspect_config(llama(num_key_value_heads=80)), ("num_key_value_heads 80",)),
    Case("kv-heads-zero", inspect_config(llama(num_key_value_heads=0)), ("'num_key_value_heads' must be positive",)),
    Case("num-labels-1e9-in-config", inspect_config(bert_config(num_labels=10**9)), ("'num_labels'", "100,000")),
    Case("num-labels-zero-in-config", inspect_config(bert_config(num_labels=0)), ("'num_labels'",)),
    Case("id2label-200k", inspect_config(bert_config(id2label={str(i): "x" for i in range(200_000)})),
         ("'id2label'", "200,000")),
    # the fields the cost engines read (issue 30 §3): refused in one line before torch, never a silent answer
    Case("top-k-above-experts", memory_config(mixtral(num_experts_per_tok=10**9)),
         ("'num_experts_per_tok'", "1 to the 8", "1000000000")),
    Case("top-k-zero", memory_config(mixtral(num_experts_per_tok=0)), ("'num_experts_per_tok'", "got 0")),
    Case("top-k-negative", memory_config(mixtral(num_experts_per_tok=-2)), ("'num_experts_per_tok'", "got -2")),
    Case("top-k-zero-training", memory_config(mixtral(num_experts_per_tok=0), "--training"),
         ("'num_experts_per_tok'",)),
    Case("sliding-window-negative", memory_config(llama(sliding_window=-1)), ("'sliding_window'", "got -1")),
    Case("chunk-negative", memory_config(llama(attention_chunk_size=-8)), ("'attention_chunk_size'", "got -8")),
    Case("torch-dtype-unknown", memory_config(llama(torch_dtype="float1024")), ("'torch_dtype'", "float1024")),
    Case("rope-scaling-string", memory_config(llama(rope_scaling="abc")), ("'rope_scaling'", "'abc'")),
    Case("id2label-string", inspect_config(bert_config(id2label="x")), ("'id2label'", "mapping")),
    Case("gptq-bits-zero", memory_config(llama(quantization_config={"quant_method": "gptq", "bits": 0})),
         ("'quantization_config.bits'", "2, 3, 4, 8", "got 0")),
    Case("gptq-bits-huge", memory_config(llama(quantization_config={"quant_method": "gptq", "bits": 10**9})),
         ("'quantization_config.bits'", "1000000000")),
    Case("gptq-group-zero", memory_config(llama(quantization_config={"quant_method": "gptq", "bits": 4,
                                                                     "group_size": 0})),
         ("'quantization_config.group_size'", "got 0")),
    Case("awq-group-negative", memory_config(llama(quantization_config={"quant_method": "awq", "bits": 4,
                                                                        "group_size": -7})),
         ("'quantization_config.group_size'", "got -7")),
    Case("sub-config-layers", inspect_config({"model_type": "llava", "text_config": llama(num_hidden_layers=10**6)}),
         ("'text_config.num_hidden_layers'",)),
    Case("sub-config-hidden", inspect_config({"model_type": "llava", "vision_config": {"hidden_size": -3}}),
         ("'vision_config.hidden_size'",)),
    Case("experts-overflow", inspect_config({"model_type": "mixtral", "num_local_experts": DIMENSION,
                                             "hidden_size": DIMENSION - 1, "intermediate_size": DIMENSION,
                                             "num_attention_heads": 1, "num_key_value_heads": 1}),
         ("overflows",)),
    # --- classes, tasks, remote code -------------------------------------------------------------------------------
    Case("remote-code-refused", inspect_config(REMOTE), ("'my_custom'", "--trust-remote-code")),
    Case("native-auto-map-suggests-class", inspect_config(KIMI), ("'kimi_k2'", "--class DeepseekV3ForCausalLM")),
    Case("remote-code-missing-module", inspect_config(REMOTE, "--trust-remote-code"), ("configuration_x",)),
    Case("remote-code-no-auto-config", inspect_config({**REMOTE, "auto_map": {"AutoModel": "m.X"}},
                                                      "--trust-remote-code"), ("no AutoConfig",)),
    Case("unknown-task", inspect_config(bert_config(), "--task", "summarise-poems"), ("unknown task",)),
    Case("unknown-class", inspect_config(bert_config(), "--class", "BertForEverything"),
         ("unknown class 'BertForEverything'",)),
    Case("class-of-other-type", inspect_config(bert_config(), "--class", "GPT2Model"), ("GPT2Model", "'gpt2'")),
    Case("class-and-task", inspect_config(bert_config(), "--class", "BertModel", "--task", "ner"),
         ("not both",)),
    Case("task-without-class", inspect_config(llama(), "--task", "multiple-choice"), ("multiple-choice",)),
    Case("num-labels-1e12", inspect_config(bert_config(), "--task", "ner", "--num-labels", str(10**12)),
         ("--num-labels", "100,000")),
    Case("num-labels-zero", inspect_config(bert_config(), "--num-labels", "0"), ("--num-labels",)),
    Case("num-labels-negative", inspect_config(bert_config(), "--num-labels", "-5"), ("--num-labels", "-5")),
    Case("inspect-width-negative", lambda tmp: ["inspect", "bert-base-uncased", "--width", "-5"], ("--width",)),
    Case("formula-width-5", lambda tmp: ["formula", "bert-base-uncased", "--width", "5"], ("--width",)),
    Case("audit-width-5", lambda tmp: ["audit", str(checkpoint_dir(tmp, {"model.safetensors": ONE_TENSOR})),
                                       "--width", "5"], ("--width",)),
    Case("depth-negative", lambda tmp: ["inspect", "bert-base-uncased", "--depth", "-1"], ("--depth",)),
    # --- hub ids and cache layouts -----------------------------------------------------------------------------
    Case("hub-id-dotdot", lambda tmp: ["inspect", "org/.."], ("not a valid hub id",)),
    Case("hub-id-double-dash", lambda tmp: ["inspect", "org/name--x"], ("not a valid hub id",)),
    Case("hub-id-non-ascii", lambda tmp: ["inspect", "org/näme"], ("not a valid hub id",)),
    Case("hub-id-not-cached", lambda tmp: ["inspect", "someorg/not-cached"], ("HF_HUB_OFFLINE",)),
    Case("audit-hub-id-dotdot", lambda tmp: ["audit", "org/.."], ("not a valid hub id",)),
    Case("cache-ref-not-utf8", lambda tmp: ["inspect", str(cache_repo(tmp, b"\xff\xfe\xfd"))], ("not UTF-8",)),
    Case("cache-ref-climbs", climbing_ref, ("not a snapshot folder",)),
    Case("cache-ref-empty", lambda tmp: ["inspect", str(cache_repo(tmp, b""))], ("not a snapshot folder",)),
    Case("cache-ref-fifo", lambda tmp: ["inspect", str(fifo_ref(tmp))], ("FIFO",)),
    # --- other commands --------------------------------------------------------------------------------------------
    Case("formula-layers-1e9", lambda tmp: ["formula", _config(tmp, bert_config(num_hidden_layers=10**9))],
         ("'num_hidden_layers'",)),
    Case("formula-num-labels-1e12", lambda tmp: ["formula", "bert-base-uncased", "--task", "ner", "--num-labels",
                                                 str(10**12)], ("--num-labels",)),
    Case("formula-fifo", lambda tmp: ["formula", fifo(tmp, "config.json")], ("FIFO",)),
    Case("diff-layers-1e9", lambda tmp: ["diff", "bert-base-uncased", _config(tmp, bert_config(
        num_hidden_layers=10**9))], ("'num_hidden_layers'",)),
    Case("compare-one-model", lambda tmp: ["compare", "bert-base-uncased"], ("two or more",)),
    Case("compare-width-5", lambda tmp: ["compare", "bert-base-uncased", "gpt2", "--width", "5"], ("--width",)),
    Case("compare-dev-zero", lambda tmp: ["compare", "bert-base-uncased", "/dev/zero"], ("character device",)),
    # --- the CLI's own options ---------------------------------------------------------------------------------
    Case("budget-no-unit", lambda tmp: ["memory", "gpt2", "--budget", "24"], ("--budget needs a unit", "24GiB")),
    Case("budget-no-unit-fraction", lambda tmp: ["memory", "gpt2", "--budget", "1.5"], ("'1.5'", "1.5GiB")),
    Case("budget-negative", lambda tmp: ["memory", "gpt2", "--budget", "-5GiB"], ("--budget", "positive", "'-5GiB'")),
    Case("budget-1e400", lambda tmp: ["memory", "gpt2", "--budget", "1e400GB"], ("--budget", "'1e400GB'")),
    Case("budget-lots", lambda tmp: ["memory", "gpt2", "--budget", "lots"], ("--budget", "'lots'", "24GiB")),
    Case("budget-under-1mib", lambda tmp: ["memory", "gpt2", "--budget", "512KiB"], ("--budget", "1MiB", "524,288")),
    Case("budget-5000-digits", lambda tmp: ["memory", "gpt2", "--budget", "9" * 5000], ("--budget",)),
    Case("reserve-no-unit", lambda tmp: ["memory", "gpt2", "--reserve", "2"], ("--reserve needs a unit", "2GiB")),
    Case("gpu-ambiguous-a100", lambda tmp: ["memory", "gpt2", "--gpu", "a100"],
         ("'a100' names several cards", "A100 40GB ('a100-40gb') or A100 80GB ('a100-80gb')")),
    Case("gpu-ambiguous-flops", lambda tmp: ["flops", "gpt2", "--gpu", "v100"], ("'v100' names several cards",)),
    Case("gpu-10000-chars", lambda tmp: ["memory", "gpt2", "--gpu", "h" * 10_000], ("unknown accelerator 'hhhh",)),
    Case("gpu-unicode", lambda tmp: ["memory", "gpt2", "--gpu", "Ｈ１００ ☃"], ("unknown accelerator 'Ｈ１００ ☃'",)),
    Case("gpu-misspelled", lambda tmp: ["plan", "gpt2", "--gpu", "rtx 409"], ("did you mean 'rtx-4090'?",)),
    Case("plan-budget-no-unit", lambda tmp: ["plan", "gpt2", "--budget", "24"], ("--budget needs a unit",)),
    *[Case(f"{command}-{flag[2:]}-{name}", lambda tmp, command=command, flag=flag, value=value:
           [command, "gpt2", flag, value], (flag, shown))
      for command in ("memory", "flops", "plan") for flag in ("--seq", "--batch")
      for name, value, shown in (("zero", "0", "got 0"), ("negative", "-3", "got -3"), ("1e12", "1e12", "'1e12'"),
                                 ("2pow63", str(2**63), f"got {2**63}"), ("nan", "nan", "'nan'"))],
    Case("plan-lora-zero", lambda tmp: ["plan", "gpt2", "--lora", "0"], ("--lora", "got 0")),
    Case("plan-lora-1e9", lambda tmp: ["plan", "gpt2", "--lora", str(10**9)], ("--lora", "got 1000000000")),
    Case("plan-target-regex", lambda tmp: ["plan", "gpt2", "--lora", "8", "--target", "q.*,(k|v)_proj"],
         ("--target", "'q.*' is not a module name")),
    Case("plan-target-class", lambda tmp: ["plan", "gpt2", "--lora", "8", "--target", "[a-z]+"],
         ("--target", "'[a-z]+'")),
    Case("plan-train-regex", lambda tmp: ["plan", "gpt2", "--no-memory", "--train", "h\\.(1|2)\\..+"],
         ("--train", "can match no parameter name", "globs, not regular expressions")),
    Case("memory-freeze-regex", lambda tmp: ["memory", "gpt2", "--training", "--freeze", "h.(0|1).*"],
         ("--freeze 'h.(0|1).*'", "globs")),
    Case("flops-bare-ep", lambda tmp: ["flops", "gpt2", "--ep"], ("--ep takes a degree E with flops",)),
    Case("flops-freeze-regex", lambda tmp: ["flops", "gpt2", "--training", "--freeze", "^wte$"],
         ("--freeze '^wte$'", "globs")),
    Case("plan-train-10000-chars", lambda tmp: ["plan", "gpt2", "--no-memory", "--train", "a*" * 5000],
         ("--train", "10,000 characters")),
    Case("html-dev-full", lambda tmp: ["inspect", "gpt2", "--html", "/dev/full"], ("--html", "'/dev/full'",
                                                                                     "is a character device")),
    Case("html-fifo", lambda tmp: ["inspect", "gpt2", "--html", fifo(tmp, "page.html")],
         ("--html", "is a FIFO", "a regular file")),
    Case("memory-html-fifo", lambda tmp: ["memory", "gpt2", "--html", fifo(tmp, "memory.html")], ("is a FIFO",)),
    Case("html-folder", lambda tmp: ["inspect", "gpt2", "--html", str(tmp)], ("--html", "is a folder")),
    Case("html-newline", lambda tmp: ["inspect", "gpt2", "--html", str(tmp / "a\nb.html")],
         ("--html", "control character", "'\\n'")),
    Case("model-begins-with-dash", lambda tmp: ["inspect", "-weird"], ("required: MODEL", "'-weird'",
                                                                      "paramscope inspect -- -weird")),
    Case("model-begins-with-dash-no-command", lambda tmp: ["-weird"], ("'-' needs `--` before it",)),
    Case("option-misspelled", lambda tmp: ["inspect", "gpt2", "--jsn"], ("--jsn", "did you mean --json?")),
    Case("hidden-size-whole-float", inspect_config(bert_config(hidden_size=768.0)),
         ("'hidden_size' must be an integer, got 768.0 (write 768)",)),
    Case("hidden-size-null", inspect_config(bert_config(hidden_size=None)), ("'hidden_size' must be an integer, got null",)),
    Case("hidden-size-list", inspect_config(bert_config(hidden_size=[768])), ("'hidden_size' must be an integer, got [768]",)),
    Case("sub-config-hidden-float", inspect_config({"model_type": "llava", "text_config": llama(hidden_size=5120.0)}),
         ("'text_config.hidden_size' must be an integer",)),
    # --- checkpoints -------------------------------------------------------------------------------------------------
    Case("audit-missing", lambda tmp: ["audit", str(tmp / "nothing.safetensors")], ("no such file",)),
    Case("audit-dev-zero", lambda tmp: ["audit", "/dev/zero", "--config", "bert-base-uncased"],
         ("character device",)),
    Case("audit-fifo-safetensors", audit_dir({"model.safetensors": None}), ("FIFO",)),
    Case("audit-fifo-index", audit_dir({"model.safetensors.index.json": None}), ("FIFO",)),
    Case("audit-too-short", audit_dir({"model.safetensors": b"\1\2\3"}), ("shorter than the 8-byte",)),
    Case("audit-header-length-lies", audit_dir({"model.safetensors": safetensors_bytes(b"{}", length=2**60)}),
         ("header length field",)),
    Case("audit-header-not-json", audit_dir({"model.safetensors": safetensors_bytes(b"{not json}")}),
         ("not valid JSON",)),
    Case("audit-header-nested", audit_dir({"model.safetensors": safetensors_bytes(("[" * 100_000 + "]" * 100_000)
                                                                                   .encode())}),
         ("nested too deeply",)),
    Case("audit-duplicate-tensor", audit_dir({"model.safetensors": safetensors_bytes(
        b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
        b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4)}), ("'a' twice",)),
    Case("audit-symlink-passwd", audit_dir({"model.safetensors": "/etc/passwd"}), ("outside the checkpoint folder",)),
    Case("audit-shard-symlink-passwd", audit_dir({"model.safetensors.index.json": INDEX,
                                                  "shard.safetensors": "/etc/passwd"}),
         ("outside the checkpoint folder",)),
    Case("audit-shard-climbs", audit_dir({"model.safetensors.index.json": json.dumps(
        {"weight_map": {"a": "../shard.safetensors"}}).encode()}), ("points outside",)),
    Case("audit-shard-name-newline", audit_dir({"model.safetensors.index.json": json.dumps(
        {"weight_map": {"a": "x\ny.safetensors"}}).encode()}), ("does not exist",)),
    Case("audit-escaped-duplicate", audit_dir({"model.safetensors": safetensors_bytes(
        b'{"a": {"dtype": "F32", "shape": [0], "data\\u005foffsets": [0, 0]}, '
        b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4)}), ("'a' twice",)),
    Case("audit-legacy-bin", audit_dir({"pytorch_model.bin": b"\x80\x02legacy pickle"}), ("legacy",)),
    Case("audit-empty-weight-map", audit_dir({"model.safetensors.index.json": b'{"weight_map": {}}'}),
         ("no weight_map",)),
    Case("audit-shape-lies", audit_dir({"model.safetensors": safetensors_bytes(
        {"a": {"dtype": "F32", "shape": [10**12, 10**12], "data_offsets": [0, 4]}}, b"\0" * 4)}),
         ("needs more bytes",)),
    Case("audit-one-tensor-no-config", lambda tmp: ["audit", _config(tmp, ONE_TENSOR, "x.safetensors")],
         ("--config",)),
]


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str
    seconds: float
    rss_bytes: int


def _run(case: Case, root: Path) -> Outcome:
    folder = root / case.id
    folder.mkdir()
    argv = case.make(folder)
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(root / "hub"),
           "HF_MODULES_CACHE": str(root / "modules"), "PARAMSCOPE_CACHE_DIR": str(root / "formulas"),
           "COLUMNS": "100"}
    out_path, err_path = folder / "stdout", folder / "stderr"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        start = time.monotonic()
        child = subprocess.Popen([sys.executable, "-m", "paramscope", *argv], stdout=out, stderr=err, env=env,
                                 cwd=folder)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.monotonic() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    return Outcome(child.returncode, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"),
                   seconds, usage.ru_maxrss * 1024)


def test_the_matrix_is_large_and_ids_unique():
    assert len(CASES) >= 80
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path):
    outcome = _run(case, tmp_path)
    lines = outcome.err.strip().splitlines()
    assert outcome.code == 2, (outcome.code, outcome.err[-2000:])
    assert outcome.out == ""
    assert len(lines) == 1, outcome.err[-2000:]
    assert lines[0].startswith("paramscope: error: "), lines[0]
    assert "Traceback" not in outcome.err and "internal error" not in outcome.err
    assert len(lines[0]) < 600, lines[0]
    for fragment in case.expect:
        assert fragment in lines[0], (fragment, lines[0])
    assert outcome.seconds <= MAX_SECONDS, f"{outcome.seconds:.1f} s"
    assert outcome.rss_bytes <= MAX_RSS_BYTES, f"{outcome.rss_bytes / 2**20:.0f} MiB"
