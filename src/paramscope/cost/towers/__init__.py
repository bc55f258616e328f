"""FLOPs of a multimodal model's vision or audio tower on an image or audio input, traced on the tower alone.

A text input runs a multimodal model's language model only (model_view.towers_not_run). An input with images or
audio also runs the tower that reads them and the projector that turns its output into the language model's tokens.
Here those run as the real class runs them (the model's own `get_image_features`, or Whisper's encoder), on fake
tensors of the input's size under FlopCounterMode: the tower is small beside the language model, and its patch
convolutions, pooling and windowed attention have no closed form here. The count is the tower's and the projector's,
each in a line of its own, and how many tokens the projector hands the language model, read off the traced output.

    MediaInput (--image-tokens N | --images K | --audio-seconds T) → the class's own input of that size →
    FlopCounterMode over the tower and projector → MediaFlops (lines, tokens a sequence)

Families: Gemma-3 (SigLIP at the vision config's image size, pooled to mm_tokens_per_image), LLaVA (CLIP's patches,
the CLS token dropped or kept by vision_feature_select_strategy), Qwen2.5-VL (any image size: N tokens are N merged
2×2 blocks of patches, a grid picked as square as N allows; windowed attention laid out by transformers' own
helpers on the real grid), Whisper (its encoder over 30 s windows of 3,000 mel frames), Llama-3.2-Vision (its tiles
read by cross-attention).

    media.py            MediaInput (what a sequence holds beside its text, checked) and MediaFlops / TowerLine
    families.py         media_family, and media_flops: the entry, which runs the family's trace
    image_families.py   Gemma-3, LLaVA, Qwen2.5-VL: the projector hands the language model tokens
    cross_attention.py  Whisper, Llama-3.2-Vision: the whole forward traced and split, the language model's modules too
    shapes.py           the image inputs laid out: images a sequence, Qwen2.5-VL's grid, windows and positions
    trace.py            the traced run (trace_parts): FlopCounterMode by module path, the rows produced, what the
                        forward saves for backward, the serving forward's peak
    prefill.py          held_into_prefill → ImageForward: what images hold before and through the language model's
                        prefill, the class's own forward measured
    cache.py            tower traces kept with the config's cost facts (media_key, find_media, keep_media)
"""
