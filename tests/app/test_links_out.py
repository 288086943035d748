"""Nothing a checkpoint reads lies outside the app's folders: every file the process opens while the app loads a
single file with its NAME.config/ and draws from it, as the kernel saw it; and links out of the folders, in any part
a checkpoint is read from (NAME.config/ beside a single file, the Parts field, the refiner), refused in one line
before anything is read, in the app and in `dwb evaluate watch`."""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from app.generate import GenerationParams
from app.service import Runtime, Service
from models.errors import CheckpointError, WorkbenchError

from ..conftest import REPO, unavailable
from ..family_fixtures import write_sdxl_refiner
from ..families.test_flux_single_file import write_flux_file

PARAMS = GenerationParams("a red circle", sampler="Euler", steps=1, guidance=3.5, width=32, height=32, seed=3)
SDXL_PARAMS = GenerationParams("a red circle", sampler="Euler", steps=2, guidance=4.0, width=32, height=32, seed=3)
OUTSIDE_WORDS = "outside the allowed checkpoint folders"


def config_folder_copy(folder: Path, out: Path) -> Path:
    """A Flux.1 folder as NAME.config/ beside a transformer file: everything but the transformer's weights."""
    return shutil.copytree(folder, out, ignore=lambda where, names: [n for n in names if where.endswith("transformer")
                                                                     and n.endswith(".safetensors")])


def through_a_folder_inside(link: Path, target: Path, hop: Path) -> None:
    """``link`` (a part's folder) becomes a link to ``hop``, a folder inside the app's folders whose files are links
    to ``target``'s, outside them."""
    hop.mkdir()
    for name in os.listdir(target):
        (hop / name).symlink_to(target / name)
    shutil.rmtree(link)
    link.symlink_to(hop, target_is_directory=True)


def link_instead(path: Path, target: Path) -> None:
    """``path`` (a file or folder) becomes a link to ``target``."""
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    path.symlink_to(target, target_is_directory=target.is_dir())


# How NAME.config/ beside a single file leads out of the app's folders
CONFIG_LINKS = {
    "the folder": lambda sidecar, away, hop: link_instead(sidecar, away),
    "a part's folder": lambda sidecar, away, hop: link_instead(sidecar / "text_encoder_2", away / "text_encoder_2"),
    "a file": lambda sidecar, away, hop: link_instead(sidecar / "tokenizer_2" / "tokenizer.json",
                                                      away / "tokenizer_2" / "tokenizer.json"),
    "through a folder inside": lambda sidecar, away, hop: through_a_folder_inside(
        sidecar / "text_encoder_2", away / "text_encoder_2", hop),
}


@dataclass
class Tree:
    root: Path  # the one folder given to the app
    outside: Path  # next to it: a Flux.1 pipeline's parts, an SDXL refiner, an SDXL UNet's weights
    whole: Path  # a Flux.1-schnell transformer file with its NAME.config/, all inside the root


@pytest.fixture(scope="module")
def links_tree(family_folders, tmp_path_factory) -> Tree:
    """Under the root: one Flux.1-schnell file whose NAME.config/ lies inside, the same file once for each way its
    NAME.config/ leads out, a file with parts and an SDXL base with a refiner that lead out through a folder inside,
    and an SDXL folder whose UNet weights are a link out."""
    base = tmp_path_factory.mktemp("links-out")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    away = config_folder_copy(family_folders["flux-schnell"], outside / "flux-schnell")
    (root / "whole").mkdir()
    whole, _ = write_flux_file(family_folders["flux-schnell"], root / "whole" / "flux1-schnell.safetensors")
    config_folder_copy(family_folders["flux-schnell"], whole.with_name("flux1-schnell.config"))
    for n, shape in enumerate(CONFIG_LINKS.values()):
        case = root / f"config-{n}"
        shutil.copytree(root / "whole", case, symlinks=True)
        shape(case / "flux1-schnell.config", away, case / "hop")
    parts = root / "parts"  # the file alone, its parts in a folder beside it
    parts.mkdir()
    shutil.copy(whole, parts / "flux1-schnell.safetensors")
    shutil.copytree(family_folders["flux-schnell"], parts / "flux-schnell")
    through_a_folder_inside(parts / "flux-schnell" / "text_encoder_2", away / "text_encoder_2", parts / "hop")
    shutil.copytree(family_folders["sdxl"], root / "sdxl")
    weights = Path("unet", "diffusion_pytorch_model.safetensors")  # an SDXL folder whose UNet weights lie outside
    shutil.copytree(family_folders["sdxl"], root / "sdxl-linked")
    link_instead(root / "sdxl-linked" / weights, Path(shutil.copy(family_folders["sdxl"] / weights, outside)))
    refiner = write_sdxl_refiner(outside / "sdxl-refiner", base / "tokenizers")
    shutil.copytree(refiner, root / "sdxl-refiner")
    through_a_folder_inside(root / "sdxl-refiner" / "text_encoder_2", refiner / "text_encoder_2", root / "hop")
    return Tree(root, outside, whole)


# ---------------------------------------------------------------------------------------------
# What the process opens, as the kernel sees it: strace attached to every thread of this process. Python's audit
# hooks see Python's own opens only; safetensors and tokenizers read weights and tokenizer.json from Rust.

OPEN_CALL = re.compile(r'\b(?:open|openat|openat2|creat)\((?:(?:AT_FDCWD|\d+)(?:<([^>]*)>)?, )?"((?:[^"\\]|\\.)*)"')
OPENED = re.compile(r"= \d+<([^>]*)>")


def allow_tracers(anyone: bool) -> None:
    """Where Yama restricts ptrace to ancestors, let a child (strace) attach to this process, or no longer."""
    try:  # PR_SET_PTRACER: PR_SET_PTRACER_ANY, or 0
        ctypes.CDLL(None, use_errno=True).prctl(0x59616D61, ctypes.c_ulong(-1 if anyone else 0), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def traced_by(pid: int) -> bool:
    """Whether every thread of this process is traced by ``pid``."""
    for task in Path("/proc/self/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue  # a thread that has ended
        if f"TracerPid:\t{pid}\n" not in status:
            return False
    return True


@contextmanager
def files_opened(log: Path):
    """The list of every path this process opens (or tries to) while the block runs: the path asked for, resolved
    from the folder it was asked in, and the file the kernel opened."""
    strace = shutil.which("strace")
    if strace is None:
        unavailable("strace is not installed (scripts/setup-test-deps.sh installs it)")
    allow_tracers(True)
    tracer = subprocess.Popen([strace, "-f", "-qq", "-y", "-s", "65535", "-e", "trace=open,openat,openat2,creat",
                               "-o", str(log), "-p", str(os.getpid())], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not traced_by(tracer.pid):
        if tracer.poll() is not None or time.monotonic() > deadline:
            tracer.kill()
            unavailable(f"strace cannot attach to the test process: {tracer.communicate()[1].strip()[:200]}")
        time.sleep(0.01)
    opened: list[str] = []
    try:
        yield opened
    finally:
        tracer.send_signal(signal.SIGINT)  # detaches from every thread
        tracer.communicate(timeout=60)
        allow_tracers(False)
    for line in log.read_text().splitlines():
        if (call := OPEN_CALL.search(line)) is not None:
            opened.append(os.path.realpath(os.path.join(call[1] or os.getcwd(), call[2])))
        if (result := OPENED.search(line)) is not None:
            opened.append(result[1])


# What any process reads, whatever it runs: the kernel's files, the dynamic loader's and shared libraries, time zones
SYSTEM = [Path(p) for p in ("/proc", "/sys", "/dev", "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/share/zoneinfo",
                            "/etc/ld.so.cache", "/etc/localtime")]


def outside_of(opened: list[str], allowed: list[Path]) -> list[str]:
    """The paths of ``opened`` under none of ``allowed`` nor ``SYSTEM``; the import path's folders (listed as modules
    are imported) count as allowed too."""
    folders = {Path(os.path.realpath(p or ".")) for p in sys.path}
    return sorted({p for p in opened if Path(p) not in folders
                   and not any(Path(p).is_relative_to(a) for a in [*allowed, *SYSTEM])})


def refusal_of(call) -> WorkbenchError | None:
    """The WorkbenchError ``call`` raises, or None where it runs through."""
    try:
        call()
    except WorkbenchError as e:
        return e
    return None


def test_every_file_the_app_opens_for_a_single_file_and_its_config_folder_is_under_its_folders(links_tree, tmp_path,
                                                                                               monkeypatch):
    """The app draws from a file with NAME.config/ beside it, then is asked for the same file whose NAME.config/ is a
    link to a folder outside (refused): nothing it opened for either lies outside its folders."""
    from models.checkpoints import hub_cache

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    app = Service([links_tree.root], cache_size=1, runtime=Runtime("cpu", torch.float32))
    with files_opened(tmp_path / "strace.log") as opened:
        made = app.generate("whole/flux1-schnell.safetensors", "auto", PARAMS)
        refused = refusal_of(lambda: app.generate("config-0/flux1-schnell.safetensors", "auto", PARAMS))
    private = [Path(p) for p in opened if Path(p).parent == Path(tempfile.gettempdir())
               and Path(p).name.startswith("dwb-")]  # the loader's own temporary folders
    python = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), REPO}  # the interpreter and the code
    assert outside_of(opened, [links_tree.root, *python, *private, hub_cache().resolve()]) == []
    assert len(made.images) == 1 and np.asarray(made.images[0]).std() > 0 and refused is not None
    # the record holds what the Rust readers open: the file, NAME.config/'s weights and T5's tokenizer.json
    sidecar = links_tree.whole.with_name("flux1-schnell.config")
    rust = {links_tree.whole, *sidecar.rglob("*.safetensors"), *sidecar.rglob("tokenizer.json")}
    assert {p.resolve() for p in rust} <= {Path(p) for p in opened}


def refused_in_one_line(app: Service, call) -> str:
    """The one line a client is shown for a refused request; nothing is loaded."""
    with pytest.raises(WorkbenchError) as refused:
        call()
    message = str(refused.value)
    assert "\n" not in message and app.for_client(message) == message  # no server path in it
    assert len(app.cache) == 0
    return message


@pytest.mark.parametrize("how", list(CONFIG_LINKS))
def test_a_single_file_whose_config_folder_links_out_is_refused_in_one_line_and_nothing_is_drawn(links_tree, how):
    """P6: the file inside the app's folder, its NAME.config/ leading out (the folder itself a link, or a folder or
    file inside it, or a link to a folder inside whose files are links out)."""
    app = Service([links_tree.root], cache_size=1)
    name = f"config-{list(CONFIG_LINKS).index(how)}/flux1-schnell.safetensors"
    for call in (lambda: app.generate(name, "auto", PARAMS), lambda: app.info(name)):
        message = refused_in_one_line(app, call)
        assert message.startswith(name) and OUTSIDE_WORDS in message and "flux1-schnell.config" in message
        assert str(links_tree.outside) not in message


@pytest.mark.parametrize("part", ["parts", "refiner"])
def test_parts_and_a_refiner_that_link_out_through_a_folder_inside_are_refused_in_one_line(links_tree, part):
    """A part's folder that is a link to a folder inside the app's folders, whose files are links out of them."""
    app = Service([links_tree.root], cache_size=1)
    if part == "parts":
        name = "parts/flux-schnell"
        message = refused_in_one_line(app, lambda: app.generate("parts/flux1-schnell.safetensors", "auto", PARAMS,
                                                                parts=name))
    else:
        name, params = "sdxl-refiner", GenerationParams(**{**SDXL_PARAMS.__dict__, "refiner": "sdxl-refiner"})
        message = refused_in_one_line(app, lambda: app.generate("sdxl", "auto", params))
    assert name in message and OUTSIDE_WORDS in message and "text_encoder_2/" in message


def test_the_list_leaves_out_what_links_out_and_hashing_the_list_opens_nothing_outside(links_tree, tmp_path):
    app = Service([links_tree.root], cache_size=1)
    with files_opened(tmp_path / "strace.log") as opened:
        labels = [c.label for c in app.checkpoints()]
        hashed = app.labels_by_hash()
    assert [p for p in opened if Path(p).is_relative_to(links_tree.outside)] == []
    assert labels == ["parts/flux1-schnell.safetensors", "sdxl", "whole/flux1-schnell.safetensors"]
    assert set(hashed.values()) <= set(labels)


def test_watch_records_a_single_file_whose_config_folder_links_out_of_the_run_as_unreadable(links_tree, tmp_path):
    from evaluate.store import ResultsStore
    from evaluate.watch import Watcher

    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    for step in (2, 4):
        shutil.copy(links_tree.whole, run / f"ep0-ba{step}-rank0.safetensors")
    shutil.copytree(links_tree.whole.with_name("flux1-schnell.config"), run / "ep0-ba2-rank0.config")
    (run / "ep0-ba4-rank0.config").symlink_to(links_tree.outside / "flux-schnell", target_is_directory=True)
    scored, unreadable = [], []
    watcher = Watcher(run.parent, store=ResultsStore(tmp_path / "results"),
                      score=lambda ckpt: scored.append(ckpt.path.name),
                      record_unreadable=lambda ckpt, e: unreadable.append((ckpt.path.name, e)), settle=0)
    watcher.poll_once()
    assert scored == ["ep0-ba2-rank0.safetensors"]
    [(name, error)] = unreadable
    assert name == "ep0-ba4-rank0.safetensors" and isinstance(error, CheckpointError)
    assert "\n" not in str(error) and "ep0-ba4-rank0.config" in str(error) and "outside" in str(error)
