"""The anchors side by side (issue 28 §8): Korthikanti et al.'s per-layer activations, DeepSpeed's model-states
estimates and torchtitan's traced approach, each beside paramscope's figure for the same settings.

    python bench/bench_anchors.py [--only korthikanti,deepspeed,torchtitan]

1. Korthikanti et al. 2022, Table 2 (bytes a layer: sbh(34 + 5as/h); tp: sbh(10 + 24/t + 5as/(ht)); tp + sp:
   sbh(34/t + 5as/(ht)); selective recompute drops the 5as/h term) at GPT-3 175B's shape (h 12,288, a 96, s 2,048,
   b 1), beside:
   (a) the GPT-2 class at GPT-3's dimensions (LayerNorm, two-matrix tanh-GELU MLP, attention and residual dropout
       0.1), t = 1: the analytic recipe (sdpa) and the traced step (eager and sdpa), bf16-mixed and bf16-pure;
   (b) a Llama-style config shaped like GPT-3 (h 12,288, 96 heads and 96 KV heads, intermediate 4h, vocab padded
       to 50,304 as Megatron pads GPT-3's) at t = 1 and t = 8 with and without sequence parallel: the per-device
       engine (estimate_training with a layout) and one rank traced on torch's fake process group
       (trace_parallel_training).
   Every per-layer figure is a difference of two cuts, 3 layers minus 2, so nothing outside the layers enters it.
2. DeepSpeed's estimate_zero2/zero3_model_states_mem_needs (no offload; the formulas restated below from
   deepspeed/runtime/zero/stage_1_and_2.py and stage3.py) for Llama-3-70B over 64 GPUs, beside paramscope's
   per-device model states under --zero 2, --zero 3 and --zero fsdp.
3. torchtitan's scripts/estimate/estimation.py (FSDP2 under FakeTensorMode, fake process group, a memory tracker):
   paramscope's traced engine does the same; Llama-3-8B cut to 4 layers under FSDP2 dp 8 and dp 4 × tp 2, at 512
   and 4,096 tokens, the traced rank's peak beside the analytic per-device peak.

Runs in about a minute on 2 cores (everything on meta and fake tensors).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

H, A, S, B, LAYERS = 12_288, 96, 2_048, 1, 96
SBH = S * B * H
PRESETS = Path(__file__).resolve().parents[1] / "src" / "paramscope" / "presets" / "configs"


def korthikanti(t: int, sp: bool, selective: bool = False) -> float:
    """Table 2's coefficient of sbh, bytes a layer."""
    attention = 0.0 if selective else 5 * A * S / (H * t)
    if sp:
        return 34 / t + attention
    return (34 if t == 1 else 10 + 24 / t) + attention


def gpt3_gpt2(layers: int) -> dict:
    return dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=H, n_head=A, n_layer=layers,
                n_positions=S, vocab_size=50_257)


def gpt3_llama(layers: int) -> dict:
    return dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=H, num_attention_heads=A,
                num_key_value_heads=A, intermediate_size=4 * H, num_hidden_layers=layers, vocab_size=50_304,
                max_position_embeddings=S, tie_word_embeddings=False, rms_norm_eps=1e-5)


def module_of(config: dict, precision: str):
    from paramscope.cost.memory.training import TrainingOptions, training_answer

    _, _, view = training_answer(config, TrainingOptions(batch=B, seq=S, precision=precision), use_cache=False)
    return view.module


def traced_saved(config_at, layers: int, precision: str, attention: str | None, *, tp: int = 1,
                 sp: bool = False):
    from paramscope.cost.traced.parallel import trace_parallel_training
    from paramscope.cost.traced.step import StepSettings, trace_training

    settings = StepSettings(batch=B, seq=S, precision=precision, attention=attention)
    module = module_of(config_at(layers), precision)
    if tp == 1:
        return trace_training(module, settings)
    return trace_parallel_training(module, settings, tp=tp, sp=sp)


def per_layer_traced(config_at, precision: str, attention: str | None, **kw) -> tuple[int, object]:
    two = traced_saved(config_at, 2, precision, attention, **kw)
    three = traced_saved(config_at, 3, precision, attention, **kw)
    return three.saved_activations - two.saved_activations, three


def layer_weights(config_at, tp: int) -> int:
    """Elements of one layer's matmul weights on a tensor-parallel rank (autocast's 16-bit copies: 2 B each)."""
    config = config_at(3)
    if config["model_type"] == "gpt2":
        return 12 * H * H // tp
    return (4 * H * H + 3 * H * 4 * H) // tp


def per_layer_engine(config_at, precision: str, tp: int, sp: bool) -> int:
    """The per-device engine's saved activations, 3 layers minus 2 (the layer's autocast weight copies included
    under mixed precision, as in the trace)."""
    from paramscope.cost.memory.training import TrainingOptions, estimate_training
    from paramscope.cost.parallel.layout import layout_for

    saved = []
    for layers in (2, 3):
        layout = layout_for(devices=tp, tp=tp, sp=sp) if tp > 1 else None
        estimate = estimate_training(config_at(layers), TrainingOptions(batch=B, seq=S, precision=precision,
                                                                         layout=layout), use_cache=False)
        saved.append(estimate.training.device.activations if layout else estimate.activations.bytes)
    return saved[1] - saved[0]


def part_korthikanti() -> dict:
    from paramscope.cost.memory.activations import training_activations
    from transformers import GPT2Config

    rows = []
    config = GPT2Config(**{k: v for k, v in gpt3_gpt2(LAYERS).items() if k != "model_type"})
    for precision in ("bf16-mixed", "bf16-pure"):
        recipe = training_activations(config, "GPT2LMHeadModel", batch=B, seq=S, precision=precision,
                                      checkpointing=False)
        casts = 2 * layer_weights(gpt3_gpt2, 1) if precision == "bf16-mixed" else 0
        rows.append(dict(model="GPT-2 class", t=1, sp=False, precision=precision, engine="analytic (sdpa)",
                         bytes=recipe.per_layer, casts=0))
        for attention in ("eager", "sdpa"):
            measured, step = per_layer_traced(gpt3_gpt2, precision, attention)
            modules = {name: value for name, value in step.kept_by_module if name.startswith("transformer.h.0")}
            rows.append(dict(model="GPT-2 class", t=1, sp=False, precision=precision,
                             engine=f"traced ({attention})", bytes=measured - casts, casts=casts,
                             modules={k: v / SBH for k, v in modules.items()}))
    for precision in ("bf16-mixed", "bf16-pure"):
        for tp, sp in ((1, False), (8, False), (8, True)):
            casts = 2 * layer_weights(gpt3_llama, tp) if precision == "bf16-mixed" else 0
            engine = per_layer_engine(gpt3_llama, precision, tp, sp)
            rows.append(dict(model="Llama-style", t=tp, sp=sp, precision=precision, engine="analytic (per device)",
                             bytes=engine - casts, casts=casts))
            measured, step = per_layer_traced(gpt3_llama, precision, None, tp=tp, sp=sp)
            modules = {name: value for name, value in step.kept_by_module if name.startswith("model.layers.0")}
            rows.append(dict(model="Llama-style", t=tp, sp=sp, precision=precision, engine="traced (sdpa)",
                             bytes=measured - casts, casts=casts, modules={k: v / SBH for k, v in modules.items()}))
    for row in rows:
        row["sbh"] = row["bytes"] / SBH
        row["korthikanti"] = korthikanti(row["t"], row["sp"])
        row["korthikanti_selective"] = korthikanti(row["t"], row["sp"], selective=True)
    return dict(sbh=SBH, as_over_h=A * S / H, rows=rows)


def deepspeed_zero2(total: int, gpus: int) -> int:
    """stage_1_and_2.estimate_zero2_model_states_mem_needs, cpu_offload=False: gpu_mem per GPU."""
    return 4 * total + int(16 * total / gpus)


def deepspeed_zero3(total: int, largest_layer: int, gpus: int) -> int:
    """stage3.estimate_zero3_model_states_mem_needs, cpu_offload=False: gpu_mem per GPU."""
    return 4 * largest_layer + int(18 * total / gpus)


def part_deepspeed(model: str = "llama-3-70b", gpus: int = 64) -> dict:
    from paramscope import inspect as inspect_model
    from paramscope.cost.memory.training import TrainingOptions, estimate_training
    from paramscope.cost.parallel.layout import layout_for

    report = inspect_model(model)
    total = report.total
    # model_to_params: the largest parameter count any one module holds itself (recurse=False): the embedding
    # (or the untied head), vocab × hidden
    largest = max(p.numel for p in report.params if p.name.endswith(("embed_tokens.weight", "lm_head.weight")))
    rows = [dict(tool="DeepSpeed", mode="ZeRO-2", bytes=deepspeed_zero2(total, gpus),
                 arithmetic=f"4·N + 16·N/{gpus}"),
            dict(tool="DeepSpeed", mode="ZeRO-3", bytes=deepspeed_zero3(total, largest, gpus),
                 arithmetic=f"4·largest layer + 18·N/{gpus}")]
    for zero in ("2", "3", "fsdp"):
        for precision in ("bf16-mixed", "bf16-pure"):
            estimate = estimate_training(model, TrainingOptions(precision=precision,
                                                                layout=layout_for(devices=gpus, zero=zero)))
            device = estimate.training.device
            states = device.weights + device.gradients + device.optimizer + device.master_weights
            rows.append(dict(tool="paramscope", mode=f"--zero {zero}", precision=precision, bytes=states,
                             weights=device.weights, gradients=device.gradients, optimizer=device.optimizer,
                             master=device.master_weights, buffers=device.buffers,
                             comm=[(b.name, b.bytes) for b in device.comm], peak=device.peak))
    return dict(model=model, parameters=total, largest_layer=largest, gpus=gpus, rows=rows)


def llama3_8b(layers: int) -> dict:
    config = json.loads((PRESETS / "meta-llama--Meta-Llama-3-8B.json").read_text())
    config["num_hidden_layers"] = layers
    return config


def part_torchtitan(layers: int = 4) -> dict:
    from paramscope.cost.memory.training import TrainingOptions, estimate_training
    from paramscope.cost.parallel.layout import layout_for
    from paramscope.cost.traced.parallel import trace_parallel_training
    from paramscope.cost.traced.step import StepSettings

    rows = []
    config = llama3_8b(layers)
    module = module_of(config, "bf16-mixed")
    for seq in (512, 4096):
        for dp, tp in ((8, 1), (4, 2)):
            layout = layout_for(devices=dp * tp, tp=tp, zero="fsdp")
            estimate = estimate_training(config, TrainingOptions(batch=1, seq=seq, precision="bf16-mixed",
                                                                 layout=layout), use_cache=False)
            started = time.perf_counter()
            traced = trace_parallel_training(module, StepSettings(batch=1, seq=seq, precision="bf16-mixed"),
                                             dp=dp, shard="fsdp", tp=tp)
            seconds = time.perf_counter() - started
            device = estimate.training.device
            rows.append(dict(seq=seq, dp=dp, tp=tp, analytic=device.peak, analytic_phase=device.peak_figure.phase,
                             analytic_where=device.peak_figure.where if hasattr(device.peak_figure, "where") else "",
                             traced=traced.peak.bytes, traced_phase=traced.peak.phase, trace_seconds=seconds,
                             phases=[(p.phase, p.bytes) for p in traced.phases],
                             analytic_phases=[(p.phase, getattr(p, "where", ""), p.bytes) for p in device.phases]))
    return dict(model="meta-llama/Meta-Llama-3-8B", layers=layers, rows=rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="korthikanti,deepspeed,torchtitan")
    parser.add_argument("--json", type=Path, help="write every figure here as JSON")
    args = parser.parse_args()
    parts = {"korthikanti": part_korthikanti, "deepspeed": part_deepspeed, "torchtitan": part_torchtitan}
    out = {}
    for name in args.only.split(","):
        started = time.perf_counter()
        out[name] = parts[name]()
        out[name]["seconds"] = round(time.perf_counter() - started, 1)
    report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


def report(out: dict) -> None:
    if "korthikanti" in out:
        part = out["korthikanti"]
        print(f"\n## Korthikanti et al. Table 2 at GPT-3 175B (sbh = {part['sbh']:,}, as/h = {part['as_over_h']:g}); "
              f"{part['seconds']} s\n")
        print("| config | t | sp | precision | paramscope engine | paramscope B/layer | ·sbh | + autocast's weight "
              "copies | Korthikanti B/layer | ·sbh | selective ·sbh |")
        print("|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|")
        for r in part["rows"]:
            k = r["korthikanti"]
            print(f"| {r['model']} | {r['t']} | {'yes' if r['sp'] else 'no'} | {r['precision']} | {r['engine']} | "
                  f"{r['bytes']:,} | {r['sbh']:.3f} | {r['casts']:,} | {round(k * part['sbh']):,} | {k:g} | "
                  f"{r['korthikanti_selective']:g} |")
        print("\nper module of the first layer (traced, ·sbh, activations the module leaves when its forward "
              "returns):")
        for r in part["rows"]:
            if r.get("modules"):
                print(f"  {r['model']} t={r['t']} sp={r['sp']} {r['precision']} {r['engine']}: " +
                      ", ".join(f"{k.split('.')[-1] if k.count('.') > 2 else 'layer'} {v:.3f}"
                                for k, v in r["modules"].items()))
    if "deepspeed" in out:
        part = out["deepspeed"]
        print(f"\n## Model states per GPU, {part['model']} ({part['parameters']:,} parameters; largest module "
              f"{part['largest_layer']:,}) over {part['gpus']} GPUs; {part['seconds']} s\n")
        print("| tool | mode | precision | weights | gradients | optimizer | master | model states per GPU | GiB |")
        print("|---|---|---|---:|---:|---:|---:|---:|---:|")
        for r in part["rows"]:
            if r["tool"] == "DeepSpeed":
                print(f"| DeepSpeed | {r['mode']} ({r['arithmetic']}) | fp16/bf16 + fp32 master | | | | | "
                      f"{r['bytes']:,} | {r['bytes'] / 2**30:.2f} |")
            else:
                print(f"| paramscope | {r['mode']} | {r['precision']} | {r['weights']:,} | {r['gradients']:,} | "
                      f"{r['optimizer']:,} | {r['master']:,} | {r['bytes']:,} | {r['bytes'] / 2**30:.2f} |")
        for r in part["rows"]:
            if r["tool"] == "paramscope" and r["comm"]:
                print(f"  {r['mode']} {r['precision']} communication buffers: {r['comm']}")
    if "torchtitan" in out:
        part = out["torchtitan"]
        print(f"\n## torchtitan's approach: {part['model']} cut to {part['layers']} layers, FSDP2, bf16-mixed, "
              f"batch 1; {part['seconds']} s\n")
        print("| tokens | dp | tp | analytic peak | phase | traced peak (fake PG, MemTracker) | phase | analytic − "
              "traced | % | trace s |")
        print("|---:|---:|---:|---:|---|---:|---|---:|---:|---:|")
        for r in part["rows"]:
            diff = r["analytic"] - r["traced"]
            print(f"| {r['seq']:,} | {r['dp']} | {r['tp']} | {r['analytic']:,} | {r['analytic_phase']} | "
                  f"{r['traced']:,} | {r['traced_phase']} | {diff:+,} | {100 * diff / r['traced']:+.2f}% | "
                  f"{r['trace_seconds']:.1f} |")
        for r in part["rows"]:
            print(f"  {r['seq']} dp{r['dp']} tp{r['tp']}: traced phases {r['phases']}; analytic "
                  f"{r['analytic_phases']}")


if __name__ == "__main__":
    main()
