"""`paramscope serve`: roofline bounds on decode and prefill, their bytes and FLOPs derived by hand here."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from paramscope.cli import main
from paramscope.cost.speed.answer import ServeOptions, serve_answer
from paramscope.cost.speed.roofline import experts_touched
from test_html import _Page, browser  # noqa: F401  (browser: the module's Chromium, one launch)

H100_BANDWIDTH = 3350e9  # B/s, H100 SXM datasheet
H100_BF16 = 989.4e12  # FLOP/s, dense


@pytest.fixture(scope="module")
def llama():
    return serve_answer("llama-3-8b", ServeOptions(gpu="h100", batch=1, seq=1024, context=1024))[1]


def test_llama_3_8b_decode_step_by_hand(llama):
    h, layers, kv, head_dim, ffn, vocab = 4096, 32, 8, 128, 14336, 128_256
    matmul_per_layer = 2 * h * h + 2 * h * kv * head_dim + 3 * h * ffn  # q, o; k, v; gate, up, down
    # every weight read once in bf16, the untied embedding a gather of one row (batch 1)
    weights = 2 * (layers * (matmul_per_layer + 2 * h) + h + vocab * h) + 2 * h
    assert weights == 15_009_857_536
    per_token = layers * 2 * kv * head_dim * 2  # K and V, 8 heads × 128, bf16
    kv_bytes = per_token * (1024 + 1)  # 1,024 keys read, the new token's K and V written
    assert kv_bytes == 134_348_800
    # generate()'s step: 2 FLOPs a weight a token meets, and 2·heads·(d_k + d_v) per key and layer
    flops = 2 * (layers * matmul_per_layer + vocab * h) + layers * 2 * 32 * (head_dim + head_dim) * 1024
    assert flops == 15_546_187_776
    step = llama.at_batch
    assert (step.batch, step.tokens, step.weight_bytes, step.kv_bytes, step.flops) == (1, 1024, weights, kv_bytes,
                                                                                       flops)
    assert llama.roofline.bandwidth == H100_BANDWIDTH and llama.roofline.peak == H100_BF16
    memory, compute = (weights + kv_bytes) / H100_BANDWIDTH, flops / H100_BF16
    assert step.binds == "memory" and step.memory_seconds == memory and step.compute_seconds == compute
    assert step.tokens_per_second == 1 / memory
    assert round(step.tokens_per_second, 1) == 221.2
    # at batch 8: eight rows gathered, eight sequences' KV, eight tokens' FLOPs
    eight = next(s for s in llama.decode if s.batch == 8)
    assert (eight.weight_bytes, eight.kv_bytes, eight.flops) == (weights + 7 * 2 * h, 8 * kv_bytes, 8 * flops)
    assert [s.batch for s in llama.decode] == [1, 8, 32, 128]


def test_llama_crossover_and_prefill(llama):
    # each sequence's KV traffic (134 MB a step) outlasts its FLOPs at 1,024 keys: never compute-bound
    assert llama.crossover is None
    assert all(s.binds == "memory" for s in llama.by_batch)
    prefill = llama.prefill
    assert prefill.kv_bytes == 131_072 * 1024
    assert prefill.binds == "compute" and prefill.seconds == prefill.flops / H100_BF16
    short = serve_answer("llama-3-8b", ServeOptions(gpu="h100", batch=1, seq=128, context=128))[1]
    crossover = short.crossover
    assert crossover is not None
    below = [s for s in short.by_batch if s.batch < crossover]
    at = next(s for s in short.by_batch if s.batch == crossover)
    assert at.binds == "compute" and below and all(s.binds == "memory" for s in below)
    assert [s.tokens for s in short.by_context][:2] == [128, 256] and short.by_context[0].batch == 1


def test_experts_touched_is_exact():
    assert experts_touched(2, 8, 1) == 2
    assert experts_touched(2, 8, 8) == 8 * (1 - Fraction(3, 4) ** 8) == Fraction(58975, 8192)
    assert experts_touched(8, 256, 100_000) == 256  # (1 − 1/32)^100,000 is below any byte
    assert experts_touched(8, 8, 3) == 8


def test_mixtral_reads_the_expected_active_experts():
    speed = serve_answer("mixtral-8x7b", ServeOptions(gpu="h100", batch=8, seq=512, context=512))[1]
    h, layers, kv, ffn, vocab, experts = 4096, 32, 8, 14336, 32_000, 8
    attention = 2 * h * h + 2 * h * kv * 128
    whole = 2 * (layers * (attention + 2 * h + experts * h) + h + vocab * h)  # + routers, norms, head
    routed = 2 * layers * experts * 3 * h * ffn
    assert routed == 90_194_313_216
    one = next(s for s in speed.decode if s.batch == 1)
    assert one.weight_bytes == whole + 2 * h + routed * 2 // 8  # top-2 of 8: a quarter of the experts
    assert one.experts_touched == 2
    eight = speed.at_batch
    share = Fraction(58975, 65536)  # 8·(1 − (3/4)^8) / 8
    assert routed * share == int(routed * share)
    assert eight.weight_bytes == whole + 8 * 2 * h + routed * share
    assert eight.experts_touched == float(Fraction(58975, 8192))
    assert speed.routing == (2, 8)
    assert any("E·(1 − (1 − k/E)^T)" in words for words in speed.conventions)
    # 93,405,585,408 B of bf16 weights exceed the H100's 80 GiB at every row: said, the bounds kept
    held = 2 * 46_702_792_704
    assert speed.roofline.memory == 80 * 2**30 == 85_899_345_920
    assert [(s.held_bytes, s.fits) for s in speed.decode] == [(held + b * 131_072 * 512, False)
                                                               for b in (1, 8, 32, 128)]
    assert speed.notes[0].startswith(f"does not fit one H100 80GB: weights {held:,} B + KV cache 67,108,864 B "
                                     "(batch 1 × 512 tokens) = 93,472,694,272 B > 85,899,345,920 B (decode at batch "
                                     "1, 8, 32, 128, context 512; the prefill of 8 × 512 tokens;")
    # where the asked batch does not fit, memory's smallest layout at it (its own peak, + reserve): a MoE model's
    # search is over tp × dp, named so (memory --gpu h100 --batch 8 --seq 512: tp 2 × dp 1, this peak)
    assert speed.notes[0].endswith("`memory`'s smallest layout that fits at batch 8 × 512 tokens, a replica's batch "
                                   "(its peak, a prefill of all 512 tokens included, + 1,073,741,824 B reserve) "
                                   "(tried tp × dp by GPUs, fewer replicas first at equal GPUs, dp in powers of two, "
                                   "the experts cut over tp × dp): tp 2 = 2 GPUs, 47,644,258,880 B a GPU")


def test_deepseek_v3_reads_the_mla_latent():
    speed = serve_answer("deepseek-v3", ServeOptions(gpu="h100", batch=1, seq=1024, context=1024))[1]
    per_token = 61 * (512 + 64) * 2  # 61 layers × (kv_lora_rank + qk_rope_head_dim) in bf16
    assert speed.kv_layout == "latent"
    assert speed.at_batch.kv_bytes == per_token * 1025
    assert speed.roofline.peak_dtype == "fp8"  # the checkpoint is fp8: W8A8 matmuls
    one = speed.at_batch
    assert one.experts_touched == 8  # top-8 of 256


def test_cli_json_and_bad_input(capsys):
    assert main(["serve", "llama-3-8b", "--gpu", "h100", "--seq", "1024", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    serve = document["serve"]
    assert document["schema_version"] and serve["kind"] == "bound"
    first = serve["decode"][0]
    assert (first["batch"], first["context"], first["bytes"], first["flops"], first["binds"]) == \
        (1, 1024, 15_144_206_336, 15_546_187_776, "memory")
    assert serve["gpu"]["bandwidth"] == H100_BANDWIDTH and serve["crossover_batch"] is None
    # held: every weight (the whole embedding table) and the KV cache of 1,024 tokens, against 80 GiB
    assert (first["held_bytes"], first["fits"], serve["gpu"]["memory"]) == (16_060_522_496 + 131_072 * 1024, True,
                                                                          85_899_345_920)
    for argv, bad in ((["--batch", "0"], "--batch"), (["--gpu", "h900"], "h900"), (["--context", "1"], "--context"),
                      (["--context", "512", "--seq", "1024"], "--context")):
        gpu = [] if "--gpu" in argv else ["--gpu", "h100"]
        assert main(["serve", "llama-3-8b", *gpu, *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and bad in err and "Traceback" not in err


def test_tensor_parallel_is_one_gpus_share(llama):
    """Llama-3-8B over tp 2: every matmul column- or row-cut and the 8 KV heads split 4 a rank, so one GPU's FLOPs
    are exactly half; its weights are half less the norms, which every rank keeps whole."""
    speed = serve_answer("llama-3-8b", ServeOptions(gpu="h100", batch=1, seq=1024, context=1024, tp=2))[1]
    one, whole = speed.at_batch, llama.at_batch
    assert speed.tp == 2 and one.flops * 2 == whole.flops == 15_546_187_776
    norms = 2 * (32 * 2 * 4096 + 4096)  # bf16, replicated
    assert one.weight_bytes == (whole.weight_bytes - 2 * 4096 - norms) // 2 + norms + 2 * 4096  # one embedding row
    assert one.kv_bytes * 2 == whole.kv_bytes
    assert any("no communication is modelled" in note for note in speed.notes)


def test_html_curves_in_chromium(browser, tmp_path, llama):
    """The page's two curves are the JSON's by_batch and by_context points, tokens/s against batch and context; it
    loads with no error and no request beyond itself."""
    from paramscope.api import inspect
    from paramscope.render.serve import render_serve_html, serve_to_dict

    path = tmp_path / "serve.html"
    path.write_text(render_serve_html(inspect("llama-3-8b"), llama), "utf-8")
    page = _Page(browser, path)
    assert page.errors == [] and page.requests == [page.url]
    document = serve_to_dict(llama)
    for div, key, axis in (("line-batch", "by_batch", "batch"), ("line-context", "by_context", "context")):
        traces = page.page.evaluate("id => document.getElementById(id).data.map(t => [t.name, t.x, t.y])", div)
        name, x, y = traces[0]
        assert name == "tokens/s bound"
        assert x == [point[axis] for point in document[key]]
        assert y == pytest.approx([point["tokens_per_second"] for point in document[key]], rel=1e-12)
        assert [t[0] for t in traces[1:]] == ["memory side (bytes / bandwidth)", "compute side (FLOPs / bf16 peak)"]
    assert "crossover" in page.page.inner_text("#serve-bounds")
    fits = page.page.eval_on_selector_all("#serve-decode tr[data-batch]", "rows => rows.map(r => r.dataset.fits)")
    assert fits == ["true"] * len(document["decode"]) and page.page.query_selector("#serve-fit-note") is None
    page.page.close()


def test_html_marks_what_does_not_fit(browser, tmp_path):
    """Mixtral-8x7B's 93,405,585,408 B of bf16 weights exceed an H100's 85,899,345,920 B: every decode row and every
    point of both curves is marked, exactly the JSON's fits false points, and the legend names the mark."""
    from paramscope.render.serve import render_serve_html, serve_to_dict

    report, speed, _ = serve_answer("mixtral-8x7b", ServeOptions(gpu="h100"))
    document = serve_to_dict(speed)
    path = tmp_path / "serve.html"
    path.write_text(render_serve_html(report, speed), "utf-8")
    page = _Page(browser, path)
    assert page.errors == [] and page.requests == [page.url]
    rows = page.page.eval_on_selector_all("#serve-decode tr[data-batch]",
                                          "rows => rows.map(r => [r.dataset.fits, r.lastElementChild.innerText])")
    assert rows == [["true", "yes"] if point["fits"] else ["false", "NO"] for point in document["decode"]]
    assert [point["fits"] for point in document["decode"]] == [False] * 4
    assert page.page.inner_text("#serve-fit-note") == (
        "fits NO: the weights and the KV cache at that batch × context exceed one H100 80GB's 85,899,345,920 B; those "
        "rows' bounds are not achievable there (see Notes)")
    for div, key, axis in (("line-batch", "by_batch", "batch"), ("line-context", "by_context", "context")):
        marked = page.page.evaluate("id => document.getElementById(id).data.filter(t => t.name === "
                                    "'does not fit one GPU').map(t => [t.x, t.customdata])", div)
        legend = page.page.eval_on_selector_all(f"#{div} .legendtext", "items => items.map(i => i.textContent)")
        points = [point for point in document[key] if point["fits"] is False]
        assert len(points) == len(document[key]) == 9
        assert marked == [[[point[axis] for point in points], [point["held_bytes"] for point in points]]]
        assert "does not fit one GPU" in legend
    bounds = page.page.inner_text("#serve-bounds")
    assert "does not fit one GPU: 93,674,020,864 B held > 85,899,345,920 B" in bounds  # decode and prefill rows
    page.page.close()


def test_html_marks_only_the_points_that_do_not_fit():
    """Llama-3-8B at 100,000 keys on an H100 fits at batch 1 only: the batch curve's points from 8 up are marked and
    the context curve (batch 1) not at all; the decode table's rows 8, 32, 128 say NO."""
    from paramscope.render.serve import render_serve_html

    report, speed, _ = serve_answer("llama-3-8b", ServeOptions(gpu="h100", context=100_000))
    page = render_serve_html(report, speed)
    assert page.count('"name":"does not fit one GPU"') == 1
    assert '"name":"does not fit one GPU","x":[8,16,32,64,128,256],' in page
    assert [page.count(f'<tr data-batch="{batch}" data-fits="{fits}"') for batch, fits in
            ((1, "true"), (8, "false"), (32, "false"), (128, "false"))] == [1, 1, 1, 1]
    assert 'id="serve-fit-note"' in page


def test_gemma_2_sliding_layers_read_their_window():
    """Gemma-2-9B alternates 21 sliding (4,096) and 21 full layers; its config is float32, so K and V are 4 B."""
    speed = serve_answer("gemma-2-9b", ServeOptions(gpu="h100", batch=2, seq=1024, context=8192))[1]
    per_token = 21 * 2 * 8 * 256 * 4  # 21 layers of a kind × K and V × 8 kv heads × 256 × fp32
    step = speed.at_batch
    assert step.kv_bytes == 2 * per_token * ((4096 + 1) + (8192 + 1)) == 8_457_093_120
    assert speed.roofline.peak_dtype == "tf32"


# --- recurrent and hybrid models: Mamba mixers (flops/recurrent_decode.py) -------------------------------------

_TINY_MAMBA = dict(model_type="mamba", architectures=["MambaForCausalLM"], vocab_size=100, hidden_size=64,
                   state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4, time_step_rank=8)
_TINY_JAMBA = dict(model_type="jamba", architectures=["JambaForCausalLM"], vocab_size=100, hidden_size=64,
                   intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   mamba_d_state=8, mamba_d_conv=3, mamba_expand=2, mamba_dt_rank=8, attn_layer_period=2,
                   attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=4,
                   num_experts_per_tok=2)

_TINY_FALCON_H1 = dict(model_type="falcon_h1", architectures=["FalconH1ForCausalLM"], vocab_size=100, hidden_size=64,
                       intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2,
                       mamba_d_state=4, mamba_d_conv=3, mamba_chunk_size=8)


def _meta_build(config: dict):
    import torch
    import transformers

    made = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(made)


@pytest.mark.parametrize("config, batch, seq, counts", [
    # tiny Mamba (I 128, K 4, N 8, 2 layers, tied head 100 × 64): a step is 2·B·(linears 57,344 + head 6,400)
    # + 2 × 2·B·I·(K·2 + N) = 127,488·B + 8,192·B, whatever the context (causal_conv1d_update: 2 outputs)
    (_TINY_MAMBA, 1, 5, (623_104, 135_680, 135_680)),
    (_TINY_MAMBA, 2, 9, (2_212_864, 271_360, 271_360)),
    # tiny Jamba (a Mamba layer with K 3 and a dense MLP, then an attention layer with top-2-of-4 experts): a step
    # is 2·B·(mamba 28,672 + MLP 18,432 + attention 12,288 + router 256 + experts 73,728 × 2/4 + head 6,400)
    # = 205,824·B, + the attention's 2·B·4·(16 + 16) = 256·B a key,
    # + the Mamba layer's 2·B·128·(3·2 + 8) = 3,584·B
    (_TINY_JAMBA, 1, 5, (999_936, 205_824 + 256 * 6 + 3_584, 205_824 + 256 * 7 + 3_584)),
    (_TINY_JAMBA, 2, 9, (3_595_264, 423_936, 424_448)),
    # tiny Falcon-H1 (two layers, attention beside a Mamba-2 mixer: H 8, P 16, N 4, G 2, conv 144 × K 3, Q 8): each
    # mixer adds 2·B·(144·3·2 + 8·16·4) = 2,752·B a step; its prefill at S 9 (2 chunks) 2·B·144·3·11 +
    # B·(2·2·8²·8·20 + 4·2·8·8·4·16 + 2·8·3²·16·4)
    (_TINY_FALCON_H1, 2, 9, (4_570_240, 501_504, 502_528)),
], ids=["mamba-B1", "mamba-B2", "jamba-B1", "jamba-B2", "falcon-h1-B2"])
def test_mamba_decode_flops_equal_flopcountermode(config, batch, seq, counts):
    """generate()'s prefill and two decode steps of a tiny real class, FlopCounterMode's count (matmuls and
    convolutions) against the analytic one."""
    from paramscope.api import inspect_module
    from paramscope.cost.flops.generation import analytic_generation
    from paramscope.cost.flops.recurrent_decode import recurrent_flops
    from paramscope.cost.model_view import from_module
    from paramscope.cost.traced.flops import count_generation

    module = _meta_build(config)
    traced = count_generation(module, batch, seq, 2)
    analytic = analytic_generation(from_module(module), inspect_module(module).params, batch=batch, seq=seq,
                                   new_tokens=3)
    assert (traced.prefill, *traced.steps) == (analytic.prefill, analytic.first_step, analytic.last_step) == counts
    mixers = recurrent_flops(from_module(module), module.config)
    per_sequence = {"mamba": 2 * 4_096, "jamba": 3_584, "falcon_h1": 2 * 2_752}[config["model_type"]]
    assert mixers.step(batch) == per_sequence * batch


def test_mamba_130m_serves_by_hand():
    """state-spaces/mamba-130m at full size, bf16: hidden 768, I 1,536, N 16, K 4, dt rank 48, 24 layers, vocabulary
    50,280 tied. A decode step reads every weight and each layer's state; its FLOPs do not grow with the context."""
    h, inner, state, kernel, rank, layers, vocab = 768, 1536, 16, 4, 48, 24, 50_280
    config = dict(model_type="mamba", architectures=["MambaForCausalLM"], vocab_size=vocab, hidden_size=h,
                  state_size=state, num_hidden_layers=layers, expand=2, conv_kernel=kernel, tie_word_embeddings=True)
    speed = serve_answer(config, ServeOptions(gpu="h100", batch=4, seq=2048, context=2048, dtype="bf16"))[1]
    linears = h * 2 * inner + inner * (rank + 2 * state) + rank * inner + inner * h  # in, x, dt, out projections
    per_layer = linears + inner * kernel + inner + inner + inner * state + inner + h  # conv w/b, dt b, A_log, D, norm
    weights = 2 * (layers * per_layer + vocab * h + h)
    assert weights == 258_270_720
    states = layers * (inner * kernel * 2 + inner * state * 4)  # conv state bf16, ssm state fp32
    flops = 2 * (layers * linears + vocab * h) + layers * 2 * inner * (kernel * 2 + state)
    assert (states, flops) == (2_654_208, 258_306_048)
    step = speed.at_batch
    assert (step.weight_bytes, step.kv_bytes, step.flops) == (weights, 4 * 2 * states, 4 * flops)
    assert [s.flops for s in speed.by_context] == [4 * flops] * len(speed.by_context)  # the same at any context
    assert step.binds == "memory" and speed.crossover is None
    assert any("recurrent layers" in note and "FlopCounterMode's convention" in note for note in speed.notes)


def test_unformulated_recurrent_layers_are_refused_in_one_line(capsys, tmp_path):
    # MiniMax: lightning attention, held against no formula here, so no decode FLOPs are drawn for it
    config = dict(model_type="minimax", architectures=["MiniMaxForCausalLM"], vocab_size=100, hidden_size=64,
                  intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                  layer_types=["linear_attention", "full_attention"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), "utf-8")
    assert main(["serve", str(path), "--gpu", "h100", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "MiniMaxForCausalLM" in err and "minimax" in err and "Traceback" not in err


@pytest.mark.parametrize("command, offered", [
    (["serve", "gpt2"], None),  # serve needs the card's bandwidth: no option stands in for it
    (["flops", "gpt2"], "(or give --peak-tflops X, the peak in TFLOP/s)"),
    (["memory", "gpt2"], "(or give --budget 24GiB)"),
])
def test_an_unknown_gpu_offers_only_an_option_the_command_takes(command, offered, capsys):
    assert main([*command, "--gpu", "h999"]) == 2
    error = capsys.readouterr().err
    assert "unknown accelerator 'h999'" in error
    assert (offered in error) if offered else "or give" not in error


def test_a_shorter_context_shortens_the_default_prompt():
    """A decode step at context C follows a prompt of at most C tokens: the prefill is no longer than C."""
    speed = serve_answer("llama-3-8b", ServeOptions(gpu="h100", context=1024))[1]
    assert (speed.prompt, speed.context, speed.prefill.tokens) == (1024, 1024, 1024)
    assert serve_answer("llama-3-8b", ServeOptions(gpu="h100", context=4096))[1].prompt == 2048


def test_a_long_context_says_which_rows_do_not_fit(capsys):
    """Llama-3-8B at 100,000 keys on an H100: batch 1 holds 16,060,522,496 B of weights + 13,107,200,000 B of KV
    cache and fits; batch 8's 104,857,600,000 B of cache does not. The context beyond the model's maximum is named
    as --context (serve's option), not as memory's --seq."""
    assert main(["serve", "llama-3-8b", "--gpu", "h100", "--context", "100000", "--width", "200"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip().split(" ")[0] in ("1", "8", "32", "128")]
    assert [(row[0], row[-1]) for row in rows] == [("1", "yes"), ("8", "NO"), ("32", "NO"), ("128", "NO")]
    assert ("does not fit one H100 80GB: weights 16,060,522,496 B + KV cache 104,857,600,000 B (batch 8 × 100,000 "
            "tokens) = 120,918,122,496 B > 85,899,345,920 B (decode at batch 8, 32, 128, context 100,000;") in out
    assert "--context 100,000 is beyond the model's max_position_embeddings (8,192)" in out
    assert "a rotary model extrapolates" in out and "--seq" not in out


def test_a_missing_peak_offers_the_table_s_dtypes(capsys):
    assert main(["serve", "gpt2", "--gpu", "4090"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give --peak-tflops, or --peak-dtype bf16/fp16/fp8" in err


def test_the_split_sentence_names_a_moe_layouts_replicas():
    """Memory's MoE search is over tp × dp: where it finds D > 1 (or nothing), speed's sentence names the layout,
    its replicas and GPUs, not the tp alone."""
    from paramscope.cost.hardware import Accelerator
    from paramscope.cost.parallel.serving import TensorParallelSearch
    from paramscope.cost.speed.roofline import _layout_words

    gpu = Accelerator("budget", 1 << 30, "", "budget")
    tried = ((1, 5 << 30, ""), (2, 3 << 30, ""), (1, 2 << 30, ""), (2, None, "uneven"), (1, 1 << 29, ""))
    found = TensorParallelSearch(gpu, 1, 8, 512, 1, 1 << 29, tried, 4, True, True, (1, 1, 2, 2, 4))
    assert _layout_words(found, "at batch 8 × 512 tokens (its peak)") == (
        "`memory`'s smallest layout that fits at batch 8 × 512 tokens, a replica's batch (its peak) (tried tp × dp "
        "by GPUs, fewer replicas first at equal GPUs, dp in powers of two, ep = tp × dp): tp 1 × dp 4 = 4 GPUs, "
        "536,870,912 B a GPU")
    none = TensorParallelSearch(gpu, 2, 8, 512, None, None, tried[:3], 1, False, True, (1, 1, 2))
    assert _layout_words(none, "at batch 8 × 512 tokens (its peak)").endswith(
        "the experts cut over tp × dp) (up to tp 1 × dp 2 × pp 2 = 4 GPUs)")
