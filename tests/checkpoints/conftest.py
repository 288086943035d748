"""Session fixtures: one reduced SD 2.x pipeline as a diffusers folder, in a hub cache and as single files
(built by the functions of fixtures.py, which other test areas can use the same way)."""
from __future__ import annotations

from pathlib import Path

import pytest

from .fixtures import HubCache, write_hub_cache, write_reference_folder, write_single_files


@pytest.fixture(scope="session")
def sd2_folder(tmp_path_factory) -> Path:
    return write_reference_folder(tmp_path_factory.mktemp("sd2-folder") / "pipeline")


@pytest.fixture(scope="session")
def single_files(tmp_path_factory, sd2_folder) -> dict[str, tuple[Path, Path]]:
    return write_single_files(tmp_path_factory.mktemp("single-files"), sd2_folder)


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory, sd2_folder) -> HubCache:
    return write_hub_cache(tmp_path_factory.mktemp("hf-cache"), sd2_folder)
