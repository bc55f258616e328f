"""`paramscope memory`: a MemoryEstimate → text (rich, at a width) and → the JSON "memory" object.

Pure functions of their data. Bytes are exact integers; the binary units beside them (GiB = 2³⁰ B) are for
reading only.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from ..explain import exact
from ..cost.memory.phases import whole_sum
from ..frozen import thaw
from ._console import indented, model_source_line, to_text
from .check import check_to_dict

# One accelerator per memory size for the text table; the JSON lists them all.
_SHOWN = ("RTX 3060", "T4", "RTX 4090", "RTX 5090", "A100 40GB", "L40S", "H100 80GB", "H200", "B200", "MI300X",
          "MI355X")


def binary(n: int) -> str:
    """1,073,741,824 → '1.00 GiB'; small values in B, KiB, MiB. A value reaches the next unit at 1,000 of its own
    (1,048,576,000 B → '0.98 GiB', not '1000.00 MiB'), so no figure is written with four digits before its point.
    The one byte formatter of the text and pages."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if round(abs(value), 2) < 1000 or unit == "TiB":  # as written: 999.996 would print as 1000.00
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} B"


def render_memory_text(report, estimate, width: int = 100, *, color: bool = False) -> str:
    return to_text(memory_parts(report, estimate), width, color)


def memory_parts(report, estimate) -> list:
    if estimate.mode == "training":
        return training_parts(report, estimate)
    settings = estimate.settings
    weights = estimate.weights
    title = Text(f"Memory to serve {report.model.label} ({report.model.class_name}): {estimate.engine} engine, "
                 "allocator level", style="bold")
    seq_from = "" if settings["seq_from"] == "--seq" else f" ({settings['seq_from']})"
    if settings.get("media") is not None and settings["media"]["kind"] == "audio":
        media = settings["media"]
        seq_from += (f" of the decoder a sequence, one audio window a sequence ({media['input']}); the audio "
                     "encoder runs before the prefill")
    elif settings.get("media") is not None and settings["media"].get("vision_tokens"):  # read by cross-attention
        media = settings["media"]
        seq_from += (f" of text, and {media['input']} read by cross-attention ({media['vision_tokens']:,} vision "
                     "tokens a sequence); the vision tower runs before the prefill")
    elif settings.get("media") is not None:
        media = settings["media"]
        seq_from += (f": {media['text_seq']:,} text + {media['image_tokens']:,} image tokens ({media['input']}); the "
                     "vision tower runs before the prefill")
    lines = [
        title,
        *filter(None, [model_source_line(report.model)]),
        indented(f"storage: {weights.format.label}, from {settings['dtype_from']}"),
        indented(f"batch {settings['batch']:,} × {settings['seq']:,} tokens{seq_from}"
                 + (f"; KV cache in {_short(settings['kv_dtype'])}" if estimate.kv_cache else "")),
    ]
    parallel = estimate.parallel
    layout = parallel.layout if parallel is not None else None
    if layout is not None:
        lines.append(indented(f"across GPUs: {layout.words()}; the model's figures first, then one GPU's"))
    lines += [Text(""), _totals(estimate)]
    if weights.format.quantized and weights.kept:
        lines.append(indented("left unquantised: " + "; ".join(
            f"{why} ({exact(numel)} parameters, {storage})" for why, numel, storage in weights.kept)))
    if estimate.kv_cache is not None:
        lines.append(_cache_table(estimate.kv_cache))
    lines.append(_roles_table(weights))
    if layout is not None:
        lines += [_gpu_table(estimate, layout), Text("")]  # its caption ends it: a blank line before the next
        if layout.pp > 1:
            lines += [*_serving_stages_table(layout), Text("")]
        if layout.tp > 1:
            lines += [_serving_rules_table(layout), Text("")]
    lines.append(_fits_table(estimate))
    if estimate.budget is not None:
        lines.append(_budget_line(estimate))
    if parallel is not None and parallel.smallest is not None:
        lines.append(Text(smallest_tp_sentence(_smallest_to_dict(parallel.smallest)), style="bold"))
    for note in estimate.notes:
        lines.append(indented(f"note: {note}"))
    if estimate.kv_cache is not None:
        lines.append(indented(f"convention: {estimate.kv_cache.convention}"))
    lines.append(indented("convention: figures are bytes of tensors (what torch's allocator is asked for); the CUDA "
                          f"context and fragmentation are the reserve, {binary(estimate.reserve)} (--reserve)"))
    return lines


def _short(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)


def _totals(estimate) -> Table:
    weights = estimate.weights
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    _weight_rows(table, weights)
    cache = estimate.kv_cache
    if cache is not None:
        table.add_row("KV cache", exact(cache.bytes), binary(cache.bytes),
                      f"{exact(cache.bytes_per_token)} B per token; by layer kind below")
    if estimate.activations is not None:
        table.add_row("prefill workspace", exact(estimate.activations.bytes), binary(estimate.activations.bytes),
                      estimate.activations.arithmetic)
    if estimate.parallel is not None and estimate.parallel.layout is not None:
        table.add_row("peak on one device (prefill)", exact(sum_one_device(estimate)),
                      binary(sum_one_device(estimate)), "the sum above, were the model on one device", style="bold")
        layout = estimate.parallel.layout
        table.add_row(f"peak per GPU ({estimate.peak_phase})", exact(estimate.peak), binary(estimate.peak),
                      f"{layout.words()}: the largest GPU's, below", style="bold")
        table.add_row("+ reserve", exact(estimate.reserve), binary(estimate.reserve),
                      "CUDA context and allocator fragmentation (--reserve), on each GPU")
        return table
    media = estimate.settings.get("media")
    if media is not None:  # the tower runs before the prefill, with the weights resident
        audio = media["kind"] == "audio"
        table.add_row("audio encoder (forward)" if audio else "vision tower (forward)",
                      exact(media["tower_forward_peak"]), binary(media["tower_forward_peak"]),
                      "measured: the largest bytes live during the "
                      + ("encoder's forward on fake tensors of the mel frames" if audio else
                         "tower's and projector's forward on fake tensors of the images") + " (weights not)")
        if audio:
            table.add_row("encoder output", exact(media["encoder_output"]), binary(media["encoder_output"]),
                          "sequences × encoder states × d_model, read by the decoder through generation")
        elif media.get("vision_tokens"):  # read by cross-attention (Llama-3.2-Vision): no image tokens
            table.add_row("token ids and mask", exact(media["text_inputs"]), binary(media["text_inputs"]),
                          f"batch × {estimate.settings['seq']:,} tokens × 8 B × (1 + tiles): the token ids and the "
                          "cross-attention mask given, live while the tower runs")
            held = media.get("image_features_held", 0)
            table.add_row("images held", exact(held), binary(held),
                          "measured: what the forward keeps of the images through the prefill (pixel values, the "
                          "vision model's output, the projected tiles, the cross-attention masks)")
        else:
            if media.get("text_inputs"):  # the integer inputs given, measured with the tower's moment
                table.add_row("token ids and masks", exact(media["text_inputs"]), binary(media["text_inputs"]),
                              f"batch × {estimate.settings['seq']:,} tokens × the int64 inputs given "
                              f"({', '.join(media.get('text_inputs_given', ()))}), live while the tower runs")
            table.add_row("input embeddings", exact(media["embeddings"]), binary(media["embeddings"]),
                          f"batch × {estimate.settings['seq']:,} tokens × hidden, made before the tower runs")
            held = media.get("image_features_held", 0)
            table.add_row("images held", exact(held), binary(held),
                          "measured: what the forward keeps of the images through the prefill (pixel values, the "
                          "tower's output, the projected features)")
        beside = "its peak" if audio else "its peak + token ids and mask" if media.get("vision_tokens") else \
            "the largest bytes live up to the language model's call, measured: its peak + token ids and masks + " \
            "input embeddings" + (" + the merge and masks" if media.get("tower_rest") else "")
        table.add_row(f"peak ({estimate.peak_phase})", exact(estimate.peak), binary(estimate.peak),
                      f"the {'largest' if media.get('mask_moment') else 'larger'} moment: the "
                      f"{'encoder' if audio else 'tower'}'s (weights + {beside}) {exact(media['tower_moment'])}, the "
                      f"prefill's (weights + KV cache + workspace + {'encoder output' if audio else 'images held'}) "
                      f"{exact(media['prefill_moment'])}"
                      + (f", the cross-attention mask's build (weights + what is live then, measured) "
                         f"{exact(media['mask_moment'])}" if media.get("mask_moment") else ""), style="bold")
        table.add_row("+ reserve", exact(estimate.reserve), binary(estimate.reserve),
                      "CUDA context and allocator fragmentation (--reserve)")
        return table
    if estimate.engine == "traced":
        how = ("measured: generate()'s prefill and a decode step on fake tensors (MemTracker), with the stored weights"
               if cache is not None else "measured: one forward on fake tensors (MemTracker), with the stored weights")
    else:
        how = ("the sum above: weights stay resident, the cache is full at the end of the prefill" if cache is not None
               else "the sum above: weights stay resident; no cache (the model does not generate)")
    table.add_row(f"peak ({estimate.peak_phase})", exact(estimate.peak), binary(estimate.peak), how, style="bold")
    table.add_row("+ reserve", exact(estimate.reserve), binary(estimate.reserve),
                  "CUDA context and allocator fragmentation (--reserve)")
    return table


def _weight_rows(table: Table, weights) -> None:
    """The weights by storage line (their total where several) and the buffers, as rows of a bytes table."""
    for label, value, how in weights.lines:
        table.add_row(f"weights: {label.removeprefix('parameters in ')}", exact(value), binary(value), how)
    if len(weights.lines) > 1:
        table.add_row("weights", exact(weights.bytes), binary(weights.bytes), "", style="bold")
    if weights.buffer_bytes:
        parts = ", ".join(f"{exact(v)} B {k}" for k, v in weights.buffers_by_dtype.items())
        table.add_row("buffers", exact(weights.buffer_bytes), binary(weights.buffer_bytes), parts)


def sum_one_device(estimate) -> int:
    """Weights, buffers, KV cache and prefill workspace added up: the one-device peak (analytic)."""
    weights, cache, work = estimate.weights, estimate.kv_cache, estimate.activations
    return weights.bytes + weights.buffer_bytes + (cache.bytes if cache else 0) + (work.bytes if work else 0)


def _gpu_table(estimate, layout) -> Table:
    device = layout.device
    where = f"stage {device.rank}'s tensor-parallel rank 0" if layout.pp > 1 else "tensor-parallel rank 0"
    table = Table(title=f"One GPU ({where}, the largest peak): {layout.words()}", title_justify="left",
                  caption=f"KV cache: {layout.kv_heads}; prefill workspace: {layout.workspace_from}",
                  caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    _weight_rows(table, device.weights)
    cache = device.kv_cache
    if cache is not None:
        for group in cache.groups:
            tokens = "a fixed state" if group.kind in ("recurrent state", "cross-attention") else \
                f"{exact(group.tokens)} tokens"
            how = f"{group.layers} layers × batch {cache.batch:,} × {tokens} × ({group.arithmetic})"
            table.add_row(f"KV cache: {group.kind}", exact(group.bytes), binary(group.bytes), how)
        if len(cache.groups) != 1:
            table.add_row("KV cache", exact(cache.bytes), binary(cache.bytes),
                          f"{exact(cache.bytes_per_token)} B per token")
    if device.workspace is not None:
        table.add_row("prefill workspace", exact(device.workspace.bytes), binary(device.workspace.bytes),
                      device.workspace.arithmetic)
    if device.correction:
        table.add_row("correction (a bound)", exact(device.correction), binary(device.correction),
                      "what transformers' prefill keeps beyond the formula on one device (traced), carried whole, "
                      "with the formula's tp cut of the workspace given back: see the notes")
    if device.gathered:
        table.add_row("MoE dispatch, gathered", exact(device.gathered), binary(device.gathered),
                      layout.dispatch.arithmetic(estimate.settings["batch"], estimate.settings["seq"])
                      + " (vLLM's allgather_reducescatter dispatch over the DP group: see the notes)")
    if device.experts_workspace:
        table.add_row("MoE experts' workspace", exact(device.experts_workspace), binary(device.experts_workspace),
                      layout.experts_workspace.arithmetic(estimate.settings["batch"], estimate.settings["seq"])
                      + " (vLLM's fused experts over the gathered tokens: see the notes)")
    table.add_row(f"peak ({estimate.peak_phase})", exact(device.peak), binary(device.peak),
                  "the sum above: this GPU's weights stay resident, its cache is full at the end of the prefill",
                  style="bold")
    return table


def _serving_stages_table(layout) -> list:
    """As training's stage table (_stages_table): its title line, a row a stage with the figures in the table's one
    unit, its legend line."""
    unit = table_unit([stage.peak for stage in layout.stages])
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("stage", justify="right", no_wrap=True)
    table.add_column("layers", overflow="fold")
    for name in ("weights", "KV cache", "workspace", "peak"):
        table.add_column(f"{name}\n{unit[0]}", justify="right", no_wrap=True)
    top = layout.device
    for stage in layout.stages:
        table.add_row(str(stage.rank), _stage_layers(stage), in_unit(stage.weight_bytes, unit),
                      in_unit(stage.kv_cache.bytes, unit) if stage.kv_cache is not None else "—",
                      in_unit(stage.workspace.bytes, unit) if stage.workspace is not None else "—",
                      in_unit(stage.peak, unit), style="bold" if stage is top else None)
    return [Text(f"Pipeline stages: {layout.pipeline}"), table,
            indented(f"{_unit_words(unit)}, each GPU of a stage's tensor-parallel group alike (rank 0's shares); —: "
                     "none on the stage; exact bytes in --json")]


def _serving_rules_table(layout) -> Table:
    table = Table(title=f"How each role is cut over tp {layout.tp}", title_justify="left",
                  caption="from each parameter's role, the rules training layouts use (transformers' tp plans agree)",
                  caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("role", no_wrap=True)
    table.add_column("rule", overflow="fold", ratio=1)
    for role, rule in layout.rules.items():
        table.add_row(role, rule)
    return table


def smallest_tp_sentence(smallest: dict[str, Any]) -> str:
    """The smallest tensor-parallel degree (a MoE model's: tp × dp) that fits, in one sentence, from its JSON form."""
    name = f"a {binary(smallest['memory'])} budget" if smallest["accelerator"] == "budget" else \
        smallest["accelerator"]
    if smallest.get("dp_searched"):
        return _smallest_layout_sentence(smallest, name)
    pp = f" with pp {smallest['pp']}" if smallest["pp"] > 1 else ""
    if smallest.get("dp", 1) > 1:
        pp += f"{' and' if pp else ' with'} dp {smallest['dp']}" + (" (ep = tp × dp)" if smallest["ep"] else "")
    at = f"at batch {smallest['batch']:,} × {smallest['seq']:,} tokens{pp}"
    fitted = [t for t in smallest["tried"] if t["peak"] is not None]
    refused = [t["tp"] for t in smallest["tried"] if t["peak"] is None]
    skipped = f"; tp {', '.join(map(str, refused))} refused (uneven heads or widths)" if refused else ""
    if smallest["tp"] is None:
        last = fitted[-1] if fitted else None
        widest = f": tp {last['tp']} still needs {binary(last['peak'])} a GPU" if last else ""
        return f"No tensor-parallel degree fits {name} {at}{widest}{skipped}"
    smaller = [t for t in fitted if t["tp"] < smallest["tp"]]
    before = f" (tp {smaller[-1]['tp']} needs {binary(smaller[-1]['peak'])} a GPU)" if smaller else ""
    return (f"Smallest tensor-parallel degree that fits {name} {at}: tp {smallest['tp']}, "
            f"{binary(smallest['peak'])} a GPU{before}{skipped}")


def _smallest_layout_sentence(smallest: dict[str, Any], name: str) -> str:
    """A MoE model's search over tp × dp (parallel/serving.smallest_tp), in one sentence."""
    def layout(t: dict[str, Any]) -> str:
        devices = t["tp"] * t["dp"] * smallest["pp"]
        return (f"tp {t['tp']} × dp {t['dp']}" + (f" × pp {smallest['pp']}" if smallest["pp"] > 1 else "")
                + f" = {devices:,} GPU{'s' if devices > 1 else ''}")

    at = (f"at batch {smallest['batch']:,} (a replica's) × {smallest['seq']:,} tokens"
          + (f" with pp {smallest['pp']}" if smallest["pp"] > 1 else "") + f" (MoE, tried {smallest['order']})")
    fitted = [t for t in smallest["tried"] if t["peak"] is not None]
    refused = [t for t in smallest["tried"] if t["peak"] is None]
    skipped = (f"; {len(refused)} refused (uneven heads or widths), the first {layout(refused[0]).split(' =')[0]}"
               if refused else "")
    if smallest["tp"] is None:
        least = min(fitted, key=lambda t: t["peak"], default=None)
        widest = f": at best {layout(least)} still needs {binary(least['peak'])} a GPU" if least else ""
        return f"No layout fits {name} {at}{widest}{skipped}"
    found = next(t for t in fitted if t["tp"] == smallest["tp"] and t["dp"] == smallest["dp"])
    fewer = [t for t in fitted[:fitted.index(found)] if t["tp"] * t["dp"] < found["tp"] * found["dp"]]
    # the least any layout of the next fewer GPUs needs
    most = max((t["tp"] * t["dp"] for t in fewer), default=None)
    before = min((t for t in fewer if t["tp"] * t["dp"] == most), key=lambda t: t["peak"], default=None)
    needs = f" (at best {layout(before)} needs {binary(before['peak'])} a GPU)" if before else ""
    return f"Smallest layout that fits {name} {at}: {layout(found)}, {binary(found['peak'])} a GPU{needs}{skipped}"


def _cache_table(cache) -> Table:
    table = Table(title=f"KV cache, {cache.layout} layout, {_short(cache.dtype)}: batch {cache.batch:,} × "
                        f"{cache.seq:,} tokens", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("layers", no_wrap=True)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("tokens held", justify="right", no_wrap=True)
    table.add_column("per layer and token", overflow="fold", ratio=1)
    table.add_column("bytes", justify="right", no_wrap=True)
    for group in cache.groups:
        how = group.arithmetic + (" per sequence" if group.kind == "recurrent state" else "") + (
            f" + the window, an int64 per layer ({group.constant:,} B)" if getattr(group, "constant", 0) else "")
        held = "fixed" if group.kind == "recurrent state" else exact(group.tokens)  # a state, not tokens
        table.add_row(group.kind, str(group.layers), held, how, exact(group.bytes))
    for note in cache.notes:
        table.add_row("", "", "", f"note: {note}", "")
    return table


def _roles_table(weights, limit: int = 12) -> Table:
    table = Table(title="Weights by role", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("role", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    rows = sorted(weights.by_role.items(), key=lambda kv: -kv[1])
    for role, value in rows[:limit]:
        table.add_row(role, exact(value), binary(value), _share(value, weights.bytes))
    if len(rows) > limit:
        rest = sum(v for _, v in rows[limit:])
        table.add_row(f"{len(rows) - limit} more roles", exact(rest), binary(rest), _share(rest, weights.bytes))
    return table


def _share(value: int, total: int) -> str:
    return f"{100 * value / total:.1f}%" if total else "—"


def _fits_table(estimate) -> Table:
    settings = estimate.settings
    limit = settings.get("max_context")
    layout = settings.get("layout") if estimate.mode == "inference" else None
    each = f", each GPU of {layout['words']}" if layout else ""
    table = Table(title=f"Fits on: peak + reserve within the accelerator's memory{each}", title_justify="left",
                  caption=f"largest {_fit_batch(settings)[0]} at {settings['seq']:,} tokens"
                          f"{_in_microbatches(settings)}; largest context at {_fit_batch(settings)[0]} "
                          f"{_fit_batch(settings)[1]:,}"
                          + ((f", up to the model's {limit:,}" if limit >= settings["seq"] else
                              f", up to --seq {settings['seq']:,} (beyond the model's {limit:,})") if limit else ""),
                  caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("accelerator", no_wrap=True)
    table.add_column("memory", justify="right", no_wrap=True)
    table.add_column("fits", no_wrap=True)
    table.add_column("free", justify="right", no_wrap=True)
    table.add_column("largest batch", justify="right", no_wrap=True)
    table.add_column("largest context", justify="right", no_wrap=True)
    for fit in estimate.fits:
        if fit.accelerator.name in _SHOWN:
            table.add_row(*_fit_row(fit))
    return table


def _fit_batch(settings) -> tuple[str, int]:
    """(what the largest batch counts, the batch the largest context is at): under gradient accumulation the fits
    are one micro-step's (grad_accum.py), so a micro-batch."""
    if settings.get("grad_accum", 1) > 1:
        return "micro-batch", settings["micro_batch"]
    return "batch", settings["batch"]


def _in_microbatches(settings) -> str:
    """Under a pipeline the largest batch is one its m microbatches divide, as --batch must be: said beside it."""
    layout = settings.get("layout") or {}
    if layout.get("pp", 1) > 1 and layout.get("micro_batches", 1) > 1:
        return f", a multiple of the pipeline's {layout['micro_batches']:,} microbatches"
    return ""


def _fit_row(fit) -> tuple[str, ...]:
    return (fit.accelerator.name, binary(fit.accelerator.memory), "yes" if fit.fits else "no",
            binary(fit.free) if fit.free >= 0 else f"short {binary(-fit.free)}",
            "—" if fit.largest_batch is None else exact(fit.largest_batch),
            "—" if fit.largest_context is None else exact(fit.largest_context))


def _budget_line(estimate) -> Text:
    return Text(budget_sentence(_fit_to_dict(estimate.budget), estimate.settings), style="bold")


def budget_sentence(budget: dict[str, Any], settings) -> str:
    """The answer for --gpu or --budget in one sentence, from the JSON form of the fit (the text and the page say
    the same words). A --budget is the accelerator named "budget" (cost/memory: Accelerator("budget", …))."""
    name = f"{binary(budget['memory'])} budget" if budget["accelerator"] == "budget" else budget["accelerator"]
    layout = settings.get("layout")
    if layout and "shard" not in layout:  # serving across GPUs (a training layout has a shard): each GPU's
        name += f", each GPU of {layout['words']}"
    if budget["fits"]:
        head = f"On {name}: fits, {binary(budget['free'])} to spare"
    else:
        head = f"On {name}: does not fit, short by {binary(-budget['free'])}"
    word, at = _fit_batch(settings)
    batch = f"no {word} fits" if budget["largest_batch"] is None else f"largest {word} {exact(budget['largest_batch'])}"
    context = ("no context fits" if budget["largest_context"] is None
               else f"largest context {exact(budget['largest_context'])}")
    multiple = f" ({_in_microbatches(settings)[2:]})" if budget["largest_batch"] and _in_microbatches(settings) else ""
    return f"{head}; {batch} at {settings['seq']:,} tokens{multiple}, {context} at {word} {at:,}"


def settings_rows(memory: dict[str, Any]) -> list[tuple[str, str]]:
    """Every setting the figures depend on, as (setting, value) in words, from the JSON "memory" object: what
    the text says in its header and convention lines, for the page to list."""
    settings = memory["settings"]
    engine = memory["engine"] + " engine, allocator level (bytes of tensors)"
    training = memory["mode"] == "training"
    seq_from = "" if settings["seq_from"] == "--seq" else " (default for training)" if training else \
        f" ({settings['seq_from']})"  # as the text's header says it
    shape = f"{settings['batch']:,} × {settings['seq']:,} tokens{seq_from}"
    reserve = (f"{binary(settings['reserve'])} (--reserve): CUDA context and allocator fragmentation, added to the "
               "peak before comparing with a device")
    if not training:
        cache = memory["kv_cache"]
        if cache is None:
            kv = "none: the model does not generate"
        else:
            kv = f"{_short(cache['dtype'])}, {cache['layout']} layout"
            encoder = [g["tokens"] for g in cache["groups"] if g["kind"] == "cross-attention"]
            if encoder:
                kv += f"; cross-attention holds {encoder[0]:,} encoder tokens"
        return [("engine", engine),
                ("weights", f"{memory['weights']['format_label']}, from {settings['dtype_from']}"),
                *([("compute dtype", _short(settings["compute_dtype"]))] if settings.get("compute_dtype") else []),
                ("KV cache", kv),
                ("batch × sequence", shape),
                ("reserve", reserve)]
    if settings.get("trace"):
        engine += f"; --trace {settings['trace']}"
    own = ", ".join(f"{exact(n)} parameters kept in {_short(d)}" for d, n in (settings.get("own_dtype") or {}).items())
    frozen = ", ".join(settings["freeze"]) or "nothing"
    if memory.get("frozen_parameters"):
        frozen += (f" ({exact(memory['frozen_parameters'])} parameters; {exact(memory['trainable_parameters'])} "
                   "train)")
    devices = (f"{settings['devices']:,}, data parallel, each with its own batch; ZeRO-{settings['zero']}"
               if settings["devices"] > 1 or str(settings["zero"]) != "0" else "1, no sharding (ZeRO-0)")
    return [("engine", engine),
            ("precision", f"{settings['precision']}: {_PRECISIONS[settings['precision']]}"),
            ("weights dtype", _short(settings["weights_dtype"]) + (f"; {own}" if own else "")),
            ("optimizer", settings["optimizer"] + (" (fused)" if settings["optimizer"] in ("adamw", "adam") else "")),
            ("batch × sequence", shape),
            ("attention", settings["attention"]),
            ("gradient checkpointing", settings["grad_checkpointing"]),
            ("activations", settings["activations_from"]),
            ("frozen", frozen),
            ("devices", devices),
            ("reserve", reserve)]


# --- training ------------------------------------------------------------------------------------------------

_PRECISIONS = {"fp32": "fp32 weights, gradients and optimizer states",
               "bf16-mixed": "fp32 weights (the master copy), bf16 autocast",
               "fp16-mixed": "fp32 weights (the master copy), fp16 autocast",
               "bf16-pure": "bf16 weights, gradients and optimizer states",
               "bf16-master": "bf16 weights and gradients, fp32 master weights and optimizer states (DeepSpeed's "
                              "bf16 / the ZeRO paper's mixed precision)",
               "bf16-main-grad": "bf16 weights, an fp32 main-gradient buffer, fp32 master weights and optimizer "
                                 "states (Megatron-LM's bf16 training)"}


def training_parts(report, estimate) -> list:
    settings, detail = estimate.settings, estimate.training
    states = detail.states
    title = Text(f"Memory to train {report.model.label} ({report.model.class_name}): {estimate.engine} engine, "
                 "allocator level", style="bold")
    seq_from = "" if settings["seq_from"] == "--seq" else " (default for training)"
    policy = (settings.get("layout") or {}).get("fsdp_mixed_precision") == "policy"
    described = (f"fp32 weights sharded, gathered as {settings['precision'][:4]} by FSDP2's MixedPrecisionPolicy, no "
                 "autocast") if policy else _PRECISIONS[settings['precision']]
    step = (f"{settings['precision']} ({described}); {settings['optimizer']}"
            + (" (fused)" if settings["optimizer"] in ("adamw", "adam") else ""))
    shape = (f"batch {settings['batch']:,} × {settings['seq']:,} tokens{seq_from}; attention "
             f"{settings['attention']}; gradient checkpointing {settings['grad_checkpointing']}")
    lines = [title, *filter(None, [model_source_line(report.model)]), indented(step), indented(shape)]
    if detail.device is not None:  # the whole-model tables are the one-device step's (torch.autocast when mixed)
        alone = settings["precision"] + (", torch.autocast" if settings["precision"].endswith("-mixed") else "")
        lines.append(indented(f"across GPUs: {detail.device.layout.words()}; the model's figures on one device "
                              f"({alone}) first, then one device's under the layout"))
    if detail.frozen:
        tensors = "tensor" if len(detail.frozen) == 1 else "tensors"
        towers = settings.get("idle_towers") or []
        named = "; ".join(filter(None, [", ".join(settings["freeze"]),
                                        f"{', '.join(towers)}: not run by a text input" if towers else ""])) \
            or "requires_grad False in the class"
        lines.append(indented(f"frozen: {exact(states.frozen)} parameters in {len(detail.frozen)} {tensors} "
                              f"({named}); {exact(states.trainable)} train"))
    lines += [Text(""), _training_totals(estimate), Text(""), _phases_table(estimate)]
    if detail.traced is not None and detail.traced.kept_by_module:
        lines += [Text(""), _kept_table(detail.traced)]
    if detail.per_device is not None:
        lines.append(_per_device_table(estimate))
        if settings["zero"] == 3:  # the one stage where the layout's answer differs: say where, and by what
            lines.append(indented(f"DeepSpeed's flat ZeRO-3 shares alone (TrainingOptions(devices, zero)): the "
                                  f"layout --dp {settings['devices']:,} --zero 3, which --devices "
                                  f"{settings['devices']:,} --zero 3 answers on the command line, adds the layer and "
                                  "the head ZeRO-3 gathers while each runs"))
    if detail.device is not None:
        lines += [_device_table(estimate)]
        if detail.device.stages:
            lines += [Text(""), *_stages_table(detail.device), Text("")]
        lines.append(_rules_table(detail.device))
    lines.append(_fits_table(estimate))
    if estimate.budget is not None:
        lines.append(_budget_line(estimate))
    for note in estimate.notes:
        lines.append(indented(f"note: {note}"))
    if settings["precision"].endswith("-mixed") and not policy:
        lines.append(indented("convention: mixed precision is torch.autocast's: matmuls (and sdpa) in 16 bits with "
                              "16-bit weight copies cached for the step, norms, softmax and the loss in fp32; "
                              "traced with the CPU autocast rules, which cast the same matmuls as CUDA's"))
        if settings.get("precision_defaulted"):  # the default where no DeepSpeed bf16 or FSDP2 policy applies: named
            lines.append(indented(f"convention: {settings['precision']}, the default where neither DeepSpeed's bf16 "
                                  "(ZeRO 1-3) nor FSDP2's MixedPrecisionPolicy applies (HF Trainer's --bf16); "
                                  "--precision bf16-pure, bf16-master, bf16-main-grad or fp32 for another"))
        shard = (settings.get("layout") or {}).get("shard", "")
        if settings.get("zero") or shard.startswith("zero"):  # a DeepSpeed layout priced with autocast's states
            lines.append(indented("convention: ZeRO is priced over autocast's fp32 weights and gradients; DeepSpeed "
                                  "with bf16 enabled keeps bf16 weights and gradients and an fp32 master copy "
                                  "instead (the ZeRO paper's 2 + 2 + 12 B a parameter): --precision bf16-master"))
    if policy and not any("--fsdp-mixed-precision autocast" in note for note in estimate.notes):
        # the policy's own note names the other convention; where a pipeline's note speaks instead, say it here
        lines.append(indented("convention: FSDP2's MixedPrecisionPolicy is the default under --zero fsdp and "
                              "hybrid_shard (torchtitan's); --fsdp-mixed-precision autocast for torch.autocast over "
                              "the fp32 parameters FSDP2 gathers"))
    lines.append(indented("convention: the steady step (optimizer states already allocated): loss = model(ids, "
                          "labels=ids).loss; loss.backward(); opt.step(); opt.zero_grad(set_to_none=True); outputs "
                          "are not kept past the loss"))
    lines.append(indented("convention: figures are bytes of tensors (what torch's allocator is asked for); the CUDA "
                          f"context and fragmentation are the reserve, {binary(estimate.reserve)} (--reserve)"))
    return lines


def _training_totals(estimate) -> Table:
    states, detail = estimate.training.states, estimate.training
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    for label, term in (("weights", states.weights), ("gradients", states.gradients),
                        ("optimizer states", states.optimizer), ("master weights", states.master_weights)):
        table.add_row(label, exact(term.bytes), binary(term.bytes), term.arithmetic)
    weights = estimate.weights
    if weights.buffer_bytes:
        parts = ", ".join(f"{exact(v)} B {k}" for k, v in weights.buffers_by_dtype.items())
        table.add_row("buffers", exact(weights.buffer_bytes), binary(weights.buffer_bytes), parts)
    act = estimate.activations
    table.add_row("activations saved", exact(act.bytes), binary(act.bytes),
                  f"{detail.activation_source}: {act.arithmetic}")
    for part, path, value in detail.towers:  # a cross-attention family's tower, traced in the same step
        table.add_row(f"  of which {part}", exact(value), binary(value),
                      f"{path}: what its forward leaves allocated as it returns (its output and what it saves for "
                      "backward), traced in the same step")
    top = max(detail.phases, key=lambda p: p.bytes)
    where = "" if top.where == "measured" else f"{top.where}: "
    table.add_row(f"peak ({top.phase})", exact(top.bytes), binary(top.bytes),
                  f"{where}the largest moment of the step, not the sum of the rows", style="bold")
    if detail.per_device is not None or detail.device is not None:
        table.add_row(f"peak per device ({estimate.peak_phase})", exact(estimate.peak), binary(estimate.peak),
                      "each moment with the device's shares of the model states, below", style="bold")
    table.add_row("+ reserve", exact(estimate.reserve), binary(estimate.reserve),
                  "CUDA context and allocator fragmentation (--reserve)")
    return table


def _phases_table(estimate) -> Table:
    detail = estimate.training
    table = Table(title="The step's moments: resident weights, buffers and optimizer states, plus", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("phase", no_wrap=True)
    table.add_column("moment", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    top = max(detail.phases, key=lambda p: p.bytes)
    for phase in detail.phases:
        table.add_row(phase.phase, phase.where, exact(phase.bytes), binary(phase.bytes), phase.arithmetic,
                      style="bold" if phase is top else None)
    return table


def _kept_table(traced) -> Table:
    """Activations by module: what each leaves allocated as its forward returns; identical layers folded."""
    import re

    table = Table(title="Activations by module (traced)", title_justify="left",
                  caption="what each module's forward leaves allocated, its output included", caption_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("module", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    rows = list(traced.kept_by_module)
    index = 0
    while index < len(rows):
        path, value = rows[index]
        match = re.match(r"^(.*)\.(\d+)$", path)
        if match:
            run = [index]
            probe = index + 1
            while probe < len(rows):
                other, other_value = rows[probe]
                if other.startswith(path + "."):
                    probe += 1
                    continue
                same = re.match(r"^(.*)\.(\d+)$", other)
                if same and same.group(1) == match.group(1) and other_value == value:
                    run.append(probe)
                    probe += 1
                    continue
                break
            last = re.match(r"^(.*)\.(\d+)$", rows[run[-1]][0]).group(2)
            label = path if len(run) == 1 else f"{match.group(1)}.{match.group(2)}–{last} (each)"
            table.add_row(label, exact(value), binary(value), style="bold" if len(run) > 1 else None)
            for child, child_value in rows[index + 1:]:
                if not child.startswith(path + "."):
                    break
                table.add_row("  " + child[len(path) + 1:], exact(child_value), binary(child_value))
            index = probe
            continue
        table.add_row(path, exact(value), binary(value))
        index += 1
    return table


def _per_device_table(estimate) -> Table:
    settings, shares = estimate.settings, estimate.training.per_device
    table = Table(title=f"Per device: ZeRO-{settings['zero']} over {settings['devices']:,} devices",
                  caption=f"each device runs its own batch of {settings['batch']:,}", caption_justify="left",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    for key in ("weights", "gradients", "optimizer", "master_weights", "activations", "peak"):
        if key not in shares:
            continue
        table.add_row(key.replace("_", " "), exact(shares[key]), binary(shares[key]),
                      style="bold" if key == "peak" else None)
    return table


def _device_table(estimate) -> Table:
    device = estimate.training.device
    table = Table(title=f"{_device_words(device)}: {device.layout.words()}", title_justify="left",
                  caption=f"each data-parallel replica runs a batch of {estimate.settings['batch']:,}; "
                          f"{device.states_arithmetic}{_flat_zero3_words(device)}", caption_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    for label, value in (("weights", device.weights), ("gradients", device.gradients),
                         ("optimizer states", device.optimizer), ("master weights", device.master_weights),
                         ("buffers", device.buffers)):
        table.add_row(label, exact(value), binary(value), "")
    table.add_row("activations saved", exact(device.activations), binary(device.activations),
                  device.activations_from)
    for buffer in device.comm:
        table.add_row(buffer.name, exact(buffer.bytes), binary(buffer.bytes),
                      f"{buffer.arithmetic}; held at the {' and '.join(buffer.moments)} moments")
    top = device.peak_figure
    table.add_row(f"peak ({top.phase})", exact(top.bytes), binary(top.bytes), f"{top.where}: {_peak_sum(device)}",
                  style="bold")
    return table


def _peak_sum(device) -> str:
    """The device's peak as the whole sum: its resident states + the moment's terms = the peak."""
    resident = (("weights", device.weights), ("optimizer states", device.optimizer),
                ("master weights", device.master_weights), ("buffers", device.buffers))
    if device.gradients_resident:  # bf16-main-grad's fp32 gradient buffer, held at every moment
        resident = resident[:1] + (("fp32 gradient buffer", device.gradients),) + resident[1:]
    if device.accumulation_buffer:  # bf16-master's BF16_Optimizer: its bf16 gradient-accumulation buffer, held always
        resident = resident[:1] + (("BF16_Optimizer's bf16 gradient-accumulation buffer", device.accumulation_buffer),) \
            + resident[1:]
    return whole_sum(device.peak_figure, resident)


def _device_words(device) -> str:
    """Which device the table shows, and why: under a pipeline the stage whose peak is the largest (its figures are
    that stage's), named with its rank under torchtitan's mesh order (pp outermost: stage s's first rank is
    s × devices / pp); else rank 0, whose share is the largest wherever a cut is uneven."""
    if not device.stages:
        return "One device (rank 0, the largest share)"
    stage = max(device.stages, key=lambda s: s.peak)
    layout = device.layout
    rank = stage.rank * (layout.devices // layout.pp)
    return (f"One device, pipeline stage {stage.rank} at rank {rank:,} (pp outermost, as torchtitan's mesh orders the "
            f"ranks): its peak is the largest of the {layout.pp} stages'")


def _flat_zero3_words(device) -> str:
    """Under ZeRO-3 over data parallel alone: `--devices N --zero 3` is this layout (cli/memory._layout), so the two
    spellings give this one answer, the gathered buffers counted; said, with the bytes they add at this peak."""
    layout = device.layout
    if layout.shard != "zero3" or layout.devices != layout.dp or layout.ep != 1:
        return ""
    gathered = sum(b.bytes for b in device.comm if device.peak_figure.phase in b.moments)
    return (f"; --devices {layout.dp:,} --zero 3 is this layout and gives this answer, the gathered buffers above "
            f"counted ({exact(gathered)} B at the peak; DeepSpeed's flat shares alone, the Python API's "
            f"TrainingOptions(devices={layout.dp}, zero=\"3\"), leave them out)")


def _stage_layers(stage) -> str:
    return stage_layers_words(stage.first, stage.chunks, stage.last)


def stage_layers_words(first: bool, runs, last: bool) -> str:
    """"embeddings, 0–19": what a pipeline stage holds in the model's order (the embeddings, its runs of layers,
    (first, last) each, the head), a comma between each, so that a narrow column wraps between them."""
    parts = (["embeddings"] if first else []) + [f"{a}–{b}" if a != b else str(a) for a, b in runs] + (
        ["head"] if last else [])
    return ", ".join(parts) or "—"


def table_unit(values) -> tuple[str, int]:
    """The binary unit a column of byte figures is written in (its name for the header, its size): the one binary()
    writes the largest in, so that every figure of the column reads in one unit."""
    largest = max((abs(v) for v in values), default=0)
    for name, size in (("B", 1), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30)):
        if round(largest / size, 2) < 1000:
            return name, size
    return "TiB", 2**40


def in_unit(value: int, unit: tuple[str, int]) -> str:
    """`value` bytes in `unit`, two decimals ("0" for none: a true zero, not a rounded one; bytes whole)."""
    name, size = unit
    if value == 0:
        return "0"
    return f"{value:,}" if size == 1 else f"{value / size:,.2f}"


# The stage table's columns: (key, header, legend words); master weights only where some stage holds them.
_STAGE_COLUMNS = (("weights", "weights", ""), ("gradients", "grads", "grads: gradients"),
                  ("optimizer", "optim", "optim: optimizer states"),
                  ("master_weights", "master", "master: the fp32 master weights"),
                  ("activations", "acts", "acts: activations saved"),
                  ("peak", "peak", ""))


def _stages_table(device) -> list:
    """One shape at any width and under any layout: a row a stage, every figure in the table's one binary unit
    (named in its header), the layers wrapping between runs; a column no stage has (master weights) left out. The
    title line, the table and its legend line (the two lines wrap to the width, not to the table's)."""
    stages = device.stages
    columns = [c for c in _STAGE_COLUMNS if c[0] != "master_weights" or any(s.master_weights for s in stages)]
    unit = table_unit([s.peak for s in stages])
    legend = "; ".join(filter(None, (words for _, _, words in columns)))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("stage", justify="right", no_wrap=True)
    table.add_column("layers", overflow="fold")
    table.add_column("in\nflight", justify="right", no_wrap=True)
    for _, header, _ in columns:
        table.add_column(f"{header}\n{unit[0]}", justify="right", no_wrap=True)
    for stage in stages:
        table.add_row(str(stage.rank), _stage_layers(stage), str(stage.in_flight),
                      *(in_unit(getattr(stage, key), unit) for key, _, _ in columns),
                      style="bold" if stage.peak == device.peak else None)
    return [Text(f"Pipeline stages: {device.pipeline}; bubble {100 * device.bubble:.1f}% of the step "
                 "((pp − 1) / (v·m + pp − 1))"), table,
            indented(f"{_unit_words(unit)}, one device of each stage; in flight: microbatches; {legend}; peak: the "
                     "stage's largest moment, not the columns' sum (bold: the largest); exact bytes in --json")]


def _unit_words(unit: tuple[str, int]) -> str:
    """"in GiB (2³⁰ B)": a table's unit, said once in its legend."""
    name = unit[0]
    return "in bytes" if name == "B" else f"in {name} ({UNIT_POWERS[name]} B)"


UNIT_POWERS = {"KiB": "2¹⁰", "MiB": "2²⁰", "GiB": "2³⁰", "TiB": "2⁴⁰"}


def _rules_table(device) -> Table:
    table = Table(title="How each role is cut (from its role; transformers' tp plans agree)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("role", no_wrap=True)
    table.add_column("rule", overflow="fold", ratio=1)
    for role, rule in device.rules.items():
        table.add_row(role, rule)
    return table


def _device_to_dict(device) -> dict[str, Any]:
    top = device.peak_figure
    return {"weights": device.weights, "gradients": device.gradients, "optimizer": device.optimizer,
            "master_weights": device.master_weights, "buffers": device.buffers, "activations": device.activations,
            "accumulation_buffer": device.accumulation_buffer,
            "activations_from": device.activations_from, "states_arithmetic": device.states_arithmetic,
            "communication": [{"name": b.name, "bytes": b.bytes, "arithmetic": b.arithmetic,
                               "moments": list(b.moments)} for b in device.comm],
            "phases": [{"phase": p.phase, "moment": p.where, "bytes": p.bytes, "gradients": p.gradients,
                        "arithmetic": p.arithmetic} for p in device.phases],
            "peak": {"bytes": top.bytes, "phase": top.phase, "moment": top.where, "arithmetic": _peak_sum(device)},
            "shown": _device_words(device),
            "rules": dict(device.rules),
            "pipeline": device.pipeline or None, "bubble": device.bubble,
            "stages": [{"stage": st.rank, "layers": list(st.layers) if st.layers else None,
                        "chunks": [list(c) for c in st.chunks],
                        "layer_count": st.layer_count, "in_flight": st.in_flight, "first": st.first, "last": st.last,
                        "weights": st.weights, "gradients": st.gradients, "optimizer": st.optimizer,
                        "master_weights": st.master_weights, "activations": st.activations, "peak": st.peak,
                        "peak_phase": st.peak_phase} for st in device.stages]}


# --- JSON ----------------------------------------------------------------------------------------------------------

def _term(term) -> dict[str, Any]:
    return {"bytes": term.bytes, "arithmetic": term.arithmetic}


def memory_to_dict(estimate) -> dict[str, Any]:
    weights, cache, training = estimate.weights, estimate.kv_cache, estimate.training
    return {
        "mode": estimate.mode,
        "engine": estimate.engine,
        "settings": thaw(estimate.settings),  # a FrozenDict, lists inside as tuples: plain data for json
        "weights": {
            "bytes": weights.bytes,
            "format": weights.format.key,
            "format_label": weights.format.label,
            "quantized_parameters": weights.quantized,
            "overhead_bytes": weights.overhead,
            "by_dtype": dict(weights.by_dtype),
            "by_role": dict(weights.by_role),
            "by_component": dict(weights.by_component),
        },
        "buffers": {"bytes": weights.buffer_bytes, "by_dtype": dict(weights.buffers_by_dtype)},
        "kv_cache": None if cache is None else {
            "bytes": cache.bytes,
            "bytes_per_token": cache.bytes_per_token,
            "layout": cache.layout,
            "dtype": cache.dtype,
            "groups": [{"kind": g.kind, "layers": g.layers, "tokens": g.tokens, "bytes_per_token": g.per_token,
                        "fixed_bytes_per_sequence": g.fixed, "bytes": g.bytes, "arithmetic": g.arithmetic}
                       for g in cache.groups],
            "convention": cache.convention,
        },
        "gradients": _term(training.states.gradients) if training else None,
        "optimizer": _term(training.states.optimizer) if training else None,
        "master_weights": _term(training.states.master_weights) if training else None,
        "activations": None if estimate.activations is None else {
            "bytes": estimate.activations.bytes, "arithmetic": estimate.activations.arithmetic,
            "what": "saved for backward" if training else "prefill workspace",
            **({"source": training.activation_source,
                "towers": [{"part": part, "module": path, "bytes": value} for part, path, value in training.towers]}
               if training else {})},
        "peak": {"bytes": estimate.peak, "phase": estimate.peak_phase},
        "phases": [{"phase": p.phase, "moment": p.where, "bytes": p.bytes, "gradients": p.gradients,
                    "arithmetic": p.arithmetic} for p in training.phases] if training else None,
        "traced": _traced_to_dict(estimate),
        "trainable_parameters": training.states.trainable if training else None,
        "frozen_parameters": training.states.frozen if training else None,
        "reserve": estimate.reserve,
        "per_device": dict(training.per_device) if training and training.per_device else
        _layout_per_device(training.device) if training and training.device is not None else None,
        "layout": _serving_layout_to_dict(estimate) if not training else None if training.device is None else {
            **{k: v for k, v in estimate.settings["layout"].items()}, "device": _device_to_dict(training.device)},
        "smallest_tp": None if training or estimate.parallel is None or estimate.parallel.smallest is None else
        _smallest_to_dict(estimate.parallel.smallest),
        "fits": [{"accelerator": f.accelerator.name, "memory": f.accelerator.memory, "fits": f.fits,
                  "free": f.free, "largest_batch": f.largest_batch, "largest_context": f.largest_context}
                 for f in estimate.fits],
        "budget": None if estimate.budget is None else _fit_to_dict(estimate.budget),
        "notes": list(estimate.notes),
        "check": check_to_dict(estimate.check),
    }


def _layout_per_device(device) -> dict[str, Any]:
    """Under a layout, `per_device` as under --devices/--zero: the device's shares and its peak, which `peak` is, so
    the schema's "peak is per device when per_device is set" holds (`layout.device` has the rest)."""
    top = device.peak_figure
    return {"weights": device.weights, "gradients": device.gradients, "optimizer": device.optimizer,
            "master_weights": device.master_weights, "activations": device.activations, "peak": top.bytes,
            "peak_phase": top.phase}


def _serving_layout_to_dict(estimate) -> dict[str, Any] | None:
    """Serving across GPUs: the layout, then each stage's GPU (rank 0 of its tensor-parallel group)."""
    layout = estimate.parallel.layout if estimate.parallel is not None else None
    if layout is None:
        return None

    def stage(s) -> dict[str, Any]:
        w, cache = s.weights, s.kv_cache
        return {"stage": s.rank, "layers": list(s.layers) if s.layers else None, "layer_count": s.layer_count,
                "first": s.first, "last": s.last,
                "weights": {"bytes": w.bytes, "overhead_bytes": w.overhead, "quantized_parameters": w.quantized,
                            "by_dtype": dict(w.by_dtype), "by_role": dict(w.by_role)},
                "buffers": w.buffer_bytes,
                "kv_cache": None if cache is None else {
                    "bytes": cache.bytes, "bytes_per_token": cache.bytes_per_token,
                    "groups": [{"kind": g.kind, "layers": g.layers, "tokens": g.tokens, "bytes_per_token": g.per_token,
                                "fixed_bytes_per_sequence": g.fixed, "bytes": g.bytes, "arithmetic": g.arithmetic}
                               for g in cache.groups]},
                "workspace": None if s.workspace is None else {"bytes": s.workspace.bytes,
                                                               "arithmetic": s.workspace.arithmetic},
                "correction": s.correction, "moe_gathered": s.gathered, "moe_workspace": s.experts_workspace,
                "peak": s.peak}

    return {"devices": layout.devices, "tp": layout.tp, "pp": layout.pp, "ep": layout.ep, "dp": layout.dp,
            "words": layout.words(),
            "kv_heads": layout.kv_heads, "workspace_from": layout.workspace_from, "pipeline": layout.pipeline or None,
            "rules": dict(layout.rules), "device": stage(layout.device),
            "moe_dispatch": None if layout.dispatch is None else layout.dispatch.arithmetic(
                estimate.settings["batch"], estimate.settings["seq"]),
            "moe_workspace": None if layout.experts_workspace is None else layout.experts_workspace.arithmetic(
                estimate.settings["batch"], estimate.settings["seq"]),
            "stages": [stage(s) for s in layout.stages]}


def _smallest_to_dict(smallest) -> dict[str, Any]:
    return {"accelerator": smallest.accelerator.name, "memory": smallest.accelerator.memory, "pp": smallest.pp,
            "batch": smallest.batch, "seq": smallest.seq, "tp": smallest.tp, "peak": smallest.peak,
            "dp": smallest.dp, "ep": smallest.expert_parallel, "dp_searched": smallest.dp_searched,
            "order": smallest.order_words(),
            "tried": [{"tp": t, "dp": d, "peak": peak, "refused": why or None} for (t, peak, why), d in
                      zip(smallest.tried, smallest.tried_dp or [smallest.dp] * len(smallest.tried))]}


def _fit_to_dict(fit) -> dict[str, Any]:
    return {"accelerator": fit.accelerator.name, "memory": fit.accelerator.memory, "fits": fit.fits, "free": fit.free,
            "largest_batch": fit.largest_batch, "largest_context": fit.largest_context}


def _traced_to_dict(estimate) -> dict[str, Any] | None:
    """The traced engine's figures: a full-depth trace's MemTracker breakdown, or the depth-extended trace's peak
    (its `by_category` and `activations_by_module` empty: the extension adds up allocations, not categories)."""
    training = estimate.training
    if not training or training.trace_depth is None:
        return None
    full = training.traced
    top = max(training.phases, key=lambda p: p.bytes)  # one device's, before any sharding, as a full trace's
    return {"peak": full.peak.bytes if full else top.bytes, "phase": full.peak.phase if full else top.phase,
            "depth": training.trace_depth,
            "by_category": dict(training.by_category), "analytic_peak": training.analytic_peak,
            "analytic_activations": training.analytic_activations,
            "activations_by_module": [{"module": path, "bytes": value}
                                      for path, value in (full.kept_by_module if full else ())]}
