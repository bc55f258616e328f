"""What an image or audio input is (MediaInput: --image-tokens N | --images K | --audio-seconds T, checked against
its limits) and what its towers cost (MediaFlops: a TowerLine for each part traced, the tokens the projector
hands the language model, and the moments the traces measure)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import OptionError

MAX_IMAGES = 1024  # images a sequence
MAX_IMAGE_TOKENS = 1 << 20  # image tokens a sequence
MAX_AUDIO_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class MediaInput:
    """What each sequence holds beside its text: image tokens (the projector's output), images at the vision
    config's own size, or seconds of audio."""

    image_tokens: int | None = None
    images: int | None = None
    audio_seconds: float | None = None

    def check(self) -> None:
        given = [name for name, value in (("image_tokens", self.image_tokens), ("images", self.images),
                                          ("audio_seconds", self.audio_seconds)) if value is not None]
        if len(given) > 1:
            raise OptionError("give one of {0} and {1}, not both", given[0], given[1])
        if self.image_tokens is not None and not 1 <= self.image_tokens <= MAX_IMAGE_TOKENS:
            raise OptionError("{0} must be between 1 and {limit:,}, got {value}", "image_tokens",
                              limit=MAX_IMAGE_TOKENS, value=self.image_tokens)
        if self.images is not None and not 1 <= self.images <= MAX_IMAGES:
            raise OptionError("{0} must be between 1 and {limit:,} images a sequence, got {value}", "images",
                              limit=MAX_IMAGES, value=self.images)
        if self.audio_seconds is not None and not 0 < self.audio_seconds <= MAX_AUDIO_SECONDS:  # also refuses nan
            raise OptionError("{0} must be a positive number of seconds up to {limit:,.0f}, got {value}",
                              "audio_seconds", limit=MAX_AUDIO_SECONDS, value=self.audio_seconds)

    @property
    def given(self) -> bool:
        return any(value is not None for value in (self.image_tokens, self.images, self.audio_seconds))


@dataclass(frozen=True)
class TowerLine:
    """One part an image or audio input runs: its module path, class, and FLOPs as FlopCounterMode counts them."""

    part: str  # "vision tower" | "projector" | "audio encoder"
    path: str
    class_name: str
    forward: int
    backward: int | None  # training: the part's backward (its weights train)


@dataclass(frozen=True)
class MediaFlops:
    """The towers' FLOPs for one step's images or audio (batch × what each sequence holds), and the tokens the
    language model then reads."""

    kind: str  # "image" | "audio"
    input_words: str  # what a sequence holds, in the tower's own terms
    per_sequence: int  # images (audio: 30 s windows) a sequence
    tokens: int  # tokens the projector adds to each sequence's language-model input (0: read by cross-attention)
    tokens_words: str  # how that count follows from the class and config
    lines: tuple[TowerLine, ...]
    engine: str = "traced"  # FlopCounterMode on the tower alone, fake tensors
    notes: tuple[str, ...] = field(default=())
    # the language model's forward FLOPs by module path, the rest of the same trace, where it reads the tower by
    # cross-attention (Whisper's decoder, Llama-3.2-Vision's text model): the estimate reads them by role in place of
    # the analytic count; empty where the projector hands the language model tokens
    decoder_by_module: tuple[tuple[str, int], ...] = field(default=())
    # training, where decoder_by_module is read: the language model's backward in the same trace (the whole
    # backward less the tower's and projector's lines); None for a forward
    decoder_backward: int | None = None
    # training in a precision (media_flops' `precision`): the bytes the tower's and projector's forward saves for the
    # backward and still holds when it ends (activations and autocast's weight copies, each storage once; the
    # weights not), alive until the backward reaches them
    saved_bytes: int | None = None
    # serving in a dtype (media_flops' `serving_dtype`): the largest bytes live at once during the tower's and
    # projector's forward (no grad), the image input and every intermediate, weights not: what the tower adds to
    # the resident weights while it runs, before the language model's prefill
    forward_peak: int | None = None
    # serving images (held_into_prefill's, set by the serving estimate): the bytes the forward keeps of the images
    # through the language model's prefill, beyond a text input's
    held_through_prefill: int | None = None

    @property
    def forward(self) -> int:
        return sum(line.forward for line in self.lines)

    @property
    def backward(self) -> int | None:
        if any(line.backward is None for line in self.lines):
            return None
        return sum(line.backward for line in self.lines)
