"""What a model family is. One entry per family says everything a command needs to ask of it: its parts and
their full-size configs, how it is recognised (a diffusers folder's pipeline class, a single file's keys), how it
conditions (text encoders, guidance, negative prompts), how it noises (a diffusion or a flow schedule) and
which samplers, sizes and settings fit it. Callers ask the entry; none of them names a family.

Light to import (no torch): command lines list the families and their samplers in their help.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..common import shown
from ..errors import CheckpointError, WorkbenchError

# How far a checkpoint's config may go past its family's published sizes: each number that sizes a part (layers,
# widths, heads, sample size) up to four times the largest a published part of its class gives it (``limits``).
# Four times SDXL's 128-latent sample size is 4096 px, the largest side `dwb train` trains at (data.resolution). At
# four times every depth the deepest part, a UNet of 4 levels of 8 layers of 40 transformer blocks, built on the meta
# device in 18 s on two busy cores (the transformers and text encoders in under 2 s); what it builds is then
# counted against the weights there are.
SIZE_FACTOR = 4

# How a family's guidance works: classifier-free guidance with a negative prompt ("cfg"), a guidance scale the
# model was distilled to take as an input ("distilled", Flux.1-dev), or none at all ("none", Flux.1-schnell).
GUIDANCE_KINDS = ("cfg", "distilled", "none")


@dataclass(frozen=True)
class Part:
    """One part at full size: the library and class diffusers' ``model_index.json`` names, and its config."""

    library: str
    cls: str
    config: dict
    # the config keys that size it (layers, widths, heads, sample size, its levels' lists): what a config from
    # elsewhere is held to before it is built (``limits``)
    sizes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Variant:
    """One published model of a family (SDXL base, Flux.1-dev): its full-size parts, the parameter count its
    authors published for them, and the settings it is meant to be sampled at."""

    name: str
    parts: dict[str, Part]
    published_parameters: float  # as the authors state it, of the parts in ``published_parts``
    published_parts: tuple[str, ...] = ()  # () for all of ``parts``
    published_tolerance: float = 0.01  # how far the count of those parts may be from the figure
    guidance: str = "cfg"
    # the settings its authors publish it to be sampled at (None: the workbench's defaults, which are SD's)
    guidance_scale: float | None = None
    steps: int | None = None
    hub_id: str | None = None
    # a second stage (SDXL's refiner): it finishes another variant's latents over the last part of the schedule and
    # draws nothing from text alone
    refiner: bool = False


@dataclass(frozen=True)
class Assembly:
    """How the family's pipeline is put together around parts built here (a Composer checkpoint's spec, a training
    run's model): the sampler it starts with and what the pipeline class is handed beyond its parts and tokenizers.
    Every part of the family's first variant is built, except those another fills (``shared``) and those it may lack
    (``absent``)."""

    scheduler: dict  # the starting sampler's config, its diffusers class under "_class_name"
    # (scheduler key, where a model spec keeps it as a dotted path, its type): what a trained model sets
    settings: tuple[tuple[str, str, type], ...] = ()
    default_sampler: bool = False  # the sampler becomes the workbench's default one over the schedule (SD 1/2)
    shared: tuple[tuple[str, str], ...] = ()  # (component, the component that fills it where it is absent)
    absent: tuple[str, ...] = ()  # text encoders a model built here may lack (SD3's T5): passed as None
    options: dict = field(default_factory=dict)  # the pipeline class's other arguments

    def needed(self, parts) -> tuple[str, ...]:
        """Of the family's part names ``parts``, those a model built here must have."""
        filled = {name for name, _ in self.shared} | set(self.absent)
        return tuple(name for name in parts if name not in filled)

    def spec_settings(self, spec: dict) -> dict:
        """The settings a model spec records, by scheduler key (a KeyError or ValueError where it lacks one)."""
        values = {}
        for key, path, kind in self.settings:
            value = spec
            for step in path.split("."):
                value = value[step]
            values[key] = kind(value)
        return values


@dataclass(frozen=True)
class SingleFile:
    """The family's published single file, as `dwb export OUT.safetensors` writes it: the key map that lays out its
    tensors (the export room's, by name), the parts whose weights it holds (the config folder beside it holds the
    others'), and whether `dwb` and diffusers read it without a config folder where every part has the family's
    published config."""

    key_map: str
    in_file: tuple[str, ...]
    reads_published_alone: bool = False
    # the file as also published without its text encoders (SD3's ``sd3_medium.safetensors``), written for a
    # pipeline that lacks one of them (our MMDiT: no T5)
    without_text: "SingleFile | None" = None


# the entry of a tokenizer's config (``init_kwargs``, saved in its tokenizer_config.json) that says the T5 tokens a
# model trained here read (``Family.text_length``), at most the 512 that training takes (``model.text_tokens``)
TRAINED_TOKENS = "trained_tokens"
MAX_TEXT_TOKENS = 512
ORIGINAL_SD = "original-sd"  # SD 1/2's original layout: its key maps are the checkpoints room's own (both ways)


@dataclass(frozen=True)
class Family:
    name: str  # as commands print it and configs name it: "sdxl"
    label: str  # "Stable Diffusion XL"
    pipeline: str  # the diffusers pipeline class that generates with it
    denoiser: str  # the part that denoises: "unet" or "transformer"
    text_encoders: tuple[str, ...]  # its text encoders' part names, each with its tokenizer
    schedule: str  # "diffusion" (discrete betas, epsilon or v) or "flow" (rectified flow)
    samplers: tuple[str, ...]  # the names in models.generation.SAMPLERS that sample it
    native_size: int  # pixels at full size
    size_range: tuple[int, int]  # the sides it was trained across, at full size
    latent_channels: int
    folder_classes: frozenset[str]  # model_index.json's _class_name values that hold it
    single_file_marks: tuple[str, ...]  # key prefixes that only its single files hold
    single_file_text_marks: tuple[str, ...]  # key prefixes of its text encoders in a single file
    variants: tuple[Variant, ...]
    assembly: Assembly  # how its pipeline is put together around parts built here
    single_file: SingleFile | None = None  # None: `dwb export` writes it as a diffusers folder only
    pipeline_options: dict = field(default_factory=dict)  # what its pipeline class is built and loaded with
    latent_packing: int = 1  # latents packed into patches of this side before the denoiser (Flux.1: 2)
    second_tokenizer: str = "CLIPTokenizer"  # the transformers class of its second tower's own tokenizer (Flux.1: T5's)
    pick_variant: object = field(repr=False, default=None)  # denoiser config -> variant name
    refiner_pipeline: str | None = None  # the diffusers pipeline a refiner variant finishes a base's latents with
    # the diffusers pipelines that draw from an init image (image to image) and from one and a mask (inpainting),
    # built from the text-to-image pipeline's modules (``models.generation``); None: the family has none
    img2img_pipeline: str | None = None
    inpaint_pipeline: str | None = None
    # the diffusers pipeline that draws from text steered by a ControlNet (``models.generation``), and the ControlNet
    # model class it takes (``models.checkpoints.open_controlnet``); None: the family has none here
    controlnet_pipeline: str | None = None
    controlnet_model: str = "ControlNetModel"
    # whether its pipelines condition on an earlier layer of its CLIP towers when asked (``clip_skip``: SD 1/2, SDXL,
    # SD3); Flux.1's take CLIP's pooled output alone, which no layer choice changes
    takes_clip_skip: bool = True
    # how its CLIP towers' states are taken where a prompt is weighted (AUTOMATIC1111's (word:1.2), read through compel):
    # compel's ReturnedEmbeddingsType by name, for Clip skip 1, 2, ... as far as compel has one (SD 1/2: the last and
    # the penultimate layer, normalized; SDXL: the penultimate, not normalized, as its pipeline takes them); () where
    # compel builds none of its conditioning (SD3's T5, Flux.1's): a weighted prompt is refused there
    prompt_weights: tuple[str, ...] = ()
    # (denoiser config, whether every text encoder is there) -> what its pipeline is called with beyond prompts and
    # guidance (an MMDiT trained on its CLIP states alone takes no T5 tokens); None: nothing
    text_options: object = field(repr=False, default=None)
    # the pipeline call's argument for how many tokens its second tokenizer's tower reads (FluxPipeline's T5:
    # ``max_sequence_length``), set from that tokenizer's ``model_max_length``; None: the family's pipeline has none
    text_length_option: str | None = None
    # the tokenizer of the tower whose token count that is (FLUX.1's T5 tokenizer, ``tokenizer_2``; SD3's,
    # ``tokenizer_3``), and the transformers class of a third tower's own tokenizer (SD3's T5's), as a checkpoint
    # trained here records it
    text_length_tokenizer: str = "tokenizer_2"
    third_tokenizer: str | None = None
    # the layout a LoRA of it goes out in where a command picks one for the tools its users load LoRAs with
    # (``models.adapters.LAYOUTS``): kohya's for SD 1/2 and SDXL, which AUTOMATIC1111, Forge and ComfyUI read; the
    # peft layout, which holds every adapter kind of every family, elsewhere
    lora_layout: str = "peft"

    @property
    def original_sd_layout(self) -> bool:
        """Whether its single files are the original Stable Diffusion layout, which the checkpoints room's own key
        maps read and write (SD 1/2); the other families' files are read by diffusers' single-file loader."""
        return self.single_file is not None and self.single_file.key_map == ORIGINAL_SD

    @property
    def takes_prompt_weights(self) -> bool:
        """Whether a weighted prompt ((word:1.2), [word], BREAK) conditions it (``prompt_weights``)."""
        return bool(self.prompt_weights)

    @property
    def negative_prompt(self) -> bool:
        """Whether a negative prompt does anything: only where guidance is classifier-free."""
        return all(v.guidance == "cfg" for v in self.variants)

    def size_multiple(self, pipe) -> int:
        """What an image's sides must be multiples of: the VAE's scale times the denoiser's patch or packing."""
        return pipe.vae_scale_factor * max(getattr(pipe, "patch_size", 1) or 1, self.latent_packing)

    def size_step(self) -> int:
        """What every model of the family can draw its sides in multiples of, known without loading one: the
        full-size VAE's scale times the denoiser's patch or packing (SD 1/2 and SDXL 8, SD3 and Flux.1 16). A
        smaller model's VAE halves the side no more often and its patch is no larger, so its own multiple
        (``size_multiple``) divides this one."""
        parts = self.variants[0].parts
        vae_scale = 2 ** (len(parts["vae"].config["block_out_channels"]) - 1)
        return vae_scale * max(parts[self.denoiser].config.get("patch_size") or 1, self.latent_packing)

    def largest_side(self) -> int:
        """The largest native side a checkpoint of the family may record: SIZE_FACTOR times its native size, as far
        as its configs' sample sizes are held (``limits``)."""
        return SIZE_FACTOR * self.native_size

    def recorded_side(self, side, where: str) -> int | None:
        """``side``, a native size a checkpoint records (its spec's resolution, its configs' sample size in pixels),
        or None where it records none; a one-line CheckpointError naming ``where`` unless it is a whole number from
        1 to ``largest_side``."""
        if side is None:
            return None
        if isinstance(side, bool) or not isinstance(side, int) or not 1 <= side <= self.largest_side():
            raise CheckpointError(f"{where} must be a whole number of pixels from 1 to {self.largest_side()} (a "
                                  f"{self.label} side), got {shown(side)}")
        return side

    def recommended(self, variant: Variant) -> dict:
        """The variant's published sampling settings, as a checkpoint's recommended ones (``{}`` where none)."""
        return {k: v for k, v in (("guidance", variant.guidance_scale), ("steps", variant.steps)) if v is not None}

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise WorkbenchError(f"{self.label} has no variant {name!r}; it has: {', '.join(v.name for v in self.variants)}")

    def variant_of(self, denoiser_config: dict) -> Variant:
        """The variant a checkpoint is, from its denoiser's config (the first where a family has one)."""
        return self.variant(self.pick_variant(denoiser_config)) if self.pick_variant else self.variants[0]

    def call_options(self, denoiser_config: dict, all_text_encoders: bool) -> dict:
        """What a pipeline call of this denoiser takes beyond prompts and guidance (``{}`` for most), given whether
        the pipeline holds every one of the family's text encoders."""
        return dict(self.text_options(denoiser_config, all_text_encoders)) if self.text_options else {}

    def text_length(self, pipe) -> dict:
        """The T5 token count a call of ``pipe`` takes (``text_length_option``): the ``text_tokens`` a model trained
        here was trained with, as its ``text_length_tokenizer`` says it (``models.checkpoints.with_max_length`` marks
        it: ``TRAINED_TOKENS``, kept in an exported folder's tokenizer config); ``{}`` for a family without one, and
        for a tokenizer that says no trained count (a published model's, whose own ``model_max_length`` need not be
        its pipeline's default: SD3's pipeline draws with 256 T5 tokens): the pipeline's own default."""
        tokenizer = getattr(pipe, self.text_length_tokenizer, None)
        tokens = (getattr(tokenizer, "init_kwargs", None) or {}).get(TRAINED_TOKENS)
        if self.text_length_option is None or isinstance(tokens, bool) or not isinstance(tokens, int) \
                or not 1 <= tokens <= MAX_TEXT_TOKENS:  # a folder from elsewhere may say anything
            return {}
        return {self.text_length_option: tokens}

    def takes_mask(self, denoiser_config: dict) -> bool:
        """Whether the denoiser is an inpainting model: its input is its latents, the masked image's latents and the
        mask side by side (SD's and SDXL's inpainting UNets: 9 channels for 4), so it draws only with a mask."""
        out = denoiser_config.get("out_channels") or self.latent_channels
        return denoiser_config.get("in_channels") == 2 * out + 1

    def has_all_text_encoders(self, pipe) -> bool:
        return all(getattr(pipe, name, None) is not None for name in self.text_encoders)

    def pipeline_for(self, variant: Variant, where: str, refiner: bool = False) -> str:
        """The diffusers pipeline class that opens a checkpoint of ``variant`` as a base (text to image) or as a
        refiner; a one-line error naming the fix where the checkpoint is the other kind."""
        if variant.refiner and not refiner:
            raise WorkbenchError(f"{where} is a {self.label} refiner: it finishes a base model's image and draws none "
                                 f"from text alone; give it as the refiner of a {self.label} base "
                                 f"(dwb sample BASE OUT --refiner {where}, or the app's Refiner field)")
        if refiner and not variant.refiner:
            raise WorkbenchError(f"{where} is a {self.label} ({variant.name}) model, not a refiner: give it as the "
                                 "checkpoint, and a refiner (Stable Diffusion XL's) as --refiner")
        return self.refiner_pipeline if refiner else self.pipeline

    def check_sampler(self, sampler: str) -> None:
        if sampler not in self.samplers:
            raise WorkbenchError(f"{self.label} cannot be sampled with {sampler!r}; choose one of: "
                                 f"{', '.join(self.samplers)}")

    def pipeline_arguments(self, variant: Variant, guidance: float, negative_prompt: str, n: int) -> dict:
        """The conditioning arguments of one pipeline call of ``n`` prompts: a guidance scale where the variant
        takes one, negative prompts only where they do something (a one-line error where they would not)."""
        if negative_prompt and variant.guidance != "cfg":
            raise WorkbenchError(f"{self.label} ({variant.name}) has no negative prompt: its guidance is "
                                 f"{'distilled into the model' if variant.guidance == 'distilled' else 'none'}")
        args = {} if variant.guidance == "none" else {"guidance_scale": guidance}
        if negative_prompt:
            args["negative_prompt"] = [negative_prompt] * n
        return args
