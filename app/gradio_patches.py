"""Gradio's internals that `dwb app` corrects or reads, written against Gradio 6.17.3 (the app's own: nothing
else serves Gradio). `tests/train/test_compat.py` fingerprints each upstream function named below and fails,
naming the patch, when one changes. No upstream issue was found for any of them.

**The request queue's wake-ups** (``calm_gradio_queue``). ``gradio.queueing.Queue.start_processing`` looks for an
event to start every ``sleep_when_free`` (1 ms off Windows) and ``Queue.start_progress_updates`` for
progress to send every ``progress_update_sleep_when_free`` (10 ms), both set in ``Queue.__init__``, on the event
loop of the process that runs the pipeline. Each wake-up takes the GIL (and, on a small CPU, a core) from the
denoising thread. Measured on 2 cores: with a 1 kHz asyncio loop in the process the same pipeline call took
7-25% longer, and a request to the app made ~1,400-2,000 context switches instead of ~180. The intervals are set
to 5 ms (new events) and 100 ms (progress, like tqdm's ``mininterval``), and the pandas summary
``Queue.compute_analytics_summary`` rebuilds after every event for the monitoring dashboard (2-9 ms holding the
GIL, growing with the history), which `dwb app` does not serve, is skipped: the cached one is returned.

**A client's share of the queue** (``serialize_queue_joins``, ``queue_jobs``). `dwb app` counts what each client
has waiting or running when it asks to join the queue (an event's ``validator``, which ``Queue.push`` runs before
it appends the event). ``queue_jobs`` lists the queue's waiting events (``event_queue_per_concurrency_id``) and
the running ones (``active_jobs``) with their HTTP request, function and raw inputs (``Event.request``,
``Event.fn``, ``Event.data``). ``Queue.push`` awaits between running the validator and appending the event, so two
joins at once could each pass a count that missed the other: ``serialize_queue_joins`` makes joins one at a time
(an asyncio lock around the queue's ``push``; a validator takes microseconds to milliseconds). The app's job list
reads the waiting events the same way, with their ``Event.session_hash`` (``queue_waiting``).

**The upload route, stopped mid-body** (``upload_abort``). ``gradio.route_utils.GradioMultiPartParser.parse``
writes each uploaded file to a temporary file as the body arrives, and deletes those files only when the parsing
raises Starlette's ``MultiPartException`` (the route then answers 400, or 413 for its own size cap). A client that
left mid-upload raised ``ClientDisconnect`` instead, and its partial files stayed in the temporary folder for
good. `dwb app`'s upload limit (``app.uploads``) raises ``upload_abort(...)`` from the body's ``receive`` when an
upload passes its limit or its client leaves, so Gradio deletes them.

**The HTTP server** (``serve_gradio_with``). ``gradio.http_server.start_server`` builds its uvicorn ``Config``
itself and takes no HTTP protocol, so the app could not give its server the deadline for a request to arrive and
the cap on connections (``models.common.serving``): 1,500 half-sent requests stayed open for good. Gradio's
``http_server.Server`` (a ``uvicorn.Server``), which ``start_server`` looks up at call time, is replaced by a
subclass that sets the config's ``http`` before uvicorn loads it.
"""
from __future__ import annotations

import asyncio
import logging

# The version this module was written and tested against (`tests/train/test_compat.py` compares it).
WRITTEN_FOR = {"gradio": "6.17.3"}
GRADIO_EVENT_POLL_S = 0.005
GRADIO_PROGRESS_INTERVAL_S = 0.1


def calm_gradio_queue(demo) -> None:
    """After ``demo.queue(...)`` and before ``demo.launch(..., enable_monitoring=False)`` (see above)."""
    queue = demo._queue
    for name, value in (("sleep_when_free", GRADIO_EVENT_POLL_S),
                        ("progress_update_sleep_when_free", GRADIO_PROGRESS_INTERVAL_S)):
        if not hasattr(queue, name):
            raise RuntimeError(f"gradio's queue has no {name}: re-read app/gradio_patches.py against this gradio")
        setattr(queue, name, value)
    if hasattr(queue, "compute_analytics_summary") and hasattr(queue, "cached_event_analytics_summary"):
        queue.compute_analytics_summary = lambda event_analytics: queue.cached_event_analytics_summary
    else:
        logging.getLogger("app").warning("gradio's queue has no analytics summary to skip")


def serialize_queue_joins(demo) -> None:
    """After ``demo.queue(...)``: the queue's joins, validator and append, one at a time (see above)."""
    queue = demo._queue
    push, lock = queue.push, asyncio.Lock()

    async def one_at_a_time(*args, **kwargs):
        async with lock:
            return await push(*args, **kwargs)

    queue.push = one_at_a_time


def serve_gradio_with(http) -> None:
    """Before ``demo.launch``: Gradio's uvicorn server speaks ``http`` (a protocol class or factory; see above)."""
    from gradio import http_server

    base = getattr(http_server.Server, "gradio_server", http_server.Server)  # once, however often it is called
    if not hasattr(base, "install_signal_handlers"):
        raise RuntimeError("gradio's http_server.Server is not the uvicorn server it was: re-read "
                           "app/gradio_patches.py")

    class Server(base):
        gradio_server = base

        def __init__(self, config, *args, **kwargs):
            config.http = http
            super().__init__(config, *args, **kwargs)

    http_server.Server = Server


def upload_abort(message: str) -> Exception:
    """What to raise while Gradio's upload route reads a body, to end it with its partial files deleted (see above)."""
    from starlette.formparsers import MultiPartException

    return MultiPartException(message)


def queue_waiting(demo) -> list[tuple]:
    """(session hash, event function, raw inputs) of every event waiting in Gradio's queue, in the queue's order
    (``Event.session_hash``: the browser page's or API client's session; the app's job list)."""
    queue = demo._queue
    waiting = [event for q in queue.event_queue_per_concurrency_id.values() for event in q.queue]
    return [(e.session_hash, e.fn.fn, list(getattr(e.data, "data", None) or [])) for e in waiting]


def queue_jobs(demo) -> list[tuple]:
    """(HTTP request, event function, raw inputs) of every event waiting in Gradio's queue or running from it."""
    queue = demo._queue
    waiting = [event for q in queue.event_queue_per_concurrency_id.values() for event in q.queue]
    running = [event for job in queue.active_jobs if job for event in job]
    return [(e.request, e.fn.fn, list(getattr(e.data, "data", None) or [])) for e in waiting + running]
