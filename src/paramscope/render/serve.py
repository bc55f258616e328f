"""`paramscope serve`: a ServeSpeed → text (rich, at a width), → the JSON "serve" object, → the HTML page.

Pure functions of their data. Bytes and FLOPs are exact integers; times and rates are bounds, and say so.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from ._console import indented, model_source_line, to_text


def _time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:,.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:,.3g} ms"
    return f"{seconds * 1e6:,.3g} µs"


def _bytes(value: int) -> str:
    from .memory import binary

    return binary(value)


def render_serve_text(report: Any, speed: Any, width: int = 100, *, color: bool = False) -> str:
    return to_text(serve_parts(report, speed), width, color)


def serve_parts(report: Any, speed: Any) -> list:
    roof = speed.roofline
    parts: list = [Text(f"Serving speed of {report.model.label} ({report.model.class_name}) on {roof.gpu}: roofline "
                        "bounds", style="bold")]
    source = model_source_line(report.model)
    if source is not None:
        parts.append(source)
    per_gpu = f"; tensor parallel over {speed.tp} GPUs: one GPU's bytes and FLOPs" if speed.tp > 1 else ""
    parts.append(indented(f"{roof.words()}; weights {speed.dtype}, KV cache {speed.kv_dtype} ({speed.kv_layout})"
                          f"{per_gpu}; no communication modelled"))
    table = Table(box=box.SIMPLE_HEAD, title=f"Decode at context {speed.context:,} (bounds)", title_justify="left")
    for column, justify in (("batch", "right"), ("bytes/step", "right"), ("FLOPs/step", "right"),
                            ("memory", "right"), ("compute", "right"), ("tokens/s ≤", "right"),
                            ("per seq. ≤", "right"), ("binds", "left")):
        table.add_column(column, justify=justify, no_wrap=True)
    checked = any(step.fits is not None for step in speed.decode)
    if checked:  # weights + KV cache held at the row's batch × context against the GPU's memory
        table.add_column("fits", no_wrap=True)
    for step in speed.decode:
        cells = [f"{step.batch:,}", _bytes(step.bytes), f"{step.flops:.3e}".replace("e+", "e"),
                 _time(step.memory_seconds), _time(step.compute_seconds), f"{step.tokens_per_second:,.1f}",
                 f"{step.per_sequence:,.1f}", step.binds]
        if checked:
            cells.append("yes" if step.fits else "NO")
        table.add_row(*cells, style="bold" if step.batch == speed.batch else None)
    parts.append(table)
    if fit_words(speed) is not None:
        parts.append(indented(fit_words(speed)))
    prefill = speed.prefill
    parts.append(indented(f"Prefill: time to first token ≥ {_time(prefill.seconds)} ({prefill.binds}-bound): a "
                          f"prefill of {speed.batch} × {speed.prompt:,} tokens, {prefill.bytes:,} B "
                          f"({_bytes(prefill.bytes)}) over "
                          f"bandwidth = {_time(prefill.memory_seconds)}, {prefill.flops:,} FLOPs over peak = "
                          f"{_time(prefill.compute_seconds)}"
                          + ("; does not fit the GPU's memory (see Notes)" if prefill.fits is False else "")))
    parts.append(indented("Crossover: " + crossover_words(speed)))
    arithmetic = Table(box=None, show_header=False, pad_edge=False, title="How it adds up (batch "
                       f"{speed.batch}, context {speed.context:,})", title_justify="left")
    arithmetic.add_column(style="bold", no_wrap=True)
    arithmetic.add_column()
    for label, words in speed.arithmetic:
        arithmetic.add_row(label, words)
    parts.append(arithmetic)
    parts.append(Text("Conventions", style="bold"))
    parts.extend(indented("• " + words) for words in speed.conventions)
    if speed.notes:
        parts.append(Text("Notes", style="bold"))
        parts.extend(indented("• " + words) for words in speed.notes)
    return parts


def fit_words(speed: Any) -> str | None:
    """The line under the decode table (text and HTML) where a row's weights + KV cache exceed the GPU's memory."""
    if not any(step.fits is False for step in speed.decode):
        return None
    return (f"fits NO: the weights and the KV cache at that batch × context exceed one {speed.roofline.gpu}'s "
            f"{speed.roofline.memory:,} B; those rows' bounds are not achievable there (see Notes)")


def crossover_words(speed: Any) -> str:
    """Where decode turns compute-bound at the context, or why it does not."""
    if speed.crossover is not None:
        return (f"decode turns compute-bound at batch {speed.crossover:,} and above (context {speed.context:,}, "
                f"{speed.roofline.peak_dtype} peak)")
    step = speed.decode[-1]
    return (f"decode stays memory-bound at context {speed.context:,} up to batch 2^20: each sequence's KV cache "
            f"traffic ({_time(step.kv_bytes / step.batch / speed.roofline.bandwidth)} a step) outlasts its FLOPs "
            f"({_time(step.flops / step.batch / speed.roofline.peak)}), so a larger batch never catches up")


def _step_dict(step: Any) -> dict[str, Any]:
    found = {"batch": step.batch, "tokens": step.tokens, "weight_bytes": step.weight_bytes,
             "kv_bytes": step.kv_bytes, "bytes": step.bytes, "flops": step.flops,
             "memory_seconds": step.memory_seconds, "compute_seconds": step.compute_seconds,
             "seconds": step.seconds, "binds": step.binds}
    if step.experts_touched is not None:
        found["experts_touched"] = step.experts_touched
    if step.fits is not None:
        found["held_bytes"], found["fits"] = step.held_bytes, step.fits
    return found


def serve_to_dict(speed: Any) -> dict[str, Any]:
    """The JSON "serve" object (docs/json-schema.md)."""
    roof = speed.roofline

    def decode(step: Any) -> dict[str, Any]:
        return {**_step_dict(step), "context": step.tokens, "tokens_per_second": step.tokens_per_second,
                "per_sequence": step.per_sequence}

    return {
        "kind": "bound",
        "gpu": {"name": roof.gpu, "bandwidth": roof.bandwidth, "peak_flops": roof.peak,
                "peak_dtype": roof.peak_dtype, "peak_from": roof.peak_from, "memory": roof.memory},
        "settings": {"dtype": speed.dtype, "kv_dtype": speed.kv_dtype, "kv_layout": speed.kv_layout,
                     "batch": speed.batch, "context": speed.context, "prompt": speed.prompt, "tp": speed.tp},
        "routing": None if speed.routing is None else {"top_k": speed.routing[0], "experts": speed.routing[1]},
        "decode": [decode(step) for step in speed.decode],
        "prefill": {**_step_dict(speed.prefill), "prompt": speed.prefill.tokens},
        "crossover_batch": speed.crossover,
        "by_batch": [decode(step) for step in speed.by_batch],
        "by_context": [decode(step) for step in speed.by_context],
        "arithmetic": [{"what": label, "how": words} for label, words in speed.arithmetic],
        "conventions": list(speed.conventions),
        "notes": list(speed.notes),
    }


def render_serve_html(report: Any, speed: Any, *, fragment: bool = False) -> str:
    """The bounds, the decode table, and tokens/s against batch (at the context) and against context (at the
    batch), each curve with its memory-bound and compute-bound limits."""
    from .html.page import Section, escape, figure, html_page, notes_section, subtitle

    roof = speed.roofline
    rows = [("GPU", roof.words()), ("weights", speed.dtype), ("KV cache", f"{speed.kv_dtype} ({speed.kv_layout})"),
            ("decode", f"batch {speed.batch}, context {speed.context:,}: ≤ {speed.at_batch.tokens_per_second:,.1f} "
                       f"tokens/s ({speed.at_batch.binds}-bound)" + _unfit(speed.at_batch, roof)),
            ("time to first token", f"≥ {_time(speed.prefill.seconds)} ({speed.prefill.binds}-bound), "
                                    f"{speed.batch} × {speed.prompt:,} tokens" + _unfit(speed.prefill, roof)),
            ("crossover", crossover_words(speed))]
    rows += list(speed.arithmetic)
    table = "".join(f"<tr><th>{escape(name)}</th><td>{escape(value)}</td></tr>" for name, value in rows)
    sections = [Section("Bounds", f'<table class="totals" id="serve-bounds">{table}</table>'),
                Section(f"Decode at context {speed.context:,}", _decode_table(speed, escape)),
                Section("Against batch", figure(_curve(speed.by_batch, "batch", f"batch (sequences), context "
                                                       f"{speed.context:,}", roof), "line-batch")),
                Section("Against context", figure(_curve(speed.by_context, "context", f"context (keys a step reads), "
                                                         f"batch {speed.batch}", roof), "line-context")),
                Section("Conventions", "".join(f"<p>{escape(words)}</p>" for words in speed.conventions))]
    if speed.notes:
        sections.append(notes_section(speed.notes))
    settings = f"{speed.dtype} weights · KV {speed.kv_dtype} · roofline bounds" + (
        f" · one GPU of tp {speed.tp}" if speed.tp > 1 else "")
    return html_page(f"{report.model.label}: serving speed on {roof.gpu} (bounds)",
                     f"{subtitle(report)} · {settings}", sections, fragment)


def serve_page(speed: Any, fragment: bool) -> str:
    """`ServeSpeed.to_html` and its notebook display (display.py): the page `serve --html` writes, from the bounds'
    own report (`estimate_serving` attaches it)."""
    if speed.report is None:
        raise TypeError("these bounds carry no report to title their page: estimate_serving attaches one")
    return render_serve_html(speed.report, speed, fragment=fragment)


def _unfit(step: Any, roof: Any) -> str:
    """The bounds row's words where its weights + KV cache exceed the GPU's memory (None: not checked)."""
    return (f"; does not fit one GPU: {step.held_bytes:,} B held > {roof.memory:,} B (see Notes)"
            if step.fits is False else "")


def _decode_table(speed: Any, escape: Any) -> str:
    """The text's decode table: each batch's bytes, FLOPs and bounds, and whether its weights + KV cache fit the
    GPU (data-fits on the row; the column only where the memory was checked), then the text's line on the NOs."""
    checked = any(step.fits is not None for step in speed.decode)
    head = "".join(f"<th>{escape(name)}</th>" for name in ("batch", "bytes/step", "FLOPs/step", "tokens/s ≤",
                                                            "per seq. ≤", "binds") + (("fits",) if checked else ()))
    rows = []
    for step in speed.decode:
        cells = [f"{step.batch:,}", f"{step.bytes:,} B", f"{step.flops:.3e}".replace("e+", "e"),
                 f"{step.tokens_per_second:,.1f}", f"{step.per_sequence:,.1f}"]
        row = "".join(f'<td class="num">{cell}</td>' for cell in cells) + f"<td>{escape(step.binds)}</td>"
        if checked:
            row += f'<td class="fits">{"yes" if step.fits else "NO"}</td>'
        fits = "" if step.fits is None else f' data-fits="{str(step.fits).lower()}"'
        weight = ' style="font-weight:600"' if step.batch == speed.batch else ""
        rows.append(f'<tr data-batch="{step.batch}"{fits}{weight}>{row}</tr>')
    note = fit_words(speed)
    note = f'<p class="dim" id="serve-fit-note">{escape(note)}</p>' if note is not None else ""
    return f'<div class="scroll"><table id="serve-decode"><tr>{head}</tr>{"".join(rows)}</table></div>{note}'


def _curve(steps: Any, axis: str, title: str, roof: Any) -> dict:
    """tokens/s ≤ against `axis`, with each side's own limit: the memory side's B / (bytes / bandwidth) and the
    compute side's B / (FLOPs / peak); the bound is the lower of the two at every point."""
    from .html.page import FONT, LEGEND_ABOVE

    x = [step.batch if axis == "batch" else step.tokens for step in steps]

    def line(name: str, values: list[float], color: str, dash: str = "solid") -> dict:
        return {"type": "scatter", "mode": "lines+markers" if dash == "solid" else "lines", "name": name, "x": x,
                "y": values, "line": {"color": color, "dash": dash},
                "customdata": [[step.bytes, step.flops, step.binds] for step in steps],
                "hovertemplate": f"{name}<br>{axis} %{{x:,}}: %{{y:,.1f}} tokens/s<br>%{{customdata[0]:,}} B, "
                                 "%{customdata[1]:,} FLOPs a step (%{customdata[2]}-bound)<extra></extra>"}

    traces = [line("tokens/s bound", [step.tokens_per_second for step in steps], "#4e79a7"),
              line("memory side (bytes / bandwidth)", [step.batch / step.memory_seconds for step in steps],
                   "#59a14f", "dot"),
              line(f"compute side (FLOPs / {roof.peak_dtype} peak)",
                   [step.batch / step.compute_seconds for step in steps], "#e15759", "dot")]
    unfit = [(point, step) for point, step in zip(x, steps) if step.fits is False]
    if unfit:  # the bound's points whose weights + KV cache exceed the GPU's memory: bounds, not achievable there
        traces.append({"type": "scatter", "mode": "markers", "name": "does not fit one GPU",
                       "x": [point for point, _ in unfit], "y": [step.tokens_per_second for _, step in unfit],
                       "marker": {"symbol": "x", "size": 11, "color": "#b07aa1"},
                       "customdata": [step.held_bytes for _, step in unfit],
                       "hovertemplate": f"does not fit one GPU<br>{axis} %{{x:,}}: weights + KV cache "
                                        f"%{{customdata:,}} B > {roof.memory:,} B<extra></extra>"})
    layout = {"height": 420, "margin": {"t": 40, "l": 10, "r": 10, "b": 50},
              "xaxis": {"title": {"text": title}, "type": "log"},
              "yaxis": {"title": {"text": "decode tokens/s (bound)"}, "type": "log", "automargin": True},
              "legend": LEGEND_ABOVE, "font": FONT}
    return {"data": traces, "layout": layout}


__all__ = ["render_serve_text", "serve_to_dict", "render_serve_html", "serve_page", "crossover_words", "fit_words"]
