"""Every patch of a library's internals against the library it was written for: a version bump, or an upstream
function a patch replaces or reads changing under it, fails here first, naming the patch to re-read.

The patches live by what they serve (``PATCH_MODULES``); each module's ``WRITTEN_FOR`` names the versions it was
written against. ``UPSTREAM`` fingerprints (the sha256 of its source text, read from the installed file without
importing it) each upstream function a patch replaces or relies on, and names the tests that exercise the patch.
When a fingerprint fails: read the upstream function's new text against the patch's docstring, fix the patch if
needed, run the tests named in its row, then update the fingerprint (and ``WRITTEN_FOR``). The behavioural probes
below check the particular upstream behaviour each patch exists for.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import inspect
import random
import re
from importlib.metadata import version
from pathlib import Path
from typing import NamedTuple

import pytest

from ..conftest import REPO

PATCH_MODULES = ("train.patches.composer", "train.patches.fsdp", "train.patches.fsdp_cpu_ranks",
                 "train.patches.streaming", "app.gradio_patches", "models.common.diffusers_patches")


class Upstream(NamedTuple):
    module: str  # the patch's module
    patch: str  # what in it replaces or relies on the upstream function
    package: str  # the upstream package, as imported
    path: str  # its file, inside the package
    qualname: str  # the function in that file
    sha256: str  # the first 16 hex digits of the sha256 of its source text, when the patch was written
    exercised_by: str  # the tests that run the patch against the library


UPSTREAM = (
    Upstream("train.patches.composer", "RestoreRNG", "composer", "trainer/trainer.py", "Trainer._train_loop",
             "684c2edc25606b99", "tests/train/test_resilience.py, test_multiprocess.py"),
    Upstream("train.patches.composer", "align_dataset_epoch", "streaming", "base/dataset.py",
             "StreamingDataset.state_dict", "d951c17948805082", "tests/train/test_resilience.py"),
    Upstream("train.patches.composer", "align_dataset_epoch", "streaming", "base/dataset.py",
             "StreamingDataset.load_state_dict", "65d5ef0960323dbf", "tests/train/test_resilience.py"),
    Upstream("train.patches.composer", "prompt_remote_latest", "composer", "callbacks/checkpoint_saver.py",
             "CheckpointSaver._save_checkpoint", "5ef5d8755130d296", "tests/train/test_remote.py"),
    Upstream("train.patches.composer", "signal_files_per_node", "composer", "utils/dist.py",
             "get_node_signal_file_name", "86c7b7a7e42245d3", "tests/train/test_scale.py (2 nodes x 2)"),
    Upstream("train.patches.fsdp", "fsdp_flat_params", "torch", "distributed/fsdp/_flat_param.py",
             "FlatParamHandle._use_sharded_views", "b62ca41d96c70cea", "tests/train/test_scale.py"),
    Upstream("train.patches.fsdp", "fsdp_drop_gathered", "torch", "distributed/fsdp/_runtime_utils.py",
             "_post_forward_reshard", "2a493942cc5ba7eb", "tests/train/test_scale.py"),
    Upstream("train.patches.fsdp", "fsdp_drop_gathered", "torch", "distributed/fsdp/_flat_param.py",
             "FlatParamHandle.needs_unshard", "6f94ce3efac22920", "tests/train/test_scale.py"),
    Upstream("train.patches.fsdp", "fsdp_drop_gathered", "torch", "distributed/fsdp/_flat_param.py",
             "FlatParamHandle.reshard", "eaaab397c55c143e", "tests/train/test_scale.py"),
    Upstream("train.patches.fsdp", "fsdp_full_params", "torch", "distributed/fsdp/fully_sharded_data_parallel.py",
             "FullyShardedDataParallel.summon_full_params", "acae0865b2a4840d", "tests/train/test_scale.py"),
    Upstream("train.patches.fsdp", "fsdp_full_params", "torch", "distributed/fsdp/_flat_param.py",
             "FlatParamHandle.uses_sharded_strategy", "512eb49b70840026", "tests/train/test_scale.py"),
    Upstream("train.patches.fsdp", "fsdp_weight_share", "torch", "distributed/fsdp/_flat_param.py",
             "FlatParamHandle._init_shard_metadata", "f43f52f3aeda5ed4", "tests/train/test_scale.py"),
    Upstream("train.patches.fsdp", "fsdp_weight_share", "torch", "distributed/fsdp/_flat_param.py",
             "FlatParameter._init_metadata", "5d566903ebd6e8aa", "tests/train/test_scale.py"),
    Upstream("train.patches.fsdp", "ddp_bucket_bytes", "torch", "nn/parallel/distributed.py",
             "DistributedDataParallel._get_ddp_logging_data", "0820ba312c5d9b19", "tests/train/test_multiprocess.py"),
    Upstream("train.patches.fsdp", "ddp_bucket_bytes", "composer", "distributed/dist_strategy.py",
             "prepare_ddp_module", "3ab43dc4d359370a", "tests/train/test_multiprocess.py"),
    Upstream("train.patches.fsdp_cpu_ranks", "fsdp_on_cpu", "composer", "distributed/dist_strategy.py",
             "prepare_fsdp_module", "b410c251d755b722", "tests/train/test_scale.py"),
    Upstream("train.patches.fsdp_cpu_ranks", "_keep_cpu_weights_when_offloading", "torch",
             "distributed/fsdp/_flat_param.py", "FlatParamHandle.to_cpu", "5dc9fe07f3b478a4",
             "tests/train/test_scale.py"),
    Upstream("train.patches.fsdp_cpu_ranks", "_copy_gathered_optimizer_states", "torch",
             "distributed/fsdp/_optim_utils.py", "_unflatten_orig_param_states", "c05045deaf9c22db",
             "tests/train/test_scale.py"),
    Upstream("train.patches.streaming", "release_streaming_shared_memory", "streaming", "base/shared/memory.py",
             "SharedMemory.__init__", "50269f927dfe2e38", "this file"),
    Upstream("train.patches.streaming", "release_streaming_shared_memory", "streaming", "base/shared/memory.py",
             "SharedMemory.cleanup", "46d4894f24f15575", "this file"),
    Upstream("app.gradio_patches", "calm_gradio_queue", "gradio", "queueing.py", "Queue.__init__",
             "fb3a2736ea764881", "this file, tests/app/test_api.py"),
    Upstream("app.gradio_patches", "calm_gradio_queue", "gradio", "queueing.py", "Queue.compute_analytics_summary",
             "aa25bb95ef67b232", "this file, tests/app/test_api.py"),
    Upstream("app.gradio_patches", "serialize_queue_joins", "gradio", "queueing.py", "Queue.push",
             "4ccc9b9c2df094f1", "tests/app/test_compare_api.py"),
    Upstream("app.gradio_patches", "queue_jobs", "gradio", "queueing.py", "Queue.start_processing",
             "3f80680fafa97f56", "tests/app/test_compare_api.py"),
    Upstream("app.gradio_patches", "queue_waiting", "gradio", "queueing.py", "Event.__init__",
             "3094e0d5d63117f7", "tests/app/test_jobs.py"),
    Upstream("app.gradio_patches", "upload_abort", "gradio", "route_utils.py", "GradioMultiPartParser.parse",
             "4c6de2662d10a3be", "tests/app/test_compare_api.py"),
    Upstream("app.gradio_patches", "serve_gradio_with", "gradio", "http_server.py", "start_server",
             "9f58500037c0055a", "this file, tests/app/test_compare_api.py"),
    Upstream("models.common.diffusers_patches", "flux_single_file_widths", "diffusers", "loaders/single_file_utils.py",
             "convert_flux_transformer_checkpoint_to_diffusers", "e453e98195b9666f",
             "tests/families/test_family_export.py -k flux, test_flux_single_file.py"),
)


def patch_file(module: str) -> str:
    return module.replace(".", "/") + ".py"


@functools.cache
def installed_file(package: str, path: str) -> tuple[str, ast.Module]:
    """The text and syntax tree of a file of an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"{package} is not installed"
    text = (Path(spec.submodule_search_locations[0]) / path).read_text()
    return text, ast.parse(text)


def upstream_source(package: str, path: str, qualname: str) -> str:
    """The source text of ``qualname`` (a function, a class or a method) as the installed file defines it:
    what the library ships, whatever a patch has since put in its place."""
    text, node = installed_file(package, path)
    for name in qualname.split("."):
        found = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and n.name == name]
        assert found, f"{package}/{path} no longer defines {qualname}"
        node = found[0]
    return ast.get_source_segment(text, node)


@pytest.mark.parametrize("module", PATCH_MODULES)
def test_installed_versions_are_the_ones_each_patch_module_was_written_for(module):
    written_for = importlib.import_module(module).WRITTEN_FOR
    for package, written in written_for.items():
        installed = version(package)
        assert installed.split("+")[0] == written, (
            f"{package} is {installed}; {patch_file(module)} was written for {written}: re-read each patch there "
            f"against the new version, run the tests its rows of UPSTREAM in tests/train/test_compat.py name, then update "
            "WRITTEN_FOR and those fingerprints")


@pytest.mark.parametrize("row", UPSTREAM, ids=lambda row: f"{row.patch}-{row.qualname}")
def test_the_upstream_functions_each_patch_relies_on_are_unchanged(row):
    source = upstream_source(row.package, row.path, row.qualname)
    found = hashlib.sha256(source.encode()).hexdigest()[:16]
    assert found == row.sha256, (
        f"{row.package} {version_of(row.package)}'s {row.qualname} ({row.path}) is not the one "
        f"{row.patch} in {patch_file(row.module)} was written against: re-read {row.patch} against it, run "
        f"{row.exercised_by}, then set its fingerprint in tests/train/test_compat.py to {found}")


def version_of(package: str) -> str:
    names = {"composer": "mosaicml", "streaming": "mosaicml-streaming"}
    return version(names.get(package, package))


def test_every_patch_has_its_upstream_fingerprinted():
    """A new patch module, or a new patch in one, has rows in UPSTREAM before it lands."""
    homes = {f"train.patches.{p.stem}" for p in (REPO / "train" / "patches").glob("*.py") if p.stem != "__init__"}
    assert homes | {"app.gradio_patches", "models.common.diffusers_patches"} == set(PATCH_MODULES)
    for module in PATCH_MODULES:
        tree = ast.parse((REPO / patch_file(module)).read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        covered = {row.patch for row in UPSTREAM if row.module == module}
        assert defined == covered, f"{patch_file(module)}: patches without a row in UPSTREAM: {defined - covered}"


# Behavioural probes: what each patch exists for, still the case upstream.

def test_composer_restores_the_rng_only_where_restore_rng_expects():
    from composer import Trainer

    loop = inspect.getsource(Trainer._train_loop)
    # Composer restores the RNG itself only at an epoch boundary or while spinning a dataloader
    assert "self.state.timestamp.batch_in_epoch == 0 and self._rng_state is not None" in loop
    assert "'train' not in self.state.dataset_resumption" in loop
    assert "self._rng_state = checkpoint.load_checkpoint(" in upstream_source("composer", "trainer/trainer.py",
                                                                            "Trainer.__init__")


def test_streaming_records_the_epoch_it_iterated_last():
    from streaming import StreamingDataset

    # Streaming records the epoch it iterates last, whatever the sample count it is given (align_dataset_epoch)
    assert "epoch = self.next_epoch - 1" in inspect.getsource(StreamingDataset.state_dict)


def test_composer_wraps_ddp_with_gradient_buckets_beside_the_gradients():
    # no gradient_as_bucket_view: DDP's default, buckets that copy the gradients (ddp_bucket_bytes counts them)
    source = upstream_source("composer", "distributed/dist_strategy.py", "prepare_ddp_module")
    assert "DistributedDataParallel(module, find_unused_parameters=find_unused_parameters)" in source
    assert "gradient_as_bucket_view" not in source


def test_composer_checkpoint_saver_waits_30_seconds_where_prompt_remote_latest_shortens_it():
    from composer.callbacks import CheckpointSaver

    from train.patches.composer import REMOTE_LATEST_CHECK_S

    assert CheckpointSaver()._symlink_upload_wait_before_next_try_in_seconds == 30.0 > REMOTE_LATEST_CHECK_S
    assert "wait_before_next_try_in_seconds=self._symlink_upload_wait_before_next_try_in_seconds" in upstream_source(
        "composer", "callbacks/checkpoint_saver.py", "CheckpointSaver._save_checkpoint")


def test_composer_signal_file_names_carry_rank_zeros_node_and_each_node_gets_its_own(monkeypatch):
    from composer.utils import dist as composer_dist

    from train.patches.composer import signal_files_per_node

    monkeypatch.delenv("NODE_RANK", raising=False)
    composer_own = getattr(composer_dist.get_node_signal_file_name, "__wrapped__",
                           composer_dist.get_node_signal_file_name)
    shared = composer_own(random.Random(0))
    assert re.fullmatch(r"\._signal_file_node0_[A-Za-z0-9]{6}", shared)  # the name the patch takes apart
    signal_files_per_node()
    monkeypatch.setenv("NODE_RANK", "1")
    assert composer_dist.get_node_signal_file_name(random.Random(0)) == shared.replace("node0", "node1")
    # its callers look it up at call time, in its module (as patched)
    assert "get_node_signal_file_name()" in upstream_source("composer", "utils/dist.py", "busy_wait_for_local_rank_zero")
    assert "dist.get_node_signal_file_name()" in upstream_source("composer", "utils/checkpoint.py", "download_checkpoint")


def test_cpu_ranks_offload_moves_nothing_on_a_cpu():
    """The premise of fsdp_cpu_ranks: a CPU tensor moved to the CPU is itself, and FSDP relies on that move to copy."""
    import torch

    tensor = torch.ones(3)
    assert tensor.cpu() is tensor and tensor.to("cpu") is tensor
    to_cpu = upstream_source("torch", "distributed/fsdp/_flat_param.py", "FlatParamHandle.to_cpu")
    assert to_cpu.index('self.flat_param_to(torch.device("cpu"))') < to_cpu.index("self._free_unsharded_flat_param()")
    unflatten = upstream_source("torch", "distributed/fsdp/_optim_utils.py", "_unflatten_orig_param_states")
    assert "elif not cpu_offload:" in unflatten and "value = value.cpu()" in unflatten
    assert "_unflatten_orig_param_states(" in upstream_source("torch", "distributed/fsdp/_optim_utils.py",
                                                              "_allgather_orig_param_states")
    prepare = upstream_source("composer", "distributed/dist_strategy.py", "prepare_fsdp_module")
    assert "device_id=torch.cuda.current_device()" in prepare
    load, _ = installed_file("composer", "checkpoint/load.py")
    assert "from composer.distributed import prepare_fsdp_module" in load  # imported by name: patched there too


def test_fsdp_flat_parameters_keep_the_counts_fsdp_weight_share_reads():
    from torch.distributed.fsdp._flat_param import FlatParameter

    assert {"_shard_numel_padded", "_unpadded_unsharded_size"} <= set(FlatParameter.__annotations__)
    init, _ = installed_file("torch", "distributed/fsdp/_init_utils.py")
    assert "state._handle = handle" in init


def test_gradio_queue_settings_exist_where_calm_gradio_queue_sets_them():
    import gradio as gr

    from app.gradio_patches import GRADIO_EVENT_POLL_S, GRADIO_PROGRESS_INTERVAL_S, calm_gradio_queue

    with gr.Blocks() as demo:
        gr.Markdown("x")
    demo.queue()
    calm_gradio_queue(demo)
    queue = demo._queue
    assert queue.sleep_when_free == GRADIO_EVENT_POLL_S
    assert queue.progress_update_sleep_when_free == GRADIO_PROGRESS_INTERVAL_S
    assert queue.compute_analytics_summary(None) is queue.cached_event_analytics_summary


def test_gradio_queue_internals_the_app_counts_clients_by_are_where_queue_jobs_reads_them():
    import gradio as gr
    from gradio import queueing

    from app.gradio_patches import queue_jobs, serialize_queue_joins

    with gr.Blocks() as demo:
        gr.Markdown("x")
    demo.queue()
    serialize_queue_joins(demo)
    assert queue_jobs(demo) == []
    push = inspect.getsource(queueing.Queue.push)
    # the validator runs inside push, before the event is appended: joins one at a time make the count hold
    assert push.index("fn.validator") < push.index("event_queue.queue.append(event)")
    assert "event.data = body" in push and "self.active_jobs" in inspect.getsource(queueing.Queue.start_processing)
    assert {"request", "fn"} <= set(inspect.signature(queueing.Event.__init__).parameters)


def test_gradio_deletes_a_partial_upload_on_the_exception_upload_abort_raises():
    from gradio import route_utils

    from app.gradio_patches import upload_abort

    parse = inspect.getsource(route_utils.GradioMultiPartParser.parse)
    handler = parse[parse.index("except MultiPartException"):]
    assert "Path(file.name).unlink()" in handler  # the temporary files written so far are deleted
    assert type(upload_abort("x")) is route_utils.MultiPartException


def test_gradios_server_takes_the_http_protocol_serve_gradio_with_gives_it():
    import uvicorn
    from gradio import http_server

    from app.gradio_patches import serve_gradio_with

    assert "Server(config=config" in upstream_source("gradio", "http_server.py", "start_server")
    protocol, before = object(), http_server.Server
    try:
        serve_gradio_with(protocol)
        server = http_server.Server(config=uvicorn.Config(app=None))
        assert server.config.http is protocol and isinstance(server, uvicorn.Server)
    finally:
        http_server.Server = before


def test_streaming_shared_memory_made_inside_the_context_is_freed(tmp_path):
    from streaming import StreamingDataset

    from train.patches.streaming import release_streaming_shared_memory
    from train.shapes import write_shapes_dataset

    write_shapes_dataset(tmp_path / "d", 8, seed=0, sizes=(16,), n_eval=0, progress=False)
    before = set(Path("/dev/shm").iterdir())
    with release_streaming_shared_memory():
        dataset = StreamingDataset(local=str(tmp_path / "d" / "16"), batch_size=1)
        assert set(Path("/dev/shm").iterdir()) - before  # Streaming made its blocks
    del dataset
    assert not set(Path("/dev/shm").iterdir()) - before  # and they are gone
