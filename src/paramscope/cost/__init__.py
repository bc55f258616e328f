"""What parameters cost: memory (to load, serve and train) and FLOPs, laid out by quantity, then by engine.

    dims.py        config dimensions as every engine reads them (one reader: text config, positive ints, dropouts)
    dtypes.py      element types by name, their sizes, sizes of memory ("24GiB")
    hardware.py    accelerators: memory, bandwidth and peaks; `--gpu NAME`
    model_view.py  what the analytic engines read of a model, from the meta build or from recorded facts

    memory/        how many bytes (analytic closed forms, and the pipelines that answer)
        quantization.py, weights.py   storage formats → the weights' bytes by dtype, role and component
        declared.py                   the storage a checkpoint's config declares (compressed_tensors.py's too)
        kv.py, prefill.py             the KV cache from the config; the prefill's workspace by family
        states.py, activations/       a training step's model states (ZeRO shares); saved activations per family
        result.py, fits.py            the frozen MemoryEstimate; what fits on which accelerator
        serving.py, training.py       the pipelines: facts or build → analytic (or traced) → MemoryEstimate
    flops/         how many FLOPs
        analytic.py, result.py        the closed-form count and the frozen FlopEstimate
        estimate.py                   the pipeline: facts or build → analytic (checked by or replaced with traced)
    derived/       closed forms in B and S for any class, derived from traces of short cuts of it (needs torch to
                   derive; a kept recipe answers without it)
        derive.py                     cuts, layer types and contexts, regimes, the check before use
        layout.py, step.py            timelines laid out as a recipe; a model's recipes, regime by regime
        symbols.py, recipe.py         sizes as polynomials in B and S; the recipe laid out to any depth; its JSON
        store.py                      recipes in the cache
    traced/        the engine that runs the real class on fake tensors (needs torch)
        step.py                       one training or generate() step measured by torch's MemTracker
        timeline.py                   the same training step's every allocation and free, in order (derived/)
        tracker_hooks.py              MemTracker's module hooks made to hold no gradient (as the step frees)
        tracker.py                    MemTracker's per-operation peak update over a list, not a weak dict
        flops.py                      the same step under FlopCounterMode
        cache_probe.py                the real cache after a prefill on meta (the check on memory/kv.py)
        bnb4.py                       bitsandbytes' 4-bit Linear, as far as memory goes (QLoRA's base)
    facts/         cost facts: what a build decides beyond the report, recorded per config so answers need no torch
        store.py                      keys, reading and the view they give (`cost_view`)
        record.py                     reading them from a build and checking every answer before keeping them

Two engines check each other: the analytic ones (memory/, flops/) answer instantly from closed forms, the traced one
(traced/) runs the actual module and is what the closed forms are fitted and tested against; the derived one
(derived/) fits closed forms from the traced one itself, per config, and checks them before use. dims, dtypes, hardware
and memory/'s arithmetic use the standard library alone; the pipelines, traced/ and facts/record.py look at a build.
"""
