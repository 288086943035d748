"""What the app's events do (``app.ui`` lays them out and wires them): each takes the controls' raw values
and returns what the outputs show. Every failure becomes a one-line ``gr.Error``; the server keeps serving.

The API (``gradio_client``) calls ``generate``, ``compare``, ``xyz_plot`` and ``png_info`` by the names of
their parameters, so those names are the API's.
"""
from __future__ import annotations

import html
import inspect
import logging
import re
from collections.abc import Callable
from dataclasses import replace

import gradio as gr
import pandas as pd

from models.checkpoints import content_hash, recommended_settings
from models.common import flip_text, interval_text
from models.errors import WorkbenchError, first_line
from models.families import family_or_ours
from models.generation import (DEFAULT_REFINER_SWITCH, DEFAULT_SAMPLER, PROMPT_SETS, drawable_sides, lora_tag,
                               read_prompt_table, recommended_line, with_lora)

from .generate import GenerationParams, LimitError, Stopped, check_client, shown
from .jobs import KINDS, JobBoard, size_of
from .modes import control_request, hires_of, init_of
from .png_info import read_png, settings_from
from .results_files import page_url
from .score_plot import score_plot
from .scores import (STEP_AXIS, X_AXES, Metric, ScorePoint, WinRate, XAxis, points_of, scores_of, setting_text,
                     significant, x_axes_of)
from .service import Result, Service
from .uploads import Uploads
from .xyz import NONE

log = logging.getLogger("app")
KIND_NAMES = {"composer": "Composer checkpoint", "mosaicml": "mosaicml/diffusion checkpoint",
              "diffusers": "diffusers folder", "single-file": "single-file checkpoint", "hub": "Hugging Face hub model"}


MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_\[\]~$|])")  # what makes images, links, code, emphasis, tables, maths
BLOCK_START = re.compile(r"^(\s*[#+=-]|\s*\d+[.)])")  # what starts a heading or a list at the start of a line


def as_markdown(text, *, code: bool = False) -> str:
    """User-controlled text (a typed name, a PNG's fields, a results file's or a study's words, a label) for a
    ``gr.Markdown``, shown as itself on one line: no image, link, HTML or formatting of its own. (Notes render as
    Markdown; a PNG whose Model field held ``![x](http://host/x.png)`` made every viewer's browser fetch it.)
    ``code``: as a code span, whose text Markdown shows as it is, fenced by more backticks than it holds."""
    line = " ".join(str(text).splitlines())
    if code:
        fence = "`" * (max(map(len, re.findall(r"`+", line)), default=0) + 1)
        pad = " " if line.startswith("`") or line.endswith("`") else ""
        return f"{fence}{pad}{line}{pad}{fence}"
    escaped = MARKDOWN_PUNCTUATION.sub(r"\\\1", html.escape(line, quote=False))
    return BLOCK_START.sub(lambda m: f"{m.group(1)[:-1]}\\{m.group(1)[-1]}", escaped)  # \# and 1\. are text


def one_line(e: Exception) -> gr.Error:
    """A one-line error for the UI; Gradio shows messages as HTML, so markup in user text is escaped."""
    return gr.Error(html.escape(first_line(e), quote=False), print_exception=False)


def failed(what: str, e: Exception, for_client: Callable[[str], str]) -> gr.Error:
    """The one line a client sees for a failed event; ``for_client`` takes the server's paths out of it
    (the server's log keeps the whole error)."""
    if isinstance(e, (WorkbenchError, Stopped)):
        log.warning("%s: %s", what, e)
        return one_line(type(e)(for_client(first_line(e))))
    log.exception("%s failed", what)  # a bug or a runtime failure (out of memory): the server keeps serving
    return one_line(RuntimeError(for_client(f"{what} failed: {type(e).__name__}: {first_line(e)}")))


def session_of(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or ""


def client_of(request) -> str:
    """Who sent a request (a gr.Request or Starlette's): its peer address, which uvicorn takes from
    X-Forwarded-For only when the peer is one of `dwb app --trusted-proxy`'s addresses."""
    return getattr(getattr(request, "client", None), "host", None) or ""


def queue_validator(cost: Callable, admit: Callable) -> Callable:
    """An async ``validator=`` for an event whose inputs ``cost`` takes, calling ``admit(request, cost, inputs)``.
    Gradio gives a validator the event's inputs, and the gr.Request where a parameter is annotated with it: the
    validator has ``cost``'s parameters and then ``request``. Async: it runs on the queue's event loop, where
    the queue it counts cannot change under it."""
    async def check(*args):
        *inputs, request = args
        return admit(request, cost, inputs)

    # a default, as ``cost``'s later inputs may have one (Gradio fills it by its annotation all the same)
    request = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request,
                                default=None)
    check.__signature__ = inspect.Signature([*inspect.signature(cost).parameters.values(), request])
    check.__annotations__ = {"request": gr.Request}
    return check


def params_of(prompt, negative_prompt, sampler, steps, guidance_scale, width, height, seed,
              batch_size=1, refiner=None, refiner_switch=None) -> GenerationParams:
    return GenerationParams(prompt, negative_prompt, sampler, steps, guidance_scale, width, height,
                            -1 if seed is None else seed, batch_size, refiner or "",
                            DEFAULT_REFINER_SWITCH if refiner_switch is None else refiner_switch)


def gallery_of(result: Result, captions: list[str]) -> tuple[list, str, list[str]]:
    """(gallery items, the first image's parameters, every image's parameters)."""
    texts = [r.parameters() for r in result.records]
    return list(zip(result.images, captions)), texts[0] if texts else "", texts


def steps_progress(progress: gr.Progress):
    return lambda done, total: progress((done, total), desc="denoising", unit="steps")


OPEN_IN_GENERATE = "Open in Generate"  # the Scores tab's button before a row is selected


class Handlers:
    """The app's events, on one ``Service``."""

    def __init__(self, service: Service, uploads: Uploads | None = None, jobs: Callable[[], list] = list,
                 waiting: Callable[[], list] = list):
        self.service = service
        # the job list: requests waiting in the queue (session, function, inputs: ``app.gradio_patches.queue_waiting``)
        # and those this server ran or runs (``app.jobs``)
        self.waiting, self.board = waiting, JobBoard()
        self.limits = service.limits
        self.uploads = Uploads() if uploads is None else uploads  # what Gradio's upload route wrote
        self.jobs = jobs  # (request, function, inputs) of each event in the queue (``app.gradio_patches.queue_jobs``)
        self.costs = {self.generate: self.generate_cost, self.compare: self.compare_cost, self.xyz_plot: self.plot_cost}

    # -- the checkpoint panel --------------------------------------------------------------------

    def choices(self) -> tuple[list[tuple[str, str]], list[str]]:
        """The dropdown's (label, value) pairs, and the labels newest first. Values are labels: the browser
        never sees the server's paths."""
        found = self.service.checkpoints()
        return [(c.label, c.label) for c in found], [c.label for c in newest_first(found)]

    def checkpoint_note(self, text: str | None) -> tuple[str, object, object]:
        """What the chosen checkpoint is and its scores; its training resolution as the default size."""
        if not text:
            return "No checkpoint chosen.", gr.update(), gr.update()
        try:
            ckpt, info = self.service.info(text)
        except WorkbenchError as e:
            return f"**Cannot use this checkpoint:** {as_markdown(e)}", gr.update(), gr.update()
        parts = [as_markdown(ckpt.label, code=True), as_markdown(KIND_NAMES.get(info.kind, info.kind))]
        if info.architecture:
            parts.append(f"architecture {as_markdown(info.architecture)}")
        if info.resolution:
            parts.append(f"trained at {info.resolution} px")
        if info.has_ema is not None:
            parts.append("EMA and raw weights" if info.has_ema else "raw weights only (no EMA)")
        recommended, line = self.recommended_of(ckpt)
        note = ", ".join(parts) + (f"\n\n{as_markdown(line)}" if line else "") + self.scores_note(content_hash(ckpt))
        return note, *(self.size_slider(info, recommended.get("size")) for _ in range(2))  # width, height

    def size_slider(self, info, recommended_size: int | None):
        """A size slider for the checkpoint's family: the sides the one size rule lets a request ask for (the app's
        limits, in steps of what every model of the family draws sides in multiples of: 8, or 16 for SD3 and
        Flux.1; ``models.generation.drawable_sides``), set to the recommended or trained size, the nearest side on
        the slider where it is not one."""
        lo, hi, step = drawable_sides(family_or_ours(info.family), self.limits.min_size, self.limits.max_size)
        size = recommended_size or info.resolution or lo
        return gr.update(minimum=lo, maximum=hi, step=step, value=min(hi, max(lo, round(size / step) * step)))

    def family_controls(self, text: str | None, sampler: str | None) -> tuple:
        """The Generate tab's sampler and negative prompt for a chosen checkpoint's family: only the samplers that
        fit it (the chosen one kept where it fits), and no negative prompt where the family's guidance has none."""
        try:
            family = family_or_ours(self.service.info(text)[1].family) if text else None
        except WorkbenchError:
            family = None  # the checkpoint note says why it cannot be used
        if family is None:
            return gr.update(), gr.update()
        fits = sampler if sampler in family.samplers else \
            (DEFAULT_SAMPLER if DEFAULT_SAMPLER in family.samplers else family.samplers[0])
        negative = gr.update(interactive=True, placeholder=None) if family.negative_prompt else \
            gr.update(value="", interactive=False, placeholder=f"{family.label} has no negative prompt")
        return gr.update(choices=list(family.samplers), value=fits), negative

    def recommended_of(self, ckpt) -> tuple[dict, str]:
        """The checkpoint's recommended settings within the app's limits, and the line saying they are its
        (``models.generation.recommended_line``), or why they are not used."""
        try:
            recommended = recommended_settings(ckpt)
        except WorkbenchError as e:
            return {}, self.service.for_client(f"its recommended settings are not used: {e}")
        limits = {"guidance": self.limits.max_guidance, "steps": self.limits.max_steps,
                  "size": self.limits.max_size}
        fit = {k: v for k, v in recommended.items() if k not in limits or v <= limits[k]}
        if "size" in fit and fit["size"] < self.limits.min_size:
            del fit["size"]
        return fit, recommended_line(fit)

    def recommended_controls(self, text: str | None) -> tuple:
        """The Generate tab's sampler, steps and guidance set to a chosen checkpoint's recommended ones (each left
        as it is where the checkpoint recommends none)."""
        try:
            fit = self.recommended_of(self.service.open(text))[0] if text else {}
        except WorkbenchError:
            fit = {}  # the checkpoint note says why it cannot be used
        return tuple(gr.update(value=fit[k]) if k in fit else gr.update() for k in ("sampler", "steps", "guidance"))

    def scores_note(self, digest: str) -> str:
        """Markdown lines: each results row of the checkpoint, and its human win rates."""
        lines, metrics = [], self.service.scores.metrics()
        for row in self.service.scores.rows_for(digest):
            shown = " · ".join(s.text() for s in scores_of(row, metrics))
            if shown:
                lines.append(f"- **scores** ({as_markdown(setting_text(row))}): {shown}")  # our numbers
        for w in self.service.scores.win_rates(digest):
            lines.append(f"- **human preference** ({as_markdown(w.question)}, study {as_markdown(w.study)}): "
                         + self.preference_text(w))
        return "\n\n" + "\n".join(lines) if lines else ""

    def preference_text(self, w: WinRate) -> str:
        """A win rate in words, the preferred model first (this one when the rate is 50%): its share of the
        decisive votes with the 95% interval, rounded outward as human-eval's report does."""
        other = as_markdown(self.service.label_of_hash(w.opponent) or "another model", code=True)
        flip = w.rate < 0.5
        first, second = (other, "this checkpoint") if flip else ("this checkpoint", other)
        rate, lo, hi = (1 - w.rate, *(None if v is None else 1 - v for v in (w.hi, w.lo))) if flip else \
            (w.rate, w.lo, w.hi)
        share = (interval_text(100 * rate, 100 * lo, 100 * hi, threshold=50) + "%" if lo is not None
                 else f"{100 * rate:.0f}%")
        verdict = "" if lo is None else f": {first} is preferred" if lo > 0.5 else " (cannot tell yet: the interval " \
            "holds 50%)"
        flips = f", {flip_text(w.flip, True, 'vote')}" if w.flip and lo is not None and lo > 0.5 else ""
        return f"{first} over {second}, {share} of {w.decisive} decisive votes{verdict}{flips}"

    def default_size(self, labels: list[str]) -> int:
        """The training resolution of the newest readable checkpoint (512 without one)."""
        for label in labels[:5]:
            try:
                info = self.service.info(label)[1]
            except WorkbenchError:
                continue
            if info.resolution and self.limits.min_size <= info.resolution <= self.limits.max_size:
                return info.resolution
            break
        return min(512, self.limits.max_size)

    def on_load(self, current: str | None):
        """Each page load lists the checkpoints there are now (training may have written more), in every tab."""
        fresh, newest = self.choices()
        value = current or next(iter(newest), None)
        text, w, h = self.checkpoint_note(value)
        return gr.update(choices=fresh, value=value), gr.update(choices=fresh), gr.update(choices=fresh, value=value), \
            text, w, h

    def lora_labels(self) -> list[str]:
        """The LoRA picker's files, by label (the browser never sees the server's paths), listed afresh."""
        return [f.label for f in self.service.loras.listing()]

    def lora_choices(self):
        return gr.update(choices=self.lora_labels())

    def add_lora(self, prompt: str | None, label: str | None, strength: float | None) -> str:
        """The prompt with the picked LoRA's ``<lora:NAME:STRENGTH>`` tag: its strength changed where the prompt names
        that file already, else the tag added at the end (as A1111's cards add it)."""
        prompt = prompt or ""
        if not label:
            return prompt
        try:
            listing = self.service.loras.listing()
            name = self.service.loras.tag_name(self.service.loras.find(label, listing), listing)
            _, chosen = self.service.loras.chosen(prompt)
            same = [c.name for c in chosen if c.file.label == label]
            strength = 1.0 if strength is None else float(strength)
            if same:
                return with_lora(prompt, same[0], strength)
            return f"{prompt.rstrip()} {lora_tag(name, strength)}".lstrip()
        except WorkbenchError as e:
            raise one_line(WorkbenchError(self.service.for_client(first_line(e)))) from None

    def refresh(self):
        """Every tab's checkpoint list, listed afresh (Generate, Compare, X/Y/Z plot)."""
        fresh = self.choices()[0]
        return (gr.update(choices=fresh),) * 3

    # -- generation ------------------------------------------------------------------------------

    def generate(self, checkpoint: str, weights: str, prompt: str, negative_prompt: str, sampler: str, steps: int,
                 guidance_scale: float, width: int, height: int, seed: int, batch_size: int, parts: str | None = None,
                 refiner: str | None = None, refiner_switch: float | None = None, mode: str | None = None,
                 init_image=None, editor=None, strength: float | None = None, mask_blur: int | None = None,
                 hires_scale: float | None = None, hires_steps: int | None = None, hires_upscaler: str | None = None,
                 clip_skip: int | None = None, vae: str | None = None, controlnet: str | None = None,
                 control_image=None, control_preprocess: str | None = None, control_weight: float | None = None,
                 control_start: float | None = None, control_end: float | None = None, request: gr.Request = None,
                 progress=gr.Progress()):
        """Images from one checkpoint (a single file's other parts from ``parts``, where given; finished by
        ``refiner`` from ``refiner_switch`` of the steps, where given), in ``mode`` (``app.modes``: from the prompt
        with a hires fix where ``hires_scale`` is above 1, from ``init_image``, or inpainting what is painted on
        ``editor``, at ``strength``), steered by ``controlnet`` from ``control_image`` where one is named; image i of the
        batch uses seed + i. Returns (gallery, parameters)."""
        params = params_of(prompt, negative_prompt, sampler, steps, guidance_scale, width, height, seed, batch_size,
                           refiner, refiner_switch)
        progress(0, desc="loading checkpoint")
        try:
            params = replace(params, init=init_of(mode, init_image, editor, strength, mask_blur),
                             hires=hires_of(mode, hires_scale, hires_steps, hires_upscaler, strength),
                             clip_skip=1 if clip_skip is None else clip_skip, vae=vae or "")
            params = replace(params, control=control_request(controlnet, control_image, control_preprocess,
                                                             control_weight, control_start, control_end))
            with self.board.running("Generate", session_of(request), prompt, checkpoint,
                                    size_of(width, height, batch_size)) as job:
                result = self.service.generate(checkpoint, weights, params, session=session_of(request),
                                               client=client_of(request), parts=parts or "",
                                               on_step=self.board.stepping(job, steps_progress(progress)))
        except Exception as e:  # noqa: BLE001 - every failure becomes a message; the server keeps serving
            raise failed("generate", e, self.service.for_client) from None
        log.info("generated %d image(s) in %.1f s", len(result.images), result.seconds)
        return gallery_of(result, [f"seed {r.seed}" for r in result.records])

    def compare(self, checkpoints: list[str], weights: str, prompt: str, negative_prompt: str, sampler: str,
                steps: int, guidance_scale: float, width: int, height: int, seed: int,
                request: gr.Request, progress=gr.Progress()):
        """One image per checkpoint (two to four), same prompt, seed and settings.
        Returns (gallery, A/B slider of the first two, parameters)."""
        params = params_of(prompt, negative_prompt, sampler, steps, guidance_scale, width, height, seed)

        def on_step(k: int, n: int, done: int, total: int) -> None:
            progress((k * total + done, n * total), desc=f"checkpoint {k + 1} of {n}", unit="steps")
            job.done, job.total = k * total + done, n * total

        try:
            names = [str(c) for c in checkpoints] if isinstance(checkpoints, list) else [str(checkpoints)]
            with self.board.running("Compare", session_of(request), prompt, ", ".join(names),
                                    size_of(width, height, len(names))) as job:
                result = self.service.compare(checkpoints, weights, params, session=session_of(request),
                                              client=client_of(request), on_step=on_step)
        except Exception as e:  # noqa: BLE001
            raise failed("compare", e, self.service.for_client) from None
        items, first, texts = gallery_of(result, [f"{r.checkpoint} ({r.weights})" for r in result.records])
        return items, tuple(result.images[:2]), first, texts

    def xyz_plot(self, checkpoint: str, weights: str, prompt: str, negative_prompt: str, sampler: str, steps: int,
                 guidance_scale: float, width: int, height: int, seed: int, x_type: str, x_values: str,
                 y_type: str, y_values: str, z_type: str, z_values: str, batch_size: int, mode: str | None = None,
                 init_image=None, editor=None, strength: float | None = None, mask_blur: int | None = None,
                 hires_scale: float | None = None, hires_steps: int | None = None, hires_upscaler: str | None = None,
                 clip_skip: int | None = None, vae: str | None = None, request: gr.Request = None,
                 progress=gr.Progress()):
        """An X/Y/Z plot: one labelled grid per Z value, and every cell as a PNG with its own parameters, each cell
        drawn in the Generate tab's mode (its init image, mask or hires fix: a strength axis varies its strength).
        Returns (grids, cells, parameters)."""
        params = params_of(prompt, negative_prompt, sampler, steps, guidance_scale, width, height, seed)
        axes = [(x_type, x_values), (y_type, y_values), (z_type, z_values)]

        def on_progress(fraction: float, done: int, n: int) -> None:
            progress(fraction, desc=f"cells {done} of {n}")
            job.done, job.total = done, n

        try:
            params = replace(params, init=init_of(mode, init_image, editor, strength, mask_blur),
                             hires=hires_of(mode, hires_scale, hires_steps, hires_upscaler, strength),
                             clip_skip=1 if clip_skip is None else clip_skip, vae=vae or "")
            with self.board.running("X/Y/Z plot", session_of(request), prompt, checkpoint, size_of(width, height),
                                    unit="cell") as job:
                plot = self.service.xyz_plot(checkpoint, weights, params, axes, batch_size,
                                             session=session_of(request), client=client_of(request),
                                             on_progress=on_progress)
        except Exception as e:  # noqa: BLE001
            raise failed("X/Y/Z plot", e, self.service.for_client) from None
        log.info("X/Y/Z plot of %d cells in %.1f s", len(plot.cells.images), plot.cells.seconds)
        items, first, texts = gallery_of(plot.cells, plot.captions)
        return [(g, f"grid {k + 1} of {len(plot.grids)}") for k, g in enumerate(plot.grids)], items, first, texts

    # -- admission: what a request, and its client, may ask when the request joins the queue ------------------
    # Each cost takes its event's inputs, as the event's handler does; a request whose inputs are wrong costs 0
    # here, and its handler says what is wrong when it runs.

    def generate_cost(self, checkpoint, weights, prompt, negative_prompt, sampler, steps, guidance_scale, width,
                      height, seed, batch_size, parts, refiner, refiner_switch, mode, init_image, editor, strength,
                      mask_blur, hires_scale, hires_steps, hires_upscaler, clip_skip, vae, controlnet=None,
                      control_image=None, control_preprocess=None, control_weight=None, control_start=None,
                      control_end=None) -> int:
        params = params_of(prompt, negative_prompt, sampler, steps, guidance_scale, width, height, seed, batch_size,
                           refiner, refiner_switch)
        return self.service.generate_cost(replace(params, hires=hires_of(mode, hires_scale, hires_steps,
                                                                         hires_upscaler, strength)))

    def compare_cost(self, checkpoints, weights, prompt, negative_prompt, sampler, steps, guidance_scale, width,
                     height, seed) -> int:
        return self.service.compare_cost(checkpoints, params_of(prompt, negative_prompt, sampler, steps,
                                                                guidance_scale, width, height, seed))

    def plot_cost(self, checkpoint, weights, prompt, negative_prompt, sampler, steps, guidance_scale, width, height,
                  seed, x_type, x_values, y_type, y_values, z_type, z_values, batch_size, mode, init_image, editor,
                  strength, mask_blur, hires_scale, hires_steps, hires_upscaler, clip_skip, vae) -> int:
        params = replace(params_of(prompt, negative_prompt, sampler, steps, guidance_scale, width, height, seed),
                         hires=hires_of(mode, hires_scale, hires_steps, hires_upscaler, strength))
        return self.service.plot_cost(checkpoint, weights, params,
                                      [(x_type, x_values), (y_type, y_values), (z_type, z_values)])

    def admit(self, request, cost: Callable, inputs: list) -> list:
        """The event's validations when it joins the queue: all valid, or, for a request over a limit of the
        request's or of its client's (what it has waiting or running), the one-line reason on the prompt."""
        try:
            mine, client = cost_or_zero(cost, inputs), client_of(request)
            held = [cost_or_zero(self.costs[fn], args) for sender, fn, args in self.jobs()
                    if fn in self.costs and client_of(sender) == client]
            check_client(held, mine, self.limits)
        except LimitError as e:
            log.warning("refused for %s: %s", client_of(request), e)
            return [gr.validate(name != "prompt", str(e) if name == "prompt" else "")
                    for name in inspect.signature(cost).parameters]
        return [gr.validate(True, "") for _ in inputs]

    def job_list(self, request: gr.Request = None) -> list[list]:
        """The Jobs panel's rows for the viewer's session (``app.jobs``: what each client sees of others')."""
        waiting = []
        for session, fn, inputs in self.waiting():
            name = getattr(fn, "__name__", "")
            if name in KINDS and len(inputs) > 8:
                checkpoint = ", ".join(map(str, inputs[0])) if isinstance(inputs[0], list) else inputs[0]
                count = inputs[10] if name == "generate" and len(inputs) > 10 else None
                waiting.append((session, KINDS[name], inputs[2], checkpoint, size_of(inputs[7], inputs[8], count)))
        return self.board.rows(session_of(request), waiting)

    def stop(self, request: gr.Request) -> None:
        """End this client's running generation after its current step."""
        self.service.stop(session_of(request))

    @staticmethod
    def select(texts: list[str], evt: gr.SelectData) -> str:
        return texts[evt.index] if isinstance(evt.index, int) and evt.index < len(texts) else ""

    # -- the X/Y/Z plot's helpers ----------------------------------------------------------------

    def axis_picker(self, kind: str):
        """The pick list beside an axis: checkpoints or samplers, for the axis types that name them."""
        from models.generation import SAMPLERS

        if kind == "checkpoint":
            return gr.update(choices=self.choices()[0], value=[], visible=True)
        if kind == "sampler":
            return gr.update(choices=list(SAMPLERS), value=[], visible=True)
        if kind == "lora":  # a run's adapter checkpoints, each by the name its tag gives it
            listing = self.service.loras.listing()
            return gr.update(choices=[self.service.loras.tag_name(f, listing) for f in listing], value=[], visible=True)
        return gr.update(choices=[], value=[], visible=False)

    @staticmethod
    def picked(values: list[str] | None) -> str:
        return "\n".join(values or [])

    def prompt_file(self, path: str | None, x_type: str, y_type: str, z_type: str):
        """A prompt file's prompts on the prompt axis (or the first free one); the upload is deleted once read."""
        if not path:
            return (gr.update(),) * 7
        try:
            prompts = [p.text for p in read_prompt_table(path, self.limits.max_cells, shown_as="upload")]
        except WorkbenchError as e:
            raise one_line(e) from None
        finally:
            self.uploads.discard(path)
        return (None, *on_prompt_axis(prompts, [x_type, y_type, z_type]))

    def prompt_set(self, name: str | None, x_type: str, y_type: str, z_type: str):
        """A shipped prompt set's prompts (DrawBench, PartiPrompts) on the prompt axis, as a prompt file's."""
        if not name:
            return (gr.update(),) * 6
        if name not in PROMPT_SETS:
            raise one_line(WorkbenchError(f"unknown prompt set {shown(name)}: choose one of {', '.join(PROMPT_SETS)}"))
        prompts = [p.text for p in read_prompt_table(name, self.limits.max_cells)]
        return on_prompt_axis(prompts, [x_type, y_type, z_type])

    # -- PNG Info --------------------------------------------------------------------------------

    def png_info(self, image: str | None):
        """A PNG's parameters: (its text, what can be sent to Generate, and notes). The upload is deleted once read."""
        if not image:
            return "", {}, ""
        try:
            text, record, unread = read_png(image)
        except WorkbenchError as e:
            raise one_line(e) from None
        finally:
            self.uploads.discard(image)
        values, notes = settings_from(text, self.service.label_of_hash, record, self.service.lora_name_of_hash,
                                      self.service.vae_of_record, self.service.controlnet_of_record)
        notes = [unread, *notes] if unread else notes
        lines = [f"- checkpoint {as_markdown(values['checkpoint'], code=True)}, found by its model hash"] \
            if values["checkpoint"] else []
        lines += [f"- LoRA {as_markdown(name, code=True)} at {strength:g}, found by its hash"
                  for name, strength in values["loras"]]
        lines += [f"- VAE {as_markdown(values['vae'], code=True)}, found by its name and hash"] if values["vae"] else []
        return text, values, "\n".join(lines + [f"- {as_markdown(n)}" for n in notes])

    def send_to_generate(self, values: dict | None):
        """Every control PNG Info could fill, filled; the Generate tab shown. Controls it could not fill keep theirs."""
        values = values or {}
        updates = [gr.update(value=values[k]) if values.get(k) is not None else gr.update()
                   for k in ("checkpoint", "weights", "prompt", "negative_prompt", "sampler", "steps", "guidance",
                             "width", "height", "seed")]
        note = self.checkpoint_note(values["checkpoint"])[0] if values.get("checkpoint") else gr.update()
        modes, second = ([gr.update(value=values[k]) if values.get(k) is not None else gr.update() for k in keys]
                         for keys in (("mode", "strength", "mask_blur", "hires_scale", "hires_steps", "hires_upscaler",
                                       "clip_skip", "vae"),
                                      ("refiner", "refiner_switch")))
        # the mode's own tab shown: an image to image or inpainting draw needs its image uploaded there again
        tab = gr.Tabs(selected=values["mode"]) if values.get("mode") else gr.update()
        control = [gr.update(value=values[k]) if values.get(k) is not None else gr.update()
                   for k in ("controlnet", "control_preprocess", "control_weight", "control_start", "control_end")]
        return (*updates, gr.update(value=1), note, gr.Tabs(selected="generate-tab"), *modes, tab, *second, *control)

    # -- Scores ----------------------------------------------------------------------------------

    def scores_view(self, metric: str | None, x: str | None = None):
        """On each page load: the metrics some row measured (the one chosen kept while it is there), and the
        chosen one's plot, table, note, compare pages and x axes (``scores_table``)."""
        measured = self.service.scores.measured()
        keys = [m.key for m in measured]
        chosen = metric if metric in keys else "fid" if "fid" in keys else next(iter(keys), None)
        return gr.update(choices=[(m.title(), m.key) for m in measured], value=chosen), *self.scores_table(chosen, x)

    def scores_table(self, metric: str | None, x: str | None = None):
        """(the plot, the table, a note, the compare pages of the models shown, the x axes offered) of one metric
        over every row, plotted against ``x`` (``app.scores.X_AXES``: training step unless the rows have ``x``)."""
        scores = self.service.scores
        measured = {m.key: m for m in scores.measured()}
        chosen = measured.get(metric or "")
        if chosen is None:
            note = "Pick a metric." if measured else ("No scores yet: score checkpoints with `dwb evaluate run CKPT "
                                                      "... --out OUT` and start the app with `--results OUT`.")
            return (score_plot([], Metric("", "")), score_table([], None),
                    " ".join(n for n in (note, skipped_note(scores.skipped())) if n), self.compare_pages(set()),
                    x_axis_choice([]))
        points = points_of(scores.rows(), chosen, self.service.labels_by_hash())
        note = "" if points else (f"{as_markdown(chosen.name)} was measured only for checkpoints with no training "
                                  "step (hub models, exported pipelines), which this plot cannot place: their scores "
                                  "are in the Generate tab's note when they are picked there.")
        offered = x_axes_of(points)
        axis = X_AXES[x] if X_AXES.get(x) in offered else STEP_AXIS
        note = " ".join(n for n in (note, skipped_note(scores.skipped())) if n)
        return score_plot(points, chosen, axis), score_table(points, chosen), note, \
            self.compare_pages({p.model for p in points}), x_axis_choice(offered, axis)

    def select_row(self, metric: str | None, evt: gr.SelectData):
        """The row clicked in the table: (its checkpoint's hash, a note saying what Open in Generate does, the
        button, the compare pages of its model)."""
        row = evt.row_value or []
        chosen = self.service.scores.metrics().get(metric or "")
        points = points_of(self.service.scores.rows(), chosen, self.service.labels_by_hash()) if chosen else []
        point = next((p for p in points if row and [p.digest, str(p.step), p.series] == [row[-1], str(row[1]), row[2]]),
                     None)
        closed = gr.update(interactive=False, value=OPEN_IN_GENERATE)
        if point is None:
            return None, "", closed, gr.update()
        where = f"step {point.step}, {as_markdown(point.score.text())}, {as_markdown(point.series)}"
        if point.checkpoint is None:
            return None, (f"Selected a row at {where}: its checkpoint is not under the app's folders, so it cannot be "
                          "opened."), closed, self.compare_pages({point.model})
        return point.digest, (f"Selected {as_markdown(point.checkpoint, code=True)} at {where}. The button makes it "
                              "the Generate tab's checkpoint and shows that tab."), \
            gr.update(interactive=True, value=f"Open {point.checkpoint} in Generate"), self.compare_pages({point.model})

    def open_in_generate(self, digest: str | None):
        """The selected row's checkpoint in the Generate tab: (checkpoint, note, width, height, the tab shown)."""
        label = self.service.label_of_hash(digest) if digest else None
        if label is None:
            gr.Warning("select a row whose checkpoint is under the app's folders first")
            return gr.update(), gr.update(), gr.update(), gr.update(), gr.update()
        note, w, h = self.checkpoint_note(label)
        return gr.update(value=label), note, w, h, gr.Tabs(selected="generate-tab")

    def compare_pages(self, models: set[str]):
        """Links to `dwb evaluate compare`'s pages of ``models``, served from their results folders
        (``app.results_files``), each opening in a tab of its own; hidden when there is none."""
        links = [f'<li><a href="{html.escape(page_url(folder, page))}" target="_blank" rel="noopener">'
                 f'{html.escape(page.name)}</a></li>' for folder, page in self.service.scores.compare_pages(models)]
        return gr.update(value=f"<p>Compare pages (<code>dwb evaluate compare</code>):</p><ul>{''.join(links)}</ul>"
                         if links else "", visible=bool(links))


def skipped_note(reasons: list[str]) -> str:
    """One line saying how many lines of the results files were skipped, and why the first was."""
    if not reasons:
        return ""
    more = f" ({len(reasons) - 1} more)" if len(reasons) > 1 else ""
    return f"Skipped {len(reasons)} unreadable results row{'s' if len(reasons) > 1 else ''}: " \
        f"{as_markdown(reasons[0])}{more}."


def x_axis_choice(offered: list[XAxis], chosen: XAxis = STEP_AXIS):
    """The Scores tab's x axis radio: the axes the rows can be plotted against, shown when there is a choice."""
    return gr.update(choices=[(a.choice, a.key) for a in offered], value=chosen.key, visible=len(offered) > 1)


def score_table(points: list[ScorePoint], metric: Metric | None):
    """The Scores tab's rows: checkpoint, step, series, value and 95% interval, GPU-hours and dollars where some
    row has them, to 4 significant digits; hash."""
    title = metric.name if metric else "value"
    costs = [a for a in X_AXES.values() if a is not STEP_AXIS and any(p.x(a) is not None for p in points)]
    columns = ["checkpoint", "step", "series", title, "95% interval", *(a.choice for a in costs), "hash"]
    table = pd.DataFrame([{"checkpoint": p.checkpoint or "(not under the app's folders)", "step": p.step,
                           "series": p.series, title: p.score.value, "95% interval": p.score.interval_text(),
                           **{a.choice: p.x(a) for a in costs}, "hash": p.digest} for p in points], columns=columns)
    return table.style.format({c: significant for c in (title, *(a.choice for a in costs))}, na_rep="")


def cost_or_zero(cost: Callable, inputs: list) -> int:
    """``cost(*inputs)``; 0 for inputs it cannot read (LimitError, a request over a limit, goes on up)."""
    try:
        return cost(*inputs)
    except LimitError:
        raise
    except (WorkbenchError, TypeError, ValueError):
        return 0


def on_prompt_axis(prompts: list[str], types: list[str]) -> tuple:
    """Updates of the three axes' types and values: ``prompts`` on the prompt axis, or the first free one."""
    target = types.index("prompt") if "prompt" in types else types.index(NONE) if NONE in types else 0
    types = [*types[:target], "prompt", *types[target + 1:]]
    values = [gr.update(value="\n".join(prompts)) if i == target else gr.update() for i in range(3)]
    return (*(gr.update(value=t) for t in types), *values)


def newest_first(found: list) -> list:
    """Most recently written first: the newest checkpoint is usually the one a user wants to try."""
    def mtime(ckpt) -> float:
        try:
            return ckpt.path.stat().st_mtime
        except (OSError, AttributeError):
            return 0.0

    return sorted(found, key=mtime, reverse=True)
