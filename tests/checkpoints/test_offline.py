"""A fresh process with HF_HUB_OFFLINE=1, an empty HF_HOME and no network opens a single file and a hub id
from the cache, and both give the image of the same weights; nothing is written into HF_HOME."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ..conftest import REPO

SCRIPT = textwrap.dedent("""
    import socket, sys

    attempts = []

    def no_network(*args, **kwargs):
        attempts.append(args)
        raise OSError("network use while offline")

    socket.socket.connect = socket.socket.connect_ex = no_network
    socket.create_connection = socket.getaddrinfo = no_network

    import os
    import numpy as np
    from diffusers import StableDiffusionPipeline
    from models.checkpoints.hub import resolve_hub
    from models.checkpoints.single_file import load_single_file
    from tests.checkpoints.fixtures import generate

    single_file, hub_cache, hub_id, out = sys.argv[1:]
    np.save(out + "/single.npy", generate(load_single_file(single_file)))  # HF_HOME empty, no HF_HUB_CACHE
    os.environ["HF_HUB_CACHE"] = hub_cache  # read when resolving, as a shell's export before the command would
    snapshot = resolve_hub(hub_id, allow_download=True)
    np.save(out + "/hub.npy", generate(StableDiffusionPipeline.from_pretrained(snapshot, safety_checker=None)))
    print("network attempts:", len(attempts))
""")


@pytest.mark.slow  # a fresh interpreter imports torch, diffusers and transformers: 17 s of CPU, 31 s on a busy machine
def test_single_file_and_hub_id_open_offline_in_a_fresh_process(single_files, hub_cache, tmp_path):
    home = tmp_path / "hf-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(home), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(single_files["sd2"][0]), str(hub_cache.cache),
                           f"{hub_cache.repo}@main", str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "network attempts: 0" in done.stdout  # also those a library caught and fell back from
    single, hub = np.load(tmp_path / "single.npy"), np.load(tmp_path / "hub.npy")
    np.testing.assert_array_equal(single, hub)  # the same weights, the same sampler: the same image
    assert not any(home.rglob("*")), "something was written into HF_HOME"
