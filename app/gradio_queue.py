"""Gradio's request queue, tuned for a process that also runs the pipeline.

Gradio's queue looks for an event to start every millisecond and for progress to send every 10 ms, on
the event loop of the process that runs the pipeline. Each wake-up takes the GIL (and, on a small CPU,
a core) from the denoising thread, which releases and retakes the GIL around every PyTorch op.
Measured on 2 cores: with a 1 kHz asyncio loop in the process the same pipeline call took 7-25%
longer, and a request to the app made ~1,400-2,000 context switches instead of ~180.

``calm`` keeps Gradio's own loop and changes only its intervals: it looks for new events every 5 ms
(at most 5 ms added to a request's start, 200 wake-ups a second instead of 1,000) and sends progress
at most 10 times a second, like tqdm's default ``mininterval`` (the bar still shows the latest step).
It also skips the pandas summary Gradio rebuilds after every event for its monitoring dashboard,
which `dwb app` does not serve.
"""
from __future__ import annotations

import logging

import gradio

log = logging.getLogger("app")
EVENT_POLL_S = 0.005
PROGRESS_INTERVAL_S = 0.1


def calm(demo: gradio.Blocks) -> None:
    """After ``demo.queue(...)`` and before ``demo.launch(..., enable_monitoring=False)``."""
    queue = demo._queue
    for name, value in (("sleep_when_free", EVENT_POLL_S), ("progress_update_sleep_when_free", PROGRESS_INTERVAL_S)):
        if hasattr(queue, name):
            setattr(queue, name, value)
        else:  # another Gradio: its queue keeps its own timing
            log.warning("gradio %s: its queue has no %s; keeping its timing", gradio.__version__, name)
    if hasattr(queue, "compute_analytics_summary") and hasattr(queue, "cached_event_analytics_summary"):
        # 2-9 ms holding the GIL after each event (growing with the history), only for /monitoring.
        queue.compute_analytics_summary = lambda event_analytics: queue.cached_event_analytics_summary
