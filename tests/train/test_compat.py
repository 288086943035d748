"""The library internals `train.common.compat` relies on: a version bump fails here first, by name."""
import inspect
from importlib.metadata import version

import pytest

from train.common import compat


@pytest.mark.parametrize("package", sorted(compat.WRITTEN_FOR))
def test_installed_versions_are_the_ones_compat_was_written_for(package):
    assert version(package) == compat.WRITTEN_FOR[package], (
        f"{package} is {version(package)}; train/common/compat.py was written for {compat.WRITTEN_FOR[package]}: re-read each "
        "entry there against the new version, run the resumption tests, then update WRITTEN_FOR")


def test_the_internals_compat_patches_are_where_it_expects_them():
    from composer import Trainer
    from composer.algorithms.ema import ema as composer_ema
    from streaming import StreamingDataset

    import train.ema  # noqa: F401 - applies compat.patch_composer_ema, as training does

    loop = inspect.getsource(Trainer._train_loop)
    # Composer restores the RNG itself only at an epoch boundary or while spinning a dataloader
    assert "self.state.timestamp.batch_in_epoch == 0 and self._rng_state is not None" in loop
    assert "'train' not in self.state.dataset_resumption" in loop
    # Composer's EMA gathers FSDP weights through this module-level function, which compat replaces
    assert composer_ema.get_model_context_manager is compat.fsdp_full_params  # train.ema applied the patch
    # Streaming records the epoch it iterates last, whatever the sample count it is given
    assert "epoch = self.next_epoch - 1" in inspect.getsource(StreamingDataset.state_dict)


def test_gradio_queue_settings_exist_where_compat_sets_them():
    import gradio as gr

    with gr.Blocks() as demo:
        gr.Markdown("x")
    demo.queue()
    compat.calm_gradio_queue(demo)
    queue = demo._queue
    assert queue.sleep_when_free == compat.GRADIO_EVENT_POLL_S
    assert queue.progress_update_sleep_when_free == compat.GRADIO_PROGRESS_INTERVAL_S
    assert queue.compute_analytics_summary(None) is queue.cached_event_analytics_summary


def test_gradio_queue_internals_the_app_counts_clients_by_are_where_compat_reads_them():
    import gradio as gr
    from gradio import queueing

    with gr.Blocks() as demo:
        gr.Markdown("x")
    demo.queue()
    compat.serialize_queue_joins(demo)
    assert compat.queue_jobs(demo) == []
    push = inspect.getsource(queueing.Queue.push)
    # the validator runs inside push, before the event is appended: joins one at a time make the count hold
    assert push.index("fn.validator") < push.index("event_queue.queue.append(event)")
    assert "event.data = body" in push and "self.active_jobs" in inspect.getsource(queueing.Queue.start_processing)
    assert {"request", "fn"} <= set(inspect.signature(queueing.Event.__init__).parameters)


def test_gradio_deletes_a_partial_upload_on_the_exception_compat_raises():
    from gradio import route_utils

    parse = inspect.getsource(route_utils.GradioMultiPartParser.parse)
    handler = parse[parse.index("except MultiPartException"):]
    assert "Path(file.name).unlink()" in handler  # the temporary files written so far are deleted
    assert type(compat.upload_abort("x")) is route_utils.MultiPartException


def test_streaming_shared_memory_made_inside_the_context_is_freed(tmp_path):
    from pathlib import Path

    from streaming import StreamingDataset

    from train.shapes import write_shapes_dataset

    write_shapes_dataset(tmp_path / "d", 8, seed=0, sizes=(16,), n_eval=0, progress=False)
    before = set(Path("/dev/shm").iterdir())
    with compat.release_streaming_shared_memory():
        dataset = StreamingDataset(local=str(tmp_path / "d" / "16"), batch_size=1)
        assert set(Path("/dev/shm").iterdir()) - before  # Streaming made its blocks
    del dataset
    assert not set(Path("/dev/shm").iterdir()) - before  # and they are gone
