"""Check paramscope's memory and FLOP predictions against a real GPU.

Four stages, so that paramscope runs where it is installed and only the measurements need the GPU:

    python bench/gpu_validate.py predict --out bench/gpu_results/predictions-DATE.json     # here (CPU): CLI --json
    python3 bench/gpu_validate.py measure --predictions bench/gpu_results/predictions-DATE.json \
        --out $OUT/measured.json                                                           # on the GPU machine
    python3 bench/gpu_validate.py diagnose --predictions … --out $OUT/diagnose.json        # GPU: where figures part
    python bench/gpu_validate.py report --predictions … --measured … [--diagnosis …] \
        [--also-measured …] --out bench/gpu_results/h200-DATE.json --markdown              # here: joined, tables

`predict` calls `paramscope memory MODEL --training`, `paramscope memory MODEL --dtype bf16` and `paramscope flops
MODEL --training --gpu h200` with `--json` for every case and (batch, seq) point, and keeps the figures the
comparison needs together with each case's config dict and class, so `measure` needs neither paramscope nor the
presets: it needs torch with CUDA and transformers only.

`measure` builds each model from its config with random initialisation directly on CUDA (no weights downloaded) and
runs, at every point:

- training: paramscope's steady step (src/paramscope/cost/traced/step.py): fp32 weights, `torch.autocast("cuda",
  bfloat16)`, fused AdamW, train mode, sdpa, `loss = model(input_ids=ids, labels=ids).loss; loss.backward();
  opt.step(); opt.zero_grad(set_to_none=True)`, ids all zero as paramscope feeds them. One warm-up step (allocates the
  optimizer's states), then `reset_peak_memory_stats()` and the measured step: peak = `max_memory_allocated()`.
  Models with attention dropout are measured a second time with sdpa restricted to the math kernel, the one
  paramscope's CPU trace runs, so the kernel's share of the difference is measured rather than assumed;
- FLOPs: `torch.utils.flop_counter.FlopCounterMode` over the forward and the backward of one such step, and the
  step's time (CUDA events; warm-ups, then the median of several steps);
- serving: the model in bf16, eval, `torch.no_grad()`, generate()'s prefill as paramscope traces it (`use_cache=True`
  and `logits_to_keep=1` where the class generates and accepts them; a plain forward otherwise), after one warm-up
  prefill: peak = `max_memory_allocated()`.

torch before 2.12 cannot count grouped-query sdpa (FlopCounterMode asserts equal key and query heads): `measure` then
puts newer torch's grouped-head formulas in place and records that it did (`environment.flop_counter_patch`).

`diagnose` measures where the figures part: what sdpa's math kernel (with dropout) and GPT-2's MLP save for backward
on CPU and on CUDA (saved-tensor hooks), the memory around the tied input embedding's backward (the step's last), and
a tied weight's backward peak with and without torch's MemTracker (what paramscope's traced engine measures with).

Every measurement also records what was allocated before it and the exact bytes of the tensors resident then
(parameters, buffers, optimizer states), so that allocations that are no tensor of the model (cuBLAS workspaces, the
ids) are separated from the model's own bytes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEVICE = os.environ.get("GPU_VALIDATE_DEVICE", "cuda")  # "cpu" only for a dry run of the script's logic
GiB = 1024 ** 3


@dataclass(frozen=True)
class Case:
    name: str  # short name for the tables
    model: str  # what paramscope is given: a preset name or a config path (relative to the repo root)
    points: tuple[tuple[int, int], ...]  # (batch, seq)
    why: str


CASES = (
    Case("gpt2", "gpt2", ((1, 512), (4, 1024), (8, 1024)), "preset; GPT-2 recipe; attention dropout 0.1"),
    Case("bert-base-uncased", "bert-base-uncased", ((1, 128), (4, 512), (16, 512)),
         "preset; BERT MLM recipe; attention dropout 0.1"),
    Case("tinyllama-1.1b", "tests/configs/unseen/TinyLlama--TinyLlama-1.1B-Chat-v1.0.json",
         ((1, 512), (4, 1024), (8, 2048)), "unseen config; Llama-style recipe"),
    Case("qwen2.5-coder-1.5b", "tests/configs/unseen/Qwen--Qwen2.5-Coder-1.5B.json",
         ((1, 512), (4, 1024), (8, 2048)), "unseen config; Llama-style recipe (qwen2), tied embeddings"),
    Case("qwen3-0.6b", "bench/configs/Qwen--Qwen3-0.6B.json", ((1, 512), (4, 1024), (8, 2048)),
         "written config; no recipe for qwen3 (traced engine for training memory)"),
)


# --- predict (here, with paramscope installed) ---------------------------------------------------------------------

def _cli(*args: str) -> dict:
    out = subprocess.run(["paramscope", *args, "--json"], cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"paramscope {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def _config_of(model: str) -> dict:
    path = ROOT / model
    if path.is_file():
        return json.loads(path.read_text())
    from paramscope.presets import find_preset

    preset = find_preset(model)
    if preset is None:
        raise SystemExit(f"{model}: neither a config file nor a preset")
    return preset.load_config()


def _training_prediction(doc: dict) -> dict:
    m = doc["memory"]
    traced = m.get("traced")
    return {
        "engine": m["engine"], "activations_from": m["settings"].get("activations_from"),
        "attention": m["settings"].get("attention"),
        "weights": m["weights"]["bytes"], "buffers": m["buffers"]["bytes"], "gradients": m["gradients"]["bytes"],
        "optimizer": m["optimizer"]["bytes"], "master_weights": m["master_weights"]["bytes"],
        "activations": m["activations"]["bytes"], "peak": m["peak"]["bytes"], "peak_phase": m["peak"]["phase"],
        "phases": [{k: p.get(k) for k in ("phase", "moment", "bytes", "arithmetic")} for p in m.get("phases", [])],
        "traced": None if not traced else {k: v for k, v in traced.items() if k != "activations_by_module"},
        "notes": m.get("notes", []),
    }


def _serving_prediction(doc: dict) -> dict:
    m = doc["memory"]
    kv = m.get("kv_cache")
    return {
        "engine": m["engine"], "settings": {k: m["settings"].get(k) for k in ("dtype", "compute_dtype", "kv_dtype")},
        "weights": m["weights"]["bytes"], "buffers": m["buffers"]["bytes"], "kv_cache": kv["bytes"] if kv else 0,
        "workspace": m["activations"]["bytes"], "workspace_arithmetic": m["activations"].get("arithmetic"),
        "peak": m["peak"]["bytes"], "peak_phase": m["peak"]["phase"], "notes": m.get("notes", []),
    }


def _flops_prediction(doc: dict) -> dict:
    f = doc["flops"]
    return {k: f.get(k) for k in ("engine", "forward", "attention", "backward", "step", "recompute", "by_role",
                                  "peak_flops", "peak_from", "notes")}


def predict(args: argparse.Namespace) -> None:
    import paramscope

    selected = [c for c in CASES if not args.cases or c.name in args.cases]
    result = {"paramscope_version": getattr(paramscope, "__version__", None), "cases": []}
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except ImportError:
        result["transformers"] = None
    for case in selected:
        started = time.perf_counter()
        entry = {"name": case.name, "model": case.model, "why": case.why, "config": _config_of(case.model),
                 "points": []}
        for batch, seq in case.points:
            point = {"batch": batch, "seq": seq}
            bs = ["--batch", str(batch), "--seq", str(seq)]
            doc = _cli("memory", case.model, "--training", *bs)
            entry["class"] = doc["model"]["class"]
            entry["model_engine"] = doc["model"]["engine"]
            point["training"] = _training_prediction(doc)
            point["serving"] = _serving_prediction(_cli("memory", case.model, "--dtype", "bf16", *bs))
            point["flops"] = _flops_prediction(_cli("flops", case.model, "--training", "--gpu", "h200", *bs))
            entry["points"].append(point)
            print(f"  {case.name} {batch}×{seq}: training peak {point['training']['peak'] / GiB:.2f} GiB "
                  f"({point['training']['engine']}), serving {point['serving']['peak'] / GiB:.2f} GiB, "
                  f"step {point['flops']['step']:.3e} FLOPs", flush=True)
        print(f"{case.name}: {time.perf_counter() - started:.1f} s", flush=True)
        result["cases"].append(entry)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


# --- measure (on the GPU machine: torch + transformers, no paramscope needed) ------------------------------------

def _build(entry: dict, dtype):  # noqa: ANN001, ANN202
    import tempfile

    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.json").write_text(json.dumps(entry["config"]))
        config = transformers.AutoConfig.from_pretrained(tmp)
    cls = getattr(transformers, entry["class"])
    with torch.device(DEVICE):
        try:
            model = cls._from_config(config, attn_implementation="sdpa", dtype=dtype)
        except TypeError:
            model = cls._from_config(config, attn_implementation="sdpa", torch_dtype=dtype)
    return model


def _bytes_of(tensors) -> int:  # noqa: ANN001
    seen, total = set(), 0
    for t in tensors:
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def _resident(model, optimizer=None) -> dict:  # noqa: ANN001
    states = []
    if optimizer is not None:
        for state in optimizer.state.values():
            states += [v for v in state.values() if hasattr(v, "element_size")]
    return {"parameters": _bytes_of(model.parameters()), "buffers": _bytes_of(model.buffers()),
            "optimizer": _bytes_of(states), "gradients": _bytes_of(p.grad for p in model.parameters())}


def _accepts(model, name: str) -> bool:  # noqa: ANN001
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _attention_dropout(config) -> float:  # noqa: ANN001
    for key in ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout"):
        value = getattr(config, key, None)
        if value:
            return float(value)
    return 0.0


def _cuda_ms(fn, warmups: int, repeats: int) -> list[float]:  # noqa: ANN001
    import torch

    for _ in range(warmups):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def _gqa_flop_formulas() -> str | None:
    """torch < 2.12's FlopCounterMode asserts that the key and value have as many heads as the query, so it fails on
    transformers' sdpa with enable_gqa (grouped-query models). Newer torch counts such attention as the kernel runs
    it, every query head against its key/value group: the same formulas are put in place here when the installed
    ones refuse grouped heads. Returns a note when it patched."""
    import torch.utils.flop_counter as fc

    try:
        fc.sdpa_flop_count((1, 4, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16))
        return None
    except AssertionError:
        pass
    bmm_flop = fc.bmm_flop

    def sdpa_flop_count(query_shape, key_shape, value_shape):  # noqa: ANN001, ANN202
        b, h_q, s_q, d_q = query_shape
        _b2, h_kv, s_k, _d2 = key_shape
        d_v = value_shape[-1]
        assert h_q % h_kv == 0
        return bmm_flop((b * h_q, s_q, d_q), (b * h_q, d_q, s_k)) + bmm_flop((b * h_q, s_q, s_k), (b * h_q, s_k, d_v))

    def sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape):  # noqa: ANN001, ANN202
        b, h_q, s_q, d_q = query_shape
        _b2, h_kv, s_k, _d2 = key_shape
        d_v = value_shape[-1]
        assert h_q % h_kv == 0
        return (bmm_flop((b * h_q, s_q, d_q), (b * h_q, d_q, s_k))  # the scores recomputed
                + bmm_flop((b * h_q, s_q, d_v), (b * h_q, d_v, s_k))  # grad of the probabilities
                + bmm_flop((b * h_q, s_k, s_q), (b * h_q, s_q, d_v))  # grad V
                + bmm_flop((b * h_q, s_q, s_k), (b * h_q, s_k, d_q))  # grad Q
                + bmm_flop((b * h_q, d_q, s_q), (b * h_q, s_q, s_k)))  # grad K

    fc.sdpa_flop_count = sdpa_flop_count
    fc.sdpa_backward_flop_count = sdpa_backward_flop_count
    return ("torch's FlopCounterMode refused grouped key/value heads (sdpa with enable_gqa); its sdpa formulas were "
            "replaced by the grouped-head ones newer torch ships (every query head counted)")


def _measure_training(entry: dict, args: argparse.Namespace) -> tuple[list[dict], dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model = _build(entry, torch.float32)
    model.train()
    built = torch.cuda.memory_allocated()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    autocast = lambda: torch.autocast(DEVICE, dtype=torch.bfloat16)  # noqa: E731
    dropout = _attention_dropout(model.config)
    rows = []
    for point in entry["points"]:
        batch, seq = point["batch"], point["seq"]
        ids = torch.zeros((batch, seq), dtype=torch.long, device=DEVICE)

        def step() -> None:
            with autocast():
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            del loss
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        def measured_step(kernel=None) -> dict:  # noqa: ANN001
            context = sdpa_kernel([kernel]) if kernel is not None else nullcontext()
            with context:
                step()  # warm-up: optimizer states, cuBLAS workspaces, autocast's first casts
                torch.cuda.synchronize()
                resident = _resident(model, optimizer)
                before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                # the step, phase by phase (the sync between them does not change what is allocated)
                with autocast():
                    loss = model(input_ids=ids, labels=ids).loss
                torch.cuda.synchronize()
                end_of_forward = torch.cuda.memory_allocated()
                forward_peak = torch.cuda.max_memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                loss.backward()
                del loss
                torch.cuda.synchronize()
                backward_peak = torch.cuda.max_memory_allocated()
                end_of_backward = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                optimizer.step()
                torch.cuda.synchronize()
                optimizer_peak = torch.cuda.max_memory_allocated()
                optimizer.zero_grad(set_to_none=True)
                after = torch.cuda.memory_allocated()
            return {"resident_tensors": resident, "allocated_before": before, "allocated_after": after,
                    "end_of_forward": end_of_forward, "end_of_backward": end_of_backward,
                    "phase_peaks": {"forward": forward_peak, "backward": backward_peak,
                                    "optimizer step": optimizer_peak},
                    "peak": max(forward_peak, backward_peak, optimizer_peak),
                    "reserved_peak": torch.cuda.max_memory_reserved()}

        row = {"batch": batch, "seq": seq}
        try:
            row["default"] = measured_step()
            # the same with one reset around the whole step, as the brief's single max_memory_allocated reads it
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            step()
            torch.cuda.synchronize()
            row["default"]["whole_step_peak"] = torch.cuda.max_memory_allocated()
            row["default"]["whole_step_before"] = before
            if dropout:
                row["math_kernel"] = measured_step(SDPBackend.MATH)
            # FLOPs of one step: forward and backward apart
            with FlopCounterMode(display=False) as fwd:
                with autocast():
                    loss = model(input_ids=ids, labels=ids).loss
            with FlopCounterMode(display=False) as bwd:
                loss.backward()
            del loss
            optimizer.zero_grad(set_to_none=True)
            row["flop_counter"] = {"forward": fwd.get_total_flops(), "backward": bwd.get_total_flops(),
                                   "forward_by_op": {str(k): v for k, v in fwd.get_flop_counts().get(
                                       "Global", {}).items()},
                                   "backward_by_op": {str(k): v for k, v in bwd.get_flop_counts().get(
                                       "Global", {}).items()}}
            times = _cuda_ms(step, args.warmups, args.repeats)
            row["step_ms"] = times
            row["step_ms_median"] = statistics.median(times)
        except torch.OutOfMemoryError as err:
            row["error"] = f"out of memory: {str(err)[:200]}"
            optimizer.zero_grad(set_to_none=True)
        rows.append(row)
        del ids
        gc.collect()
        torch.cuda.empty_cache()
        print(f"  training {entry['name']} {batch}×{seq}: "
              + (row.get("error") or f"peak {row['default']['peak'] / GiB:.3f} GiB, "
                 f"step {row['step_ms_median']:.1f} ms"), flush=True)
    info = {"built_allocated": built, "attention": model.config._attn_implementation,
            "attention_dropout": dropout}
    del model, optimizer
    gc.collect()
    torch.cuda.empty_cache()
    return rows, info


def _cache_bytes(cache) -> int | None:  # noqa: ANN001
    if cache is None:
        return None
    layers = getattr(cache, "layers", None)
    if layers is None:
        return None
    tensors = []
    for layer in layers:
        for key in ("keys", "values", "conv_states", "recurrent_states"):
            t = getattr(layer, key, None)
            if t is not None and hasattr(t, "element_size"):
                tensors.append(t)
    return _bytes_of(tensors)


def _measure_serving(entry: dict, args: argparse.Namespace) -> list[dict]:
    import torch

    model = _build(entry, torch.bfloat16)
    model.eval()
    generating = _accepts(model, "use_cache") and bool(getattr(model, "can_generate", lambda: False)())
    rows = []
    for point in entry["points"]:
        batch, seq = point["batch"], point["seq"]
        ids = torch.zeros((batch, seq), dtype=torch.long, device=DEVICE)
        kwargs = {"input_ids": ids}
        if generating:
            kwargs["use_cache"] = True
            if _accepts(model, "logits_to_keep"):
                kwargs["logits_to_keep"] = 1
        elif _accepts(model, "use_cache"):
            kwargs["use_cache"] = False
        row = {"batch": batch, "seq": seq, "kwargs": sorted(k for k in kwargs if k != "input_ids"),
               "generating": generating}
        try:
            with torch.no_grad():
                out = model(**kwargs)  # warm-up
                del out
                torch.cuda.synchronize()
                resident = _resident(model)
                before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                out = model(**kwargs)
                torch.cuda.synchronize()
                row.update(resident_tensors=resident, allocated_before=before, peak=torch.cuda.max_memory_allocated(),
                           end_of_prefill=torch.cuda.memory_allocated(),
                           kv_cache=_cache_bytes(getattr(out, "past_key_values", None)),
                           logits_shape=list(out.logits.shape) if getattr(out, "logits", None) is not None else None,
                           logits_dtype=str(out.logits.dtype) if getattr(out, "logits", None) is not None else None)
                del out
                row["prefill_ms"] = _cuda_ms(lambda: model(**kwargs), 1, 3)
        except torch.OutOfMemoryError as err:
            row["error"] = f"out of memory: {str(err)[:200]}"
        rows.append(row)
        del ids
        gc.collect()
        torch.cuda.empty_cache()
        print(f"  serving {entry['name']} {batch}×{seq}: "
              + (row.get("error") or f"peak {row['peak'] / GiB:.3f} GiB"), flush=True)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def measure(args: argparse.Namespace) -> None:
    import torch
    import transformers

    predictions = json.loads(Path(args.predictions).read_text())
    env = {"torch": torch.__version__, "transformers": transformers.__version__,
           "transformers_path": transformers.__file__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
           "total_memory": torch.cuda.get_device_properties(0).total_memory,
           "python": sys.version.split()[0], "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    env["flop_counter_patch"] = _gqa_flop_formulas()
    print(json.dumps(env), flush=True)
    result = {"environment": env, "cases": []}
    out = Path(args.out)
    for entry in predictions["cases"]:
        if args.cases and entry["name"] not in args.cases:
            continue
        started = time.perf_counter()
        torch.manual_seed(0)
        case = {"name": entry["name"], "class": entry["class"]}
        if not args.skip_training:
            case["training"], case["training_info"] = _measure_training(entry, args)
        if not args.skip_serving:
            case["serving"] = _measure_serving(entry, args)
        case["seconds"] = time.perf_counter() - started
        result["cases"].append(case)
        out.write_text(json.dumps(result, indent=1) + "\n")  # after each case: a timeout keeps what was done
        print(f"{entry['name']}: {case['seconds']:.1f} s", flush=True)
    print(f"wrote {out}")


# --- diagnose (on the GPU machine: where the measured and predicted figures part) -------------------------------

def _saved_tensors(fn):  # noqa: ANN001, ANN202
    """The tensors autograd saves while `fn` runs: (dtype, shape, storage bytes), each storage once."""
    import torch

    found: dict[int, tuple[str, list[int], int]] = {}

    def pack(t):  # noqa: ANN001, ANN202
        found[t.untyped_storage().data_ptr()] = (str(t.dtype), list(t.shape), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, list(found.values())


def _diagnose_kernels() -> dict:
    """What sdpa's math kernel (with dropout) and GPT-2's MLP (gelu_new under autocast) save, on CPU and CUDA."""
    import torch
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel

    result: dict = {}
    heads, seq, dim = 12, 256, 64
    for device in ("cpu", DEVICE) if DEVICE != "cpu" else ("cpu",):
        for backend in ("MATH", "default"):
            if device == "cpu" and backend == "default":
                continue
            q, k, v = (torch.randn(1, heads, seq, dim, dtype=torch.bfloat16, device=device, requires_grad=True)
                       for _ in range(3))
            context = sdpa_kernel([SDPBackend.MATH]) if backend == "MATH" else nullcontext()
            with context:
                _, saved = _saved_tensors(lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, dropout_p=0.1, is_causal=True))
            total = sum(n for *_, n in saved)
            result[f"sdpa {backend} dropout 0.1 bf16 on {device}"] = {
                "saved": saved, "bytes": total,
                "bytes_per_score_element_beyond_qkv_bf16": (total - 3 * q.numel() * 2) / (heads * seq * seq)}
        config = transformers.GPT2Config()
        with torch.device(device):
            mlp = transformers.models.gpt2.modeling_gpt2.GPT2MLP(4 * config.n_embd, config)
        mlp.train()
        x = torch.randn(1, seq, config.n_embd, device=device, requires_grad=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            _, saved = _saved_tensors(lambda: mlp(x))
        result[f"GPT2MLP (gelu_new) under {device} autocast bf16, {seq} tokens"] = {
            "saved": saved, "bytes": sum(n for *_, n in saved),
            "bytes_per_token": sum(n for *_, n in saved) / seq}
    return result


def _diagnose_tied(entry: dict) -> dict:
    """Memory around the input embedding's backward (the last of the step) and each gradient accumulation of its
    weight, and the allocations at the step's start that are no tensor of the model."""
    import torch

    model = _build(entry, torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batch, seq = entry["points"][0]["batch"], entry["points"][0]["seq"]
    ids = torch.zeros((batch, seq), dtype=torch.long, device=DEVICE)
    embedding = model.get_input_embeddings()
    events: list[dict] = []

    def mark(what: str) -> None:
        events.append({"at": what, "allocated": torch.cuda.memory_allocated(),
                       "peak_so_far": torch.cuda.max_memory_allocated()})

    def on_output(module, inputs, output):  # noqa: ANN001, ANN202
        if output.requires_grad:
            output.register_hook(lambda grad: mark("embedding output's gradient ready (embedding backward next)"))

    handles = [embedding.register_forward_hook(on_output),
               embedding.weight.register_post_accumulate_grad_hook(
                   lambda p: mark("embedding weight's grad accumulated"))]

    def step(record: bool) -> None:
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        if record:
            mark("end of forward")
        loss.backward()
        del loss
        if record:
            mark("end of backward")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(False)
    torch.cuda.synchronize()
    known = set()
    resident = 0
    for t in [*model.parameters(), *model.buffers(),
              *(v for state in optimizer.state.values() for v in state.values() if hasattr(v, "untyped_storage"))]:
        if t.untyped_storage().data_ptr() not in known:
            known.add(t.untyped_storage().data_ptr())
            resident += t.untyped_storage().nbytes()
    known.add(ids.untyped_storage().data_ptr())
    others = []
    for segment in torch.cuda.memory_snapshot():
        for block in segment["blocks"]:
            if block["state"] == "active_allocated" and block["address"] not in known:
                others.append(block["size"])
    events.clear()
    torch.cuda.reset_peak_memory_stats()
    mark("start of step")
    step(True)
    for h in handles:
        h.remove()
    tied = model.get_output_embeddings() is not None and \
        model.get_output_embeddings().weight is embedding.weight
    result = {"case": entry["name"], "batch": batch, "seq": seq, "tied": tied,
              "embedding_weight_bytes": embedding.weight.numel() * embedding.weight.element_size(),
              "resident_tensors": resident, "ids_bytes": ids.numel() * ids.element_size(),
              "other_active_blocks": sorted(others, reverse=True)[:20], "other_active_total": sum(others),
              "events": events}
    del model, optimizer, ids
    gc.collect()
    torch.cuda.empty_cache()
    return result


def _diagnose_tied_toy(vocab: int = 100_000, hidden: int = 1024) -> dict:
    """One tied weight used by an embedding (fp32) and a head (autocast bf16): the backward's peak over what was
    allocated before it, in units of the weight's fp32 bytes, plainly, with a hook on the weight, and under torch's
    MemTracker (what paramscope's traced engine measures with)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    unit = vocab * hidden * 4
    result: dict = {"vocab": vocab, "hidden": hidden, "unit_bytes": unit}
    for variant in ("plain", "tensor hook", "MemTracker"):
        holder = torch.nn.Module()
        holder.weight = torch.nn.Parameter(torch.randn(vocab, hidden, device=DEVICE))
        weight = holder.weight
        if variant == "tensor hook":
            weight.register_hook(lambda g: g)
        ids = torch.zeros((2, 16), dtype=torch.long, device=DEVICE)

        def loss_of_step():  # noqa: ANN202
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                x = torch.nn.functional.embedding(ids, weight)
                return torch.nn.functional.linear(x * 1.0, weight).float().sum()

        loss_of_step().backward()  # warm-up
        weight.grad = None
        tracker = MemTracker() if variant == "MemTracker" else None
        if tracker is not None:
            tracker.track_external(holder)
        with tracker if tracker is not None else nullcontext():
            loss = loss_of_step()
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            loss.backward()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        result[variant] = {"backward_peak_over_before": peak - before, "in_units": (peak - before) / unit}
        del holder, weight, loss, tracker
        gc.collect()
        torch.cuda.empty_cache()
    return result


def diagnose(args: argparse.Namespace) -> None:
    predictions = json.loads(Path(args.predictions).read_text())
    result = {"kernels": _diagnose_kernels(), "tied_toy": _diagnose_tied_toy(), "tied": []}
    print(json.dumps(result["kernels"], indent=1), flush=True)
    print(json.dumps(result["tied_toy"]), flush=True)
    for entry in predictions["cases"]:
        if args.cases and entry["name"] not in args.cases:
            continue
        result["tied"].append(_diagnose_tied(entry))
        print(json.dumps(result["tied"][-1]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


# --- report (here: join predictions and measurements) -------------------------------------------------------------

def _pct(diff: int, base: int) -> float:
    return 100.0 * diff / base if base else float("nan")


def _dropout_term(entry: dict, batch: int, seq: int) -> int:
    """paramscope's own figure for what the CPU math kernel keeps beyond CUDA's fused kernels: 12·B·heads·S² per
    layer (the probabilities, their dropout and the mask)."""
    c = entry["config"]
    heads = c.get("n_head") or c.get("num_attention_heads")
    layers = c.get("n_layer") or c.get("num_hidden_layers")
    return 12 * batch * heads * seq * seq * layers


def report(args: argparse.Namespace) -> None:
    predictions = json.loads(Path(args.predictions).read_text())
    measured = json.loads(Path(args.measured).read_text())
    by_name = {c["name"]: c for c in measured["cases"]}
    peak_flops = None
    rows = {"training": [], "serving": [], "flops": []}
    for entry in predictions["cases"]:
        got = by_name.get(entry["name"])
        if got is None:
            continue
        dropout = got.get("training_info", {}).get("attention_dropout", 0.0)
        for point, t in zip(entry["points"], got.get("training", [])):
            if "error" in t:
                continue
            p = point["training"]
            d = t["default"]
            resident = d["resident_tensors"]
            other = d["allocated_before"] - resident["parameters"] - resident["buffers"] - resident["optimizer"]
            row = {"case": entry["name"], "batch": t["batch"], "seq": t["seq"], "engine": p["engine"],
                   "predicted": p["peak"], "predicted_phase": p["peak_phase"], "measured": d["peak"],
                   "measured_phase": max(d["phase_peaks"], key=d["phase_peaks"].get),
                   "diff": d["peak"] - p["peak"], "pct": _pct(d["peak"] - p["peak"], p["peak"]),
                   "non_tensor_resident": other, "measured_tensors": d["peak"] - other,
                   "diff_tensors": d["peak"] - other - p["peak"],
                   "pct_tensors": _pct(d["peak"] - other - p["peak"], p["peak"]),
                   "resident_check": {
                       "weights": [p["weights"], resident["parameters"]],
                       "buffers": [p["buffers"], resident["buffers"]],
                       "optimizer": [p["optimizer"], resident["optimizer"]]},
                   "whole_step_peak": d.get("whole_step_peak")}
            if dropout:
                m = t["math_kernel"]
                other_m = m["allocated_before"] - sum(m["resident_tensors"][k] for k in
                                                      ("parameters", "buffers", "optimizer"))
                row.update(dropout_term=_dropout_term(entry, t["batch"], t["seq"]),
                           measured_math=m["peak"], measured_math_tensors=m["peak"] - other_m,
                           diff_math_tensors=m["peak"] - other_m - p["peak"],
                           pct_math_tensors=_pct(m["peak"] - other_m - p["peak"], p["peak"]))
            rows["training"].append(row)
            f = point["flops"]
            fc = t["flop_counter"]
            peak_flops = f["peak_flops"]
            seconds = t["step_ms_median"] / 1000
            rows["flops"].append({
                "case": entry["name"], "batch": t["batch"], "seq": t["seq"],
                "predicted_forward": f["forward"], "counted_forward": fc["forward"],
                "predicted_backward": f["backward"], "predicted_recompute": f["recompute"],
                "counted_backward": fc["backward"],
                "predicted_step": f["step"], "counted_step": fc["forward"] + fc["backward"],
                "step_diff": fc["forward"] + fc["backward"] - f["step"],
                "step_diff_vs_step_plus_recompute": fc["forward"] + fc["backward"] - f["step"] - f["recompute"],
                "step_ms": t["step_ms_median"], "tflops": f["step"] / seconds / 1e12,
                "mfu": f["step"] / seconds / f["peak_flops"] if f["peak_flops"] else None,
                "hfu": (f["step"] + f["recompute"]) / seconds / f["peak_flops"] if f["peak_flops"] else None})
        for point, s in zip(entry["points"], got.get("serving", [])):
            if "error" in s:
                continue
            p = point["serving"]
            other = s["allocated_before"] - s["resident_tensors"]["parameters"] - s["resident_tensors"]["buffers"]
            rows["serving"].append({
                "case": entry["name"], "batch": s["batch"], "seq": s["seq"], "predicted": p["peak"],
                "measured": s["peak"], "diff": s["peak"] - p["peak"], "pct": _pct(s["peak"] - p["peak"], p["peak"]),
                "non_tensor_resident": other, "measured_tensors": s["peak"] - other,
                "diff_tensors": s["peak"] - other - p["peak"],
                "pct_tensors": _pct(s["peak"] - other - p["peak"], p["peak"]),
                "kv_cache": [p["kv_cache"], s["kv_cache"]],
                "weights": [p["weights"], s["resident_tensors"]["parameters"]],
                "buffers": [p["buffers"], s["resident_tensors"]["buffers"]],
                "workspace_predicted": p["workspace"],
                "workspace_measured": s["peak"] - other - s["resident_tensors"]["parameters"]
                - s["resident_tensors"]["buffers"] - (s["kv_cache"] or 0)})
    result = {"environment": measured["environment"],
              "predicted_with": {"paramscope": predictions.get("paramscope_version"),
                                 "transformers": predictions.get("transformers")},
              "peak_flops": peak_flops, "comparison": rows, "predictions": predictions, "measured": measured,
              "also_measured": [json.loads(Path(f).read_text()) for f in args.also_measured],
              "diagnosis": json.loads(Path(args.diagnosis).read_text()) if args.diagnosis else None}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    if args.markdown:
        print(_markdown(rows))


def _n(x: int) -> str:
    return f"{x:,}"


def _markdown(rows: dict) -> str:
    lines = ["| model | B×S | engine | predicted peak | measured peak | measured − predicted | % | "
             "non-tensor resident | tensors only: diff | % |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows["training"]:
        lines.append(f"| {r['case']} | {r['batch']}×{r['seq']} | {r['engine']} | {_n(r['predicted'])} | "
                     f"{_n(r['measured'])} | {r['diff']:+,} | {r['pct']:+.2f}% | {_n(r['non_tensor_resident'])} | "
                     f"{r['diff_tensors']:+,} | {r['pct_tensors']:+.2f}% |")
    if any("measured_math" in r for r in rows["training"]):
        lines += ["", "| model | B×S | predicted peak | measured, sdpa math kernel (tensors) | diff | % | "
                  "dropout term 12·B·heads·S²·L |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in rows["training"]:
            if "measured_math" in r:
                lines.append(f"| {r['case']} | {r['batch']}×{r['seq']} | {_n(r['predicted'])} | "
                             f"{_n(r['measured_math_tensors'])} | {r['diff_math_tensors']:+,} | "
                             f"{r['pct_math_tensors']:+.2f}% | {_n(r['dropout_term'])} |")
    lines += ["", "| model | B×S | predicted peak | measured peak | measured − predicted | % | "
              "non-tensor resident | "
              "tensors only: diff | % | KV predicted / measured |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows["serving"]:
        kv = r["kv_cache"]
        lines.append(f"| {r['case']} | {r['batch']}×{r['seq']} | {_n(r['predicted'])} | {_n(r['measured'])} | "
                     f"{r['diff']:+,} | {r['pct']:+.2f}% | {_n(r['non_tensor_resident'])} | {r['diff_tensors']:+,} | "
                     f"{r['pct_tensors']:+.2f}% | {_n(kv[0])} / {_n(kv[1]) if kv[1] is not None else '—'} |")
    lines += ["", "| model | B×S | predicted step | FlopCounterMode step | diff | "
              "predicted step + recompute − counted | "
              "step ms | TFLOP/s | MFU |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows["flops"]:
        lines.append(f"| {r['case']} | {r['batch']}×{r['seq']} | {_n(r['predicted_step'])} | "
                     f"{_n(r['counted_step'])} | {r['step_diff']:+,} | {-r['step_diff_vs_step_plus_recompute']:+,} | "
                     f"{r['step_ms']:.1f} | {r['tflops']:.0f} | {100 * r['mfu']:.1f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("predict", help="paramscope's predictions for every case (here, CPU)")
    p.add_argument("--out", required=True)
    p.add_argument("--cases", nargs="*")
    m = sub.add_parser("measure", help="measure on CUDA (the GPU machine)")
    m.add_argument("--predictions", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--cases", nargs="*")
    m.add_argument("--warmups", type=int, default=2)
    m.add_argument("--repeats", type=int, default=5)
    m.add_argument("--skip-training", action="store_true")
    m.add_argument("--skip-serving", action="store_true")
    g = sub.add_parser("diagnose", help="what the kernels save on CPU and CUDA; the tied embedding's backward")
    g.add_argument("--predictions", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--cases", nargs="*")
    r = sub.add_parser("report", help="join predictions and measurements")
    r.add_argument("--predictions", required=True)
    r.add_argument("--measured", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--markdown", action="store_true")
    r.add_argument("--diagnosis", help="diagnose's JSON, kept in the result")
    r.add_argument("--also-measured", nargs="*", default=[],
                   help="more measure JSONs (another transformers version, say), kept in the result")
    args = parser.parse_args(argv)
    {"predict": predict, "measure": measure, "diagnose": diagnose, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
