"""The Gradio Blocks of `dwb app`: Generate, Compare (side by side or A/B slider), X/Y/Z plot, PNG Info and
Scores and Jobs tabs, and the API they expose. Generate, Compare and X/Y/Z show one set of settings, each tab its own
controls (``settings_controls``) kept equal by ``wire_settings``; what each event does is ``app.handlers``.

API (``gradio_client``): ``/generate`` returns (gallery, parameters); ``/compare`` (gallery, A/B pair,
parameters); ``/xyz_plot`` (grids, cells, parameters); ``/png_info`` (parameters text, values, notes);
``/stop`` ends the calling client's running generation after its current step; ``/jobs`` (outside the queue) lists
this server's requests as the Jobs tab shows them to the caller (``app.jobs``). The gallery's PNGs carry
every parameter in their ``parameters`` text chunk. Bad input comes back as a one-line ``gr.Error``.
"""
from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
from starlette.middleware import Middleware

from models.generation import (DEFAULT_HIRES_UPSCALER, DEFAULT_MASK_BLUR, DEFAULT_REFINER_SWITCH, DEFAULT_SAMPLER,
                               DEFAULT_STEPS, DEFAULT_STRENGTH, DEFAULT_WEIGHTS, HIRES_UPSCALERS, MAX_CLIP_SKIP,
                               MAX_HIRES_SCALE, MAX_MASK_BLUR, SAMPLERS, CONTROL_MODULES, MAX_CONTROL_WEIGHT)
from models.common import allow_open_files, deadline_protocol

from .generate import DEFAULT_GUIDANCE, MAX_CHECKPOINT_CHARS, MAX_SEED
from .gradio_patches import calm_gradio_queue, queue_jobs, queue_waiting, serialize_queue_joins, serve_gradio_with
from .handlers import OPEN_IN_GENERATE, Handlers, as_markdown, queue_validator
from .jobs import COLUMNS as JOB_COLUMNS
from .modes import MODE_TABS
from .results_files import ResultsFiles
from .scores import STEP_AXIS
from .service import Service
from .uploads import MAX_CLIENT_UPLOAD_MB, MAX_TOTAL_UPLOAD_MB, UploadLimit, Uploads
from .xyz import AXES, NONE

log = logging.getLogger("app")
CONCURRENCY_ID = "generation"  # generate, compare and the X/Y/Z plot share one concurrency limit
# Open files the app keeps besides its connections: worker and compute threads, uploads being read, the
# checkpoint file being opened, the interpreter's own.
FILES_BESIDES_CONNECTIONS = 256
PROMPT_SET_CHOICES = [("DrawBench (200 prompts)", "drawbench"), ("PartiPrompts (1,632 prompts)", "parti")]
CSS = ("#gallery, #compare-gallery, #xyz-grids {min-height: 320px}"
       # the X/Y/Z plot's captions (a cell's settings) whole, under their image, where Gradio cuts them to one line
       " #xyz-gallery .caption-label, #xyz-grids .caption-label {position: static; max-width: none; border: none;"
       " white-space: normal; overflow-wrap: anywhere; flex-shrink: 0}"
       " #xyz-gallery .thumbnail-item, #xyz-grids .thumbnail-item {aspect-ratio: auto; height: auto; display: flex;"
       " flex-direction: column}"
       " #xyz-gallery .thumbnail-item > img {aspect-ratio: 1} #xyz-grids .thumbnail-item > img {height: auto}"
       " #xyz-grids .grid-wrap {max-height: none}")  # a grid whole, not in a box scrolled to its top
DICE_ICON = str(Path(__file__).with_name("static") / "dice.svg")
UPLOAD_MAX_AGE = 120  # seconds an upload no event has read is kept (an event deletes what it reads at once)


@dataclass
class Controls:
    """The generation settings every tab asks for, in the order the handlers take them."""

    prompt: gr.Textbox
    negative: gr.Textbox
    sampler: gr.Dropdown
    steps: gr.Slider
    guidance: gr.Slider
    width: gr.Slider
    height: gr.Slider
    seed: gr.Number
    dice: gr.Button  # puts a random seed in the box

    def inputs(self) -> list:
        return [self.prompt, self.negative, self.sampler, self.steps, self.guidance, self.width, self.height,
                self.seed]


def settings_controls(prefix: str, limits, size: int) -> Controls:
    """Prompt, negative prompt, sampler, steps, guidance, size and seed, with elem ids ``{prefix}NAME``."""
    prompt = gr.Textbox(label="Prompt", lines=2, elem_id=f"{prefix}prompt", max_length=limits.max_prompt_chars)
    negative = gr.Textbox("", label="Negative prompt", lines=1, elem_id=f"{prefix}negative",
                          max_length=limits.max_prompt_chars)
    sampler = gr.Dropdown(list(SAMPLERS), value=DEFAULT_SAMPLER, label="Sampler", elem_id=f"{prefix}sampler")
    steps = gr.Slider(1, limits.max_steps, value=min(DEFAULT_STEPS, limits.max_steps), step=1, label="Steps",
                      elem_id=f"{prefix}steps")
    guidance = gr.Slider(0, limits.max_guidance, value=DEFAULT_GUIDANCE, step=0.5, label="Guidance scale",
                         elem_id=f"{prefix}guidance")
    with gr.Row():
        width = gr.Slider(limits.min_size, limits.max_size, value=size, step=8, label="Width", elem_id=f"{prefix}width")
        height = gr.Slider(limits.min_size, limits.max_size, value=size, step=8, label="Height",
                           elem_id=f"{prefix}height")
    with gr.Row(elem_classes="seed-row"):
        seed = gr.Number(-1, precision=0, label="Seed (-1: a random one; image i of a batch uses seed + i)",
                         elem_id=f"{prefix}seed", scale=4)
        # an SVG die: the emoji 🎲 was an empty box in a Chromium without an emoji font
        dice = gr.Button("Random", icon=DICE_ICON, elem_id=f"{prefix}randomize", scale=0, min_width=110)
    return Controls(prompt, negative, sampler, steps, guidance, width, height, seed, dice)


def checkpoint_row(prefix: str, found, value, multiselect: bool = False):
    """(checkpoint dropdown, refresh button, weights radio)."""
    with gr.Row():
        label = "Checkpoints (two to four)" if multiselect else \
            "Checkpoint (pick one found under the folders, or type a path)"
        checkpoint = gr.Dropdown(found, value=value, multiselect=multiselect, max_choices=4 if multiselect else None,
                                 allow_custom_value=True, scale=5, elem_id=f"{prefix}checkpoint{'s' if multiselect else ''}",
                                 label=label)
        refresh = gr.Button("↻ Refresh", scale=0, min_width=90, elem_id=f"{prefix}refresh")
        weights = gr.Radio([("auto (EMA where held)", "auto"), ("EMA", "ema"), ("raw", "raw")], value=DEFAULT_WEIGHTS,
                           label="Weights", scale=1,
                           elem_id=f"{prefix}weights")
    return checkpoint, refresh, weights


def run_buttons(prefix: str, label: str, run_id: str):
    with gr.Row():
        run = gr.Button(label, variant="primary", elem_id=run_id)
        stop = gr.Button("Stop", variant="stop", elem_id=f"{prefix}stop")
    return run, stop


def results_column(prefix: str, object_fit: str = "cover"):
    """(gallery, parameters text, the images' parameters as state)."""
    gallery = gr.Gallery(label="Images", format="png", columns=4, elem_id=f"{prefix}gallery", interactive=False,
                         object_fit=object_fit)
    parameters = gr.Textbox(label="Parameters", lines=4, interactive=False, elem_id=f"{prefix}parameters",
                            buttons=["copy"])
    return gallery, parameters, gr.State([])


class UI:
    """The tabs' components, built in ``build_ui`` and wired there."""

    def __init__(self, handlers: Handlers, concurrency: int):
        self.h, self.limits = handlers, handlers.limits
        self.found, by_age = handlers.choices()
        self.first = by_age[0] if by_age else None
        self.size = handlers.default_size(by_age)
        self.common = dict(concurrency_limit=concurrency, concurrency_id=CONCURRENCY_ID, preprocess=False)
        # each generation event is counted against its request's and its client's limits when it joins the queue
        self.admitted = {handler: dict(validator=queue_validator(cost, handlers.admit))
                         for handler, cost in handlers.costs.items()}
        self.events = []  # the generation events Stop cancels

    def generate_tab(self) -> None:
        with gr.Tab("Generate", id="generate-tab"):
            self.checkpoint, self.refresh, self.weights = checkpoint_row("", self.found, self.first)
            # a single file's other parts (text encoders, tokenizers, VAE, configs), as `dwb sample --parts`
            self.parts = gr.Textbox("", label="Parts (a single file's other parts: a diffusers folder under the "
                                              "folders, or a hub id in the cache; empty: NAME.config/ beside it)",
                                    lines=1, elem_id="parts", max_length=MAX_CHECKPOINT_CHARS)
            # a second stage, as `dwb sample --refiner`: SDXL's refiner finishes the base's last steps
            with gr.Row():
                self.refiner = gr.Textbox("", label="Refiner (SDXL's: a folder under the folders or a hub id in the "
                                                    "cache; empty: none)", lines=1, elem_id="refiner", scale=3,
                                          max_length=MAX_CHECKPOINT_CHARS)
                self.refiner_switch = gr.Slider(0.05, 0.95, value=DEFAULT_REFINER_SWITCH, step=0.05, scale=1,
                                                label="Refiner switch at (the base's share of the steps)",
                                                elem_id="refiner-switch")
            self.note = gr.Markdown(elem_id="checkpoint-note")
            with gr.Row():
                with gr.Column(scale=1):
                    self.g = settings_controls("", self.limits, self.size)
                    self.lora_picker()
                    self.batch = gr.Slider(1, self.limits.max_batch, value=1, step=1, label="Batch size",
                                           elem_id="batch")
                    self.mode_controls()
                    self.control_controls()
                    self.run, self.stop = run_buttons("", "Generate", "generate")
                with gr.Column(scale=1):
                    self.gallery, self.parameters, self.texts = results_column("")

    def lora_picker(self) -> None:
        """A LoRA file under the folders and its strength, added to the prompt as A1111's ``<lora:NAME:STRENGTH>``
        tag (or that tag's strength changed): each LoRA of a prompt has the strength its tag gives."""
        with gr.Row(elem_classes="lora-row"):
            self.lora = gr.Dropdown(self.h.lora_labels(), value=None, scale=3, elem_id="lora-pick",
                                    label="LoRA (a file under the folders)")
            self.lora_strength = gr.Slider(-2, 2, value=1, step=0.05, scale=2, label="LoRA strength",
                                           elem_id="lora-strength")
            self.lora_add = gr.Button("Add to prompt", scale=0, min_width=120, elem_id="lora-add")

    def mode_controls(self) -> None:
        """Text to image (with a hires fix), image to image (an upload) and inpainting (a mask painted over an upload)
        as tabs, and their denoising strength: the tab chosen is the request's mode (``app.modes``), kept in a hidden
        radio the API sets as it sets any other input."""
        self.mode = gr.Radio([(label, mode) for label, mode in MODE_TABS], value="txt2img", visible=False,
                             label="Mode", elem_id="mode")
        with gr.Tabs(elem_id="mode-tabs") as self.mode_tabs:
            with gr.Tab("Text to image", id="txt2img") as txt2img:
                with gr.Row():
                    self.hires_scale = gr.Slider(1, MAX_HIRES_SCALE, value=1, step=0.05, elem_id="hires-scale",
                                                 label="Hires upscale (1: no hires fix)")
                    self.hires_steps = gr.Slider(0, self.limits.max_steps, value=0, step=1, elem_id="hires-steps",
                                                 label="Hires steps (0: as many as Steps)")
                    self.hires_upscaler = gr.Dropdown(list(HIRES_UPSCALERS), value=DEFAULT_HIRES_UPSCALER,
                                                      label="Hires upscaler", elem_id="hires-upscaler")
            with gr.Tab("Image to image", id="img2img") as img2img:
                self.init_image = gr.Image(label="Init image (resized to Width x Height)", type="filepath",
                                           sources=["upload", "clipboard"], format="png", elem_id="init-image")
            with gr.Tab("Inpaint", id="inpaint") as inpaint:
                self.editor = gr.ImageMask(label="Image: paint what to redraw", type="filepath", format="png",
                                           sources=["upload", "clipboard"], elem_id="inpaint-editor",
                                           brush=gr.Brush(colors=["#ffffff"], color_mode="fixed"))
                self.mask_blur = gr.Slider(0, MAX_MASK_BLUR, value=DEFAULT_MASK_BLUR, step=1, label="Mask blur",
                                           elem_id="mask-blur")
        with gr.Row():
            self.strength = gr.Slider(0.01, 1, value=DEFAULT_STRENGTH, step=0.01, elem_id="strength", scale=3,
                                      label="Denoising strength (image to image, inpainting, the hires fix)")
            self.clip_skip = gr.Slider(1, MAX_CLIP_SKIP, value=1, step=1, elem_id="clip-skip", scale=1,
                                       label="Clip skip (1: the text towers' usual layer)")
        # AUTOMATIC1111's SD VAE, as `dwb sample --vae`: one that makes the checkpoint's latents
        self.vae = gr.Textbox("", label="VAE (a diffusers VAE folder or .safetensors file under the folders; empty: "
                                        "the checkpoint's own)", lines=1, elem_id="vae",
                              max_length=MAX_CHECKPOINT_CHARS)
        for tab, mode in ((txt2img, "txt2img"), (img2img, "img2img"), (inpaint, "inpaint")):
            tab.select(None, None, self.mode, js=f"() => '{mode}'", queue=False, api_visibility="private")

    def jobs_tab(self) -> None:
        """The requests of this server, queued, running and finished, with their progress (``app.jobs``: another
        client's prompt and checkpoint are not shown), refreshed every second outside the queue while the tab is shown
        (``watch_jobs_while_shown``: an open page polls nothing otherwise)."""
        with gr.Tab("Jobs", id="jobs-tab") as self.jobs:
            table = gr.Dataframe(headers=list(JOB_COLUMNS), value=[], interactive=False, elem_id="jobs",
                                 label="Requests of this server (your own with their prompt and checkpoint)")
            self.jobs_timer = gr.Timer(1.0, active=False)
            self.jobs_timer.tick(self.h.job_list, None, table, queue=False, api_name="jobs")

    def control_controls(self) -> None:
        """A ControlNet steering the text-to-image draw, as `dwb sample --controlnet`: the ControlNet (a folder, a
        .safetensors file under the folders, or a hub id in the cache), its control image (an upload, preprocessed by
        canny where chosen), its strength and the share of the steps it steers (``app.modes.control_request``)."""
        with gr.Accordion("ControlNet", open=False, elem_id="controlnet-section"):
            self.controlnet = gr.Textbox("", label="ControlNet (a diffusers folder or .safetensors file under the "
                                                   "folders, or a hub id in the cache; empty: none)", lines=1,
                                         elem_id="controlnet", max_length=MAX_CHECKPOINT_CHARS)
            self.control_image = gr.Image(label="Control image (stretched to Width x Height)", type="filepath",
                                          sources=["upload", "clipboard"], format="png", elem_id="control-image")
            with gr.Row():
                self.control_preprocess = gr.Radio(list(CONTROL_MODULES), value="none", elem_id="control-preprocess",
                                                   label="Preprocess (canny: edges of the upload)")
                self.control_weight = gr.Slider(0, MAX_CONTROL_WEIGHT, value=1, step=0.05, label="Control strength",
                                                elem_id="control-weight")
            with gr.Row():
                self.control_start = gr.Slider(0, 1, value=0, step=0.01, elem_id="control-start",
                                               label="Starting control step (share of the steps)")
                self.control_end = gr.Slider(0, 1, value=1, step=0.01, elem_id="control-end",
                                             label="Ending control step (share of the steps)")

    def control_inputs(self) -> list:
        """The ControlNet controls in the order ``Handlers.generate`` takes them, after the mode controls."""
        return [self.controlnet, self.control_image, self.control_preprocess, self.control_weight,
                self.control_start, self.control_end]

    def mode_inputs(self) -> list:
        """The mode controls in the order ``Handlers.generate`` takes them."""
        return [self.mode, self.init_image, self.editor, self.strength, self.mask_blur, self.hires_scale,
                self.hires_steps, self.hires_upscaler, self.clip_skip, self.vae]

    def compare_tab(self) -> None:
        with gr.Tab("Compare", id="compare-tab") as self.compare_tab:
            self.c_checkpoints, self.c_refresh, self.c_weights = checkpoint_row("compare-", self.found, [], True)
            with gr.Row():
                with gr.Column(scale=1):
                    self.c = settings_controls("compare-", self.limits, self.size)
                    self.c_run, self.c_stop = run_buttons("compare-", "Compare", "compare")
                with gr.Column(scale=2):
                    with gr.Tabs():
                        with gr.Tab("Side by side"):
                            self.c_gallery, self.c_parameters, self.c_texts = results_column("compare-")
                        with gr.Tab("A/B slider"):
                            self.c_slider = gr.ImageSlider(label="A/B: the first two checkpoints", type="pil",
                                                           format="png", interactive=False, elem_id="compare-slider")

    def xyz_tab(self) -> None:
        types = [NONE, *AXES]
        with gr.Tab("X/Y/Z plot", id="xyz-tab") as self.xyz_tab:
            self.x_checkpoint, self.x_refresh, self.x_weights = checkpoint_row("xyz-", self.found, self.first)
            with gr.Row():
                with gr.Column(scale=1):
                    self.x = settings_controls("xyz-", self.limits, self.size)
                    self.axes = []
                    for name, default in zip("XYZ", ("seed", "guidance", NONE)):
                        with gr.Row():
                            kind = gr.Dropdown(types, value=default, label=f"{name} axis", scale=1,
                                               elem_id=f"xyz-{name.lower()}-type")
                            values = gr.Textbox(label=f"{name} values (one per line; numbers and samplers may be "
                                                      "separated by commas)", lines=2, scale=3,
                                                elem_id=f"xyz-{name.lower()}-values")
                        pick = gr.Dropdown([], multiselect=True, visible=False, label=f"Pick {name} values",
                                           elem_id=f"xyz-{name.lower()}-pick")
                        self.axes.append((kind, values, pick))
                    with gr.Row():
                        self.prompt_set = gr.Dropdown([("", ""), *PROMPT_SET_CHOICES], value="", scale=1,
                                                      label="Prompt set (fills the prompt axis)",
                                                      elem_id="xyz-prompt-set")
                        self.prompt_file = gr.File(label="or a prompt file (CSV or TSV with a prompt column)",
                                                   file_types=[".csv", ".tsv", ".txt"], type="filepath", scale=2,
                                                   elem_id="xyz-prompt-file")
                    self.x_batch = gr.Slider(1, self.limits.max_batch, value=self.limits.max_batch, step=1,
                                             label="Cells per pipeline call", elem_id="xyz-batch")
                    self.x_run, self.x_stop = run_buttons("xyz-", "Plot", "xyz-plot")
                with gr.Column(scale=2):
                    self.x_grids = gr.Gallery(label="Grids (one per Z value)", format="png", columns=1,
                                              elem_id="xyz-grids", interactive=False, object_fit="contain")
                    self.x_gallery, self.x_parameters, self.x_texts = results_column("xyz-", object_fit="contain")

    def png_info_tab(self) -> None:
        with gr.Tab("PNG Info", id="png-info-tab"):
            with gr.Row():
                with gr.Column():
                    self.png = gr.File(label="Drop a PNG, JPEG or WebP", file_types=[".png", ".jpg", ".jpeg", ".webp"],
                                       type="filepath", elem_id="png-file")
                    self.send = gr.Button("Send to Generate", variant="primary", elem_id="png-send")
                with gr.Column():
                    self.png_text = gr.Textbox(label="Parameters", lines=6, interactive=False, elem_id="png-parameters")
                    self.png_notes = gr.Markdown(elem_id="png-notes")
                    self.png_values = gr.JSON(label="What Send to Generate fills", elem_id="png-values")

    def scores_tab(self) -> None:
        with gr.Tab("Scores", id="scores-tab") as self.scores_tab:
            self.metric = gr.Dropdown([], label="Metric (those some results row measured)", elem_id="scores-metric")
            # GPU-hours and dollars offered where the rows have them (app.scores.x_axes_of); hidden without a choice
            self.s_x = gr.Radio([(STEP_AXIS.choice, STEP_AXIS.key)], value=STEP_AXIS.key, label="x axis",
                                visible=False, elem_id="scores-x")
            self.s_note = gr.Markdown(elem_id="scores-note")
            # an SVG the app draws (app.score_plot says why): js_on_load=None, no click events of gr.HTML's own
            self.s_plot = gr.HTML(elem_id="scores-plot", js_on_load=None, padding=True)
            self.s_table = gr.Dataframe(interactive=False, elem_id="scores-table",
                                        label="Rows, one per results row (select one to open its checkpoint below)")
            self.s_selected = gr.Markdown("Select a row of the table to open its checkpoint in Generate.",
                                          elem_id="scores-selected")
            self.s_open = gr.Button(OPEN_IN_GENERATE, interactive=False, elem_id="scores-open")  # names it: whole width
            self.s_digest = gr.State(None)  # the selected row's checkpoint hash
            self.s_pages = gr.HTML(visible=False, elem_id="scores-compare-pages", js_on_load=None)


def wire_generation(ui: UI) -> None:
    h, common, admitted = ui.h, ui.common, ui.admitted
    gen_inputs = [ui.checkpoint, ui.weights, *ui.g.inputs(), ui.batch, ui.parts, ui.refiner, ui.refiner_switch,
                  *ui.mode_inputs(), *ui.control_inputs()]
    ui.events.append(ui.run.click(h.generate, gen_inputs, [ui.gallery, ui.parameters, ui.texts],
                                  api_name="generate", **common, **admitted[h.generate]))
    ui.events.append(ui.g.prompt.submit(h.generate, gen_inputs, [ui.gallery, ui.parameters, ui.texts],
                                        api_visibility="private", **common, **admitted[h.generate]))
    ui.events.append(ui.c_run.click(h.compare, [ui.c_checkpoints, ui.c_weights, *ui.c.inputs()],
                                    [ui.c_gallery, ui.c_slider, ui.c_parameters, ui.c_texts], api_name="compare",
                                    **common, **admitted[h.compare]))
    axes = [c for kind, values, _ in ui.axes for c in (kind, values)]
    ui.events.append(ui.x_run.click(h.xyz_plot, [ui.x_checkpoint, ui.x_weights, *ui.x.inputs(), *axes, ui.x_batch,
                                                 *ui.mode_inputs()],
                                    [ui.x_grids, ui.x_gallery, ui.x_parameters, ui.x_texts], api_name="xyz_plot",
                                    **common, **admitted[h.xyz_plot]))
    for k, button in enumerate((ui.stop, ui.c_stop, ui.x_stop)):
        button.click(h.stop, None, None, queue=False, cancels=list(ui.events),
                     **(dict(api_name="stop") if k == 0 else dict(api_visibility="private")))
    for gallery, texts, parameters in ((ui.gallery, ui.texts, ui.parameters), (ui.c_gallery, ui.c_texts,
                                       ui.c_parameters), (ui.x_gallery, ui.x_texts, ui.x_parameters)):
        gallery.select(h.select, texts, parameters, queue=False, api_visibility="private")


def watch_jobs_while_shown(ui: UI, tabs: gr.Tabs) -> None:
    """The Jobs tab's timer on while that tab is shown and off once another is: each open page would otherwise ask
    the server every second, as the queue's own polling did before ``calm_gradio_queue`` (it slowed the
    generations running in this process)."""
    def timer_on(on: bool):
        return lambda: gr.Timer(active=on)

    for tab in tabs.children:
        tab.select(timer_on(tab is ui.jobs), None, ui.jobs_timer, queue=False, api_visibility="private")


def wire_panels(ui: UI, demo: gr.Blocks, tabs: gr.Tabs) -> None:
    h, private = ui.h, dict(queue=False, api_visibility="private")
    carry_settings(ui, ui.checkpoint.change(h.checkpoint_note, ui.checkpoint, [ui.note, ui.g.width, ui.g.height],
                                            **private))
    # what the chosen checkpoint's family can take: its samplers, a negative prompt only where it does something
    ui.checkpoint.change(h.family_controls, [ui.checkpoint, ui.g.sampler], [ui.g.sampler, ui.g.negative], **private)
    # a checkpoint the user chooses (not one Send to Generate sets with an image's own settings) starts Generate
    # from its recommended sampler, steps and guidance
    recommended = [ui.g.sampler, ui.g.steps, ui.g.guidance]
    carry_settings(ui, ui.checkpoint.input(h.recommended_controls, ui.checkpoint, recommended, **private))
    dropdowns = [ui.checkpoint, ui.c_checkpoints, ui.x_checkpoint]
    for button in (ui.refresh, ui.c_refresh, ui.x_refresh):
        button.click(h.refresh, None, dropdowns, **private)
    ui.refresh.click(h.lora_choices, None, ui.lora, **private)
    demo.load(h.lora_choices, None, ui.lora, **private)
    carry_settings(ui, ui.lora_add.click(h.add_lora, [ui.g.prompt, ui.lora, ui.lora_strength], ui.g.prompt, **private))
    for kind, values, pick in ui.axes:
        kind.change(h.axis_picker, kind, pick, **private)
        pick.input(h.picked, pick, values, **private)
    kinds, texts = [a[0] for a in ui.axes], [a[1] for a in ui.axes]
    ui.prompt_file.upload(h.prompt_file, [ui.prompt_file, *kinds], [ui.prompt_file, *kinds, *texts],
                          api_visibility="private")
    ui.prompt_set.input(h.prompt_set, [ui.prompt_set, *kinds], [*kinds, *texts], **private)
    ui.png.upload(h.png_info, ui.png, [ui.png_text, ui.png_values, ui.png_notes], api_name="png_info")
    carry_settings(ui, ui.send.click(h.send_to_generate, ui.png_values,
                                     [ui.checkpoint, ui.weights, *ui.g.inputs(), ui.batch, ui.note, tabs, ui.mode,
                                      ui.strength, ui.mask_blur, ui.hires_scale, ui.hires_steps, ui.hires_upscaler,
                                      ui.clip_skip, ui.vae, ui.mode_tabs, ui.refiner, ui.refiner_switch,
                                      *[c for c in ui.control_inputs() if c is not ui.control_image]], **private))
    scores = [ui.s_plot, ui.s_table, ui.s_note, ui.s_pages, ui.s_x]
    for chooser in (ui.metric, ui.s_x):
        chooser.input(h.scores_table, [ui.metric, ui.s_x], scores, **private)
    ui.s_table.select(h.select_row, ui.metric, [ui.s_digest, ui.s_selected, ui.s_open, ui.s_pages], **private)
    carry_settings(ui, ui.s_open.click(h.open_in_generate, ui.s_digest,
                                       [ui.checkpoint, ui.note, ui.g.width, ui.g.height, tabs], **private)
                   .then(h.recommended_controls, ui.checkpoint, recommended, **private))
    carry_settings(ui, demo.load(h.on_load, ui.checkpoint, [ui.checkpoint, ui.c_checkpoints, ui.x_checkpoint, ui.note,
                                                            ui.g.width, ui.g.height], **private)
                   .then(h.recommended_controls, ui.checkpoint, recommended, **private))
    demo.load(h.scores_view, [ui.metric, ui.s_x], [ui.metric, *scores], **private)
    # a tab's lists again as it opens: fresh, and past a Gradio race in which a page load's outputs in a tab not yet
    # shown keep a spinner over them (its "complete" arrived before they mounted), blocking their clicks
    for tab in (ui.compare_tab, ui.xyz_tab):
        tab.select(h.refresh, None, dropdowns, **private)
    ui.scores_tab.select(h.scores_view, [ui.metric, ui.s_x], [ui.metric, *scores], **private)


def wire_settings(ui: UI) -> None:
    """Prompt, negative prompt, sampler, steps, guidance, size and seed are one set of settings, shown in the
    Generate, Compare and X/Y/Z tabs. A user's change in one tab is copied to the others in the browser:
    ``.input`` fires on a user's change only, so the copies fire nothing back. Events that set them (a checkpoint's
    size, PNG Info's Send to Generate, Open in Generate) set the Generate tab's, and ``carry_settings`` copies those;
    the dice puts one seed in all three."""
    tabs = (ui.g, ui.c, ui.x)
    for k in range(len(ui.g.inputs())):
        for source in tabs:
            control = source.inputs()[k]
            gr.on(user_edits(control), None, control, [t.inputs()[k] for t in tabs if t is not source],
                  js="(v) => [v, v]", queue=False, api_visibility="private")

    def draw() -> tuple:  # low enough that a batch's last seed (seed + batch size - 1) is a seed too
        return (random.randint(0, MAX_SEED - ui.limits.max_batch),) * len(tabs)

    for source in tabs:
        source.dice.click(draw, None, [t.seed for t in tabs], queue=False, api_visibility="private")


def user_edits(control) -> list:
    """The events of a user's change to ``control``. Gradio 6.17's Textbox and Number fire ``input`` on a key
    press only (pasting or deleting fires nothing), so their ``blur`` too: a user leaves the box to reach
    another tab."""
    return [control.input, *([control.blur] if isinstance(control, (gr.Textbox, gr.Number)) else [])]


def carry_settings(ui: UI, event) -> None:
    """After ``event`` has set the Generate tab's settings, the same in the Compare and X/Y/Z tabs."""
    event.then(None, ui.g.inputs(), [*ui.c.inputs(), *ui.x.inputs()], js="(...v) => [...v, ...v]", queue=False,
               api_visibility="private")


def build_ui(service: Service, *, concurrency: int = 1, title: str = "diffusion-workbench",
             max_client_upload_mb: int = MAX_CLIENT_UPLOAD_MB, max_total_upload_mb: int = MAX_TOTAL_UPLOAD_MB
             ) -> tuple[gr.Blocks, Uploads]:
    """The app's Blocks and its uploads' keeper; queue and launch them (see ``app.cli``)."""
    with gr.Blocks(title=title, analytics_enabled=False) as demo:
        uploads = Uploads(demo.upload_file_set, max_client_mb=max_client_upload_mb, max_total_mb=max_total_upload_mb)
        handlers = Handlers(service, uploads=uploads, jobs=lambda: queue_jobs(demo),
                            waiting=lambda: queue_waiting(demo))
        ui = UI(handlers, concurrency)
        gr.Markdown(f"## {title}\nText-to-image from your checkpoints under "
                    + ", ".join(as_markdown(r.name, code=True) for r in service.roots))
        with gr.Tabs() as tabs:
            ui.generate_tab()
            ui.compare_tab()
            ui.xyz_tab()
            ui.png_info_tab()
            ui.scores_tab()
            ui.jobs_tab()
        wire_generation(ui)
        wire_settings(ui)
        wire_panels(ui, demo, tabs)
        watch_jobs_while_shown(ui, tabs)
    return demo, uploads


def launch(demo: gr.Blocks, uploads: Uploads, *, host: str, port: int, queue_size: int, concurrency: int,
           max_upload_mb: int = 8, upload_max_age: float = UPLOAD_MAX_AGE, trusted_proxies: list[str] = (),
           request_timeout: float, max_connections: int, prevent_thread_lock: bool = False, quiet: bool = False,
           results_folders=list):
    """Queue (a concurrency limit and a maximum size) and serve on ``host:port``.

    Gradio serves only its own cache of returned images and of uploads: no ``allowed_paths``, so neither the
    checkpoint folders nor any other file is reachable through its file route; beside it, ``/results-files/``
    serves the compare pages and images of the results folders ``results_folders()`` lists (``app.results_files``). Uploads are capped at
    ``max_upload_mb`` each (Gradio refuses larger ones with 413), per client and in all (``app.uploads``), and
    deleted once read, or after ``upload_max_age`` seconds. The queue does not poll
    (``app.gradio_patches.calm_gradio_queue``): its wake-ups slowed the generations running in this process. Every
    queued event goes through the queue (``api_open`` off: Gradio's ``/run/<api_name>`` route ran them
    directly, past the queue's size and its validators), and a client is its peer address: uvicorn reads
    X-Forwarded-For only from ``trusted_proxies`` (its default trusted 127.0.0.1, so any local process, or a
    proxy that passes the header on, could be anyone). A request must arrive within ``request_timeout``
    seconds and at most ``max_connections`` are open at once (``models.common.serving``).
    """
    os.environ["FORWARDED_ALLOW_IPS"] = ",".join(trusted_proxies)  # read by the uvicorn.Config Gradio builds
    allow_open_files(max_connections, FILES_BESIDES_CONNECTIONS)
    serve_gradio_with(deadline_protocol(request_timeout, max_connections))
    demo.queue(max_size=queue_size, default_concurrency_limit=concurrency, api_open=False)
    calm_gradio_queue(demo)
    serialize_queue_joins(demo)
    uploads.sweep(upload_max_age, every=max(1.0, upload_max_age / 4))
    return demo.launch(server_name=host, server_port=port, prevent_thread_lock=prevent_thread_lock, quiet=quiet,
                       footer_links=["api", "settings"], show_error=True, css=CSS, allowed_paths=[],
                       max_file_size=f"{max_upload_mb}mb", favicon_path=None, pwa=False, mcp_server=False,
                       ssr_mode=False, enable_monitoring=False,
                       app_kwargs={"middleware": [Middleware(UploadLimit, uploads=uploads),
                                                  Middleware(ResultsFiles, folders=results_folders)]})
