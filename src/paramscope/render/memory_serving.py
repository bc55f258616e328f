"""`paramscope memory`'s serving tables: the totals, the KV cache, the weights by role and, across GPUs, one GPU's
figures, its pipeline stages and how each role is cut; the smallest tensor-parallel degree in one sentence. Pure
functions of their data."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from ..explain import exact
from ._console import indented
from .memory_cells import binary, in_unit, share, short_dtype, stage_layers, table_unit, unit_words
from .memory_layout import role_cuts_table


def serving_totals(estimate) -> Table:
    weights = estimate.weights
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    weight_rows(table, weights)
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


def weight_rows(table: Table, weights) -> None:
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


def gpu_table(estimate, layout) -> Table:
    device = layout.device
    where = f"stage {device.rank}'s tensor-parallel rank 0" if layout.pp > 1 else "tensor-parallel rank 0"
    table = Table(title=f"One GPU ({where}, the largest peak): {layout.words()}", title_justify="left",
                  caption=f"KV cache: {layout.kv_heads}; prefill workspace: {layout.workspace_from}",
                  caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    weight_rows(table, device.weights)
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


def serving_stages_table(layout) -> list:
    """As training's stage table (stages_table): its title line, a row a stage with the figures in the table's one
    unit, its legend line."""
    unit = table_unit([stage.peak for stage in layout.stages])
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("stage", justify="right", no_wrap=True)
    table.add_column("layers", overflow="fold")
    for name in ("weights", "KV cache", "workspace", "peak"):
        table.add_column(f"{name}\n{unit[0]}", justify="right", no_wrap=True)
    top = layout.device
    for stage in layout.stages:
        table.add_row(str(stage.rank), stage_layers(stage), in_unit(stage.weight_bytes, unit),
                      in_unit(stage.kv_cache.bytes, unit) if stage.kv_cache is not None else "—",
                      in_unit(stage.workspace.bytes, unit) if stage.workspace is not None else "—",
                      in_unit(stage.peak, unit), style="bold" if stage is top else None)
    return [Text(f"Pipeline stages: {layout.pipeline}"), table,
            indented(f"{unit_words(unit)}, each GPU of a stage's tensor-parallel group alike (rank 0's shares); —: "
                     "none on the stage; exact bytes in --json")]


def serving_rules_table(layout) -> Table:
    return role_cuts_table(layout.rules, f"How each role is cut over tp {layout.tp}",
                           "from each parameter's role, the rules training layouts use (transformers' tp plans agree)")


def cache_table(cache) -> Table:
    table = Table(title=f"KV cache, {cache.layout} layout, {short_dtype(cache.dtype)}: batch {cache.batch:,} × "
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


def roles_table(weights, limit: int = 12) -> Table:
    table = Table(title="Weights by role", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("role", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    rows = sorted(weights.by_role.items(), key=lambda kv: -kv[1])
    for role, value in rows[:limit]:
        table.add_row(role, exact(value), binary(value), share(value, weights.bytes))
    if len(rows) > limit:
        rest = sum(v for _, v in rows[limit:])
        table.add_row(f"{len(rows) - limit} more roles", exact(rest), binary(rest), share(rest, weights.bytes))
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
