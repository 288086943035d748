"""The Gradio Blocks of `dwb app`: a Generate tab, a Compare tab, and the API they expose.

API (``gradio_client``): ``/generate`` and ``/compare`` return (gallery, parameters): the gallery's
PNGs carry every parameter in their ``parameters`` text chunk; ``/stop`` ends the calling client's
running generation after its current step. Bad input comes back as a one-line ``gr.Error``.
"""
from __future__ import annotations

import html
import logging
import random

import gradio as gr

from train.compat import calm_gradio_queue
from train.errors import WorkbenchError, first_line

from .generate import DEFAULT_SCHEDULER, MAX_SEED, SCHEDULERS, GenerationParams, Stopped
from .service import Result, Service

log = logging.getLogger("app")
KIND_NAMES = {"composer": "Composer checkpoint", "mosaicml": "mosaicml/diffusion checkpoint",
              "diffusers": "diffusers folder", "single-file": "single-file checkpoint", "hub": "Hugging Face hub model"}
CONCURRENCY_ID = "generation"  # generate and compare share one concurrency limit
CSS = "#gallery, #compare-gallery {min-height: 320px}"


def _message(e: Exception) -> gr.Error:
    """A one-line error for the UI; Gradio shows messages as HTML, so markup in user text is escaped."""
    return gr.Error(html.escape(first_line(e), quote=False),
                    print_exception=False)


def _fail(what: str, e: Exception) -> gr.Error:
    if isinstance(e, (WorkbenchError, Stopped)):
        log.warning("%s: %s", what, e)
        return _message(e)
    log.exception("%s failed", what)  # a bug or a runtime failure (out of memory): the server keeps serving
    return _message(RuntimeError(f"{what} failed: {type(e).__name__}: {e}"))


def _gallery(result: Result, compare: bool = False) -> tuple[list, str, list[str]]:
    texts = [r.parameters() for r in result.records]
    if compare:
        captions = [f"{r.checkpoint} ({r.weights})" for r in result.records]
    else:
        captions = [f"seed {r.seed}" for r in result.records]
    return list(zip(result.images, captions)), texts[0] if texts else "", texts


def build_ui(service: Service, *, concurrency: int = 1, title: str = "diffusion-workbench") -> gr.Blocks:
    """The app's Blocks; queue and launch it (see ``app.cli``)."""
    limits = service.limits

    def choices() -> tuple[list[tuple[str, str]], list[str]]:
        """The dropdown's (label, value) pairs, and the labels newest first. Values are labels: the browser
        never sees the server's paths."""
        found = service.checkpoints()
        return [(c.label, c.label) for c in found], [c.label for c in _newest_first(found)]

    def checkpoint_note(text: str | None) -> tuple[str, object, object]:
        """What the chosen checkpoint is, and its training resolution as the default size."""
        if not text:
            return "No checkpoint chosen.", gr.update(), gr.update()
        try:
            ckpt, info = service.info(text)
        except WorkbenchError as e:
            return f"**Cannot use this checkpoint:** {html.escape(str(e))}", gr.update(), gr.update()
        parts = [f"`{html.escape(ckpt.label)}`", KIND_NAMES.get(info.kind, info.kind)]
        if info.architecture:
            parts.append(f"architecture {info.architecture}")
        if info.resolution:
            parts.append(f"trained at {info.resolution} px")
        if info.has_ema is not None:
            parts.append("EMA and raw weights" if info.has_ema else "raw weights only (no EMA)")
        size = info.resolution if info.resolution and limits.min_size <= info.resolution <= limits.max_size else None
        return ", ".join(parts), *(gr.update(value=size) if size else gr.update() for _ in range(2))  # one per output

    def default_size(paths: list[str]) -> int:
        """The training resolution of the newest readable checkpoint (512 without one)."""
        for path in paths[:5]:
            try:
                info = service.info(path)[1]
            except WorkbenchError:
                continue
            if info.resolution and limits.min_size <= info.resolution <= limits.max_size:
                return info.resolution
            break
        return min(512, limits.max_size)

    found, by_age = choices()
    first = by_age[0] if by_age else None
    size = default_size(by_age)

    def settings_controls(prefix: str):
        scheduler = gr.Dropdown(list(SCHEDULERS), value=DEFAULT_SCHEDULER, label="Sampler", elem_id=f"{prefix}scheduler")
        steps = gr.Slider(1, limits.max_steps, value=min(25, limits.max_steps), step=1, label="Steps",
                          elem_id=f"{prefix}steps")
        guidance = gr.Slider(0, limits.max_guidance, value=7.5, step=0.5, label="Guidance scale",
                             elem_id=f"{prefix}guidance")
        with gr.Row():
            width = gr.Slider(limits.min_size, limits.max_size, value=size, step=8, label="Width",
                              elem_id=f"{prefix}width")
            height = gr.Slider(limits.min_size, limits.max_size, value=size, step=8, label="Height",
                               elem_id=f"{prefix}height")
        with gr.Row(elem_classes="seed-row"):
            seed = gr.Number(-1, precision=0, label="Seed (-1: a random one; image i of a batch uses seed + i)",
                             elem_id=f"{prefix}seed", scale=4)
            dice = gr.Button("🎲 Random", elem_id=f"{prefix}randomize", scale=0, min_width=90)
        dice.click(lambda: random.randint(0, MAX_SEED - limits.max_batch), outputs=seed, queue=False,
                   api_visibility="private")
        return scheduler, steps, guidance, width, height, seed

    with gr.Blocks(title=title, analytics_enabled=False) as demo:
        gr.Markdown(f"## {title}\nText-to-image from your checkpoints under "
                    + ", ".join(f"`{html.escape(str(r))}`" for r in service.roots))
        with gr.Tabs():
            with gr.Tab("Generate", id="generate-tab"):
                with gr.Row():
                    checkpoint = gr.Dropdown(found, value=first, allow_custom_value=True, scale=5, elem_id="checkpoint",
                                             label="Checkpoint (pick one found under the folders, or type a path)")
                    refresh = gr.Button("↻ Refresh", scale=0, min_width=90, elem_id="refresh")
                    weights = gr.Radio([("EMA", "ema"), ("raw", "raw")], value="ema", label="Weights", scale=1,
                                       elem_id="weights")
                note = gr.Markdown(elem_id="checkpoint-note")
                with gr.Row():
                    with gr.Column(scale=1):
                        prompt = gr.Textbox(label="Prompt", lines=2, elem_id="prompt")
                        negative = gr.Textbox("", label="Negative prompt", lines=1, elem_id="negative")
                        scheduler, steps, guidance, width, height, seed = settings_controls("")
                        batch = gr.Slider(1, limits.max_batch, value=1, step=1, label="Batch size", elem_id="batch")
                        with gr.Row():
                            run = gr.Button("Generate", variant="primary", elem_id="generate")
                            stop = gr.Button("Stop", variant="stop", elem_id="stop")
                    with gr.Column(scale=1):
                        gallery = gr.Gallery(label="Images", format="png", columns=4, elem_id="gallery",
                                             interactive=False)
                        parameters = gr.Textbox(label="Parameters", lines=4, interactive=False, elem_id="parameters",
                                                buttons=["copy"])
                        texts = gr.State([])

            with gr.Tab("Compare", id="compare-tab"):
                with gr.Row():
                    c_checkpoints = gr.Dropdown(found, value=[], multiselect=True, max_choices=4,
                                                allow_custom_value=True, scale=5, elem_id="compare-checkpoints",
                                                label="Checkpoints (two to four)")
                    c_refresh = gr.Button("↻ Refresh", scale=0, min_width=90, elem_id="compare-refresh")
                    c_weights = gr.Radio([("EMA", "ema"), ("raw", "raw")], value="ema", label="Weights", scale=1,
                                         elem_id="compare-weights")
                with gr.Row():
                    with gr.Column(scale=1):
                        c_prompt = gr.Textbox(label="Prompt", lines=2, elem_id="compare-prompt")
                        c_negative = gr.Textbox("", label="Negative prompt", lines=1, elem_id="compare-negative")
                        c_scheduler, c_steps, c_guidance, c_width, c_height, c_seed = settings_controls("compare-")
                        with gr.Row():
                            c_run = gr.Button("Compare", variant="primary", elem_id="compare")
                            c_stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
                    with gr.Column(scale=2):
                        c_gallery = gr.Gallery(label="Images", format="png", columns=4,
                                               elem_id="compare-gallery", interactive=False)
                        c_parameters = gr.Textbox(label="Parameters", lines=4,
                                                  interactive=False, elem_id="compare-parameters", buttons=["copy"])
                        c_texts = gr.State([])

        # -- events --------------------------------------------------------------------------------

        def generate(checkpoint: str, weights: str, prompt: str, negative_prompt: str, scheduler: str, steps: int,
                     guidance_scale: float, width: int, height: int, seed: int, batch_size: int,
                     request: gr.Request, progress=gr.Progress()):
            """Images from one checkpoint; image i of the batch uses seed + i. Returns (gallery, parameters)."""
            params = GenerationParams(prompt, negative_prompt, scheduler, steps, guidance_scale, width, height,
                                      -1 if seed is None else seed, batch_size)
            progress(0, desc="loading checkpoint")
            try:
                result = service.generate(checkpoint, weights, params, session=_session(request),
                                          on_step=lambda done, total: progress((done, total), desc="denoising",
                                                                               unit="steps"))
            except Exception as e:  # noqa: BLE001 - every failure becomes a message; the server keeps serving
                raise _fail("generate", e) from None
            log.info("generated %d image(s) in %.1f s", len(result.images), result.seconds)
            return _gallery(result)

        def compare(checkpoints: list[str], weights: str, prompt: str, negative_prompt: str, scheduler: str,
                    steps: int, guidance_scale: float, width: int, height: int, seed: int,
                    request: gr.Request, progress=gr.Progress()):
            """One image per checkpoint (two to four), same prompt, seed and settings. Returns (gallery, parameters)."""
            params = GenerationParams(prompt, negative_prompt, scheduler, steps, guidance_scale, width, height,
                                      -1 if seed is None else seed, 1)
            if isinstance(checkpoints, str):
                checkpoints = [checkpoints]

            def on_step(k: int, n: int, done: int, total: int) -> None:
                progress((k * total + done, n * total), desc=f"checkpoint {k + 1} of {n}", unit="steps")

            try:
                result = service.compare(list(checkpoints or []), weights, params, session=_session(request),
                                         on_step=on_step)
            except Exception as e:  # noqa: BLE001
                raise _fail("compare", e) from None
            return _gallery(result, compare=True)

        def stop_running(request: gr.Request) -> None:
            """End this client's running generation after its current step."""
            service.stop(_session(request))

        def select(texts: list[str], evt: gr.SelectData) -> str:
            return texts[evt.index] if isinstance(evt.index, int) and evt.index < len(texts) else ""

        def refresh_choices():
            fresh = choices()[0]
            return gr.update(choices=fresh), gr.update(choices=fresh)

        common = dict(concurrency_limit=concurrency, concurrency_id=CONCURRENCY_ID, preprocess=False)
        gen_event = run.click(generate, [checkpoint, weights, prompt, negative, scheduler, steps, guidance, width,
                                         height, seed, batch], [gallery, parameters, texts], api_name="generate",
                              **common)
        prompt.submit(generate, [checkpoint, weights, prompt, negative, scheduler, steps, guidance, width, height,
                                 seed, batch], [gallery, parameters, texts], api_visibility="private", **common)
        cmp_event = c_run.click(compare, [c_checkpoints, c_weights, c_prompt, c_negative, c_scheduler, c_steps,
                                          c_guidance, c_width, c_height, c_seed], [c_gallery, c_parameters, c_texts],
                                api_name="compare", **common)
        stop.click(stop_running, None, None, queue=False, api_name="stop", cancels=[gen_event, cmp_event])
        c_stop.click(stop_running, None, None, queue=False, api_visibility="private", cancels=[gen_event, cmp_event])
        gallery.select(select, texts, parameters, queue=False, api_visibility="private")
        c_gallery.select(select, c_texts, c_parameters, queue=False, api_visibility="private")
        checkpoint.change(checkpoint_note, checkpoint, [note, width, height], queue=False, api_visibility="private")
        for button in (refresh, c_refresh):
            button.click(refresh_choices, None, [checkpoint, c_checkpoints], queue=False, api_visibility="private")

        def on_load(current: str | None):
            """Each page load lists the checkpoints there are now (training may have written more)."""
            fresh, newest = choices()
            value = current or next(iter(newest), None)
            text, w, h = checkpoint_note(value)
            return gr.update(choices=fresh, value=value), gr.update(choices=fresh), text, w, h

        demo.load(on_load, checkpoint, [checkpoint, c_checkpoints, note, width, height], queue=False,
                  api_visibility="private")
    return demo


def _newest_first(found: list) -> list:
    """Most recently written first: the newest checkpoint is usually the one a user wants to try."""
    def mtime(ckpt) -> float:
        try:
            return ckpt.path.stat().st_mtime
        except (OSError, AttributeError):
            return 0.0

    return sorted(found, key=mtime, reverse=True)


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or ""


def launch(demo: gr.Blocks, *, host: str, port: int, queue_size: int, concurrency: int,
           prevent_thread_lock: bool = False, quiet: bool = False):
    """Queue (a concurrency limit and a maximum size) and serve on ``host:port``.

    Gradio serves only its own cache of returned images: no ``allowed_paths``, so neither the
    checkpoint folders nor any other file is reachable through its file route. The queue does not
    poll (``train.compat.calm_gradio_queue``): its wake-ups slowed the generations running in this process.
    """
    demo.queue(max_size=queue_size, default_concurrency_limit=concurrency)
    calm_gradio_queue(demo)
    return demo.launch(server_name=host, server_port=port, prevent_thread_lock=prevent_thread_lock, quiet=quiet,
                       footer_links=["api", "settings"], show_error=True, css=CSS, allowed_paths=[],
                       favicon_path=None, pwa=False, mcp_server=False, ssr_mode=False, enable_monitoring=False)

