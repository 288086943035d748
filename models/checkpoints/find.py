"""Finding and naming checkpoints: what a reference points at, a run's checkpoints in order, those under roots.

A reference is a local path (a Composer ``.pt`` under any name, a diffusers folder, a single-file
``.safetensors``/``.ckpt``), a Hugging Face hub id (``org/name[@revision]``), or an ``s3://`` URI of a
Composer checkpoint. ``find_checkpoint`` tells which, reading as little as it can: a file's kind comes
from its contents, never from its name. With ``roots`` (the app), a local path is accepted only when it
resolves (``..`` and symlinks followed) under one of them, and only when nothing it reads links outside them
(``check_reads_inside``: a folder's files and folders, a single file's ``NAME.config/``); nothing under a path is
read before that check.
"""
from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import replace
from pathlib import Path

from ..errors import CheckpointError, WorkbenchError
from .composer import read_checkpoint, read_summary, training_batches
from .names import OTHER_RANKS, WEIGHT_SUFFIXES, Checkpoint, in_run_listing, run_label, step_in_name
from .remote import fetch, list_remote, uri_label
from ..readers import METADATA, is_sharded_folder

SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}
log = logging.getLogger("checkpoints")

_kinds: dict[tuple[str, int, int], tuple[str, int | None]] = {}
_unreadable: dict[tuple[str, int, int], str] = {}  # why each unreadable file version is no checkpoint, until told
_kinds_lock = threading.Lock()


def local_kind(path: Path) -> tuple[str, int | None]:
    """(kind, training batches) of a local file or folder, cached by (path, size, mtime)."""
    sharded = is_sharded_folder(path)
    if path.is_dir() and not sharded:
        if (path / "model_index.json").is_file():
            return "diffusers", None
        raise CheckpointError(f"{path} is a folder but neither a diffusers pipeline (model_index.json missing) nor "
                              f"a sharded Composer checkpoint ({METADATA} missing)")
    st = (path / METADATA if sharded else path).stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _kinds_lock:
        if key in _kinds:
            return _kinds[key]
    found, reason = _read_kind(path)
    with _kinds_lock:
        _kinds[key] = found
        if reason:
            _unreadable[key] = reason
    return found


def _read_kind(path: Path) -> tuple[tuple[str, int | None], str | None]:
    """((kind, training batches), why it is unreadable where it is)."""
    from .single_file import is_single_file, read_shapes

    if path.suffix in (".safetensors", ".ckpt") and is_single_file(path):
        return ("single-file", None), None
    try:
        ckpt = read_summary(path)
    except CheckpointError as e:
        if path.suffix in (".safetensors", ".ckpt"):  # the reason as a single file: what its suffix says it is
            try:
                read_shapes(path)
            except CheckpointError as single:
                e = single
        return ("unreadable", step_in_name(path.name)), str(e)
    return (ckpt["kind"], training_batches(ckpt)), None


def unreadable_reason(path: Path) -> str | None:
    """Why a file ``local_kind`` found unreadable is no checkpoint, the first time it is asked for this version of
    the file (None after, and for readable ones): a listing says it once, not at every page load."""
    try:
        st = (path / METADATA if is_sharded_folder(path) else path).stat()
    except OSError:
        return None
    with _kinds_lock:
        return _unreadable.pop((str(path), st.st_size, st.st_mtime_ns), None)


def list_checkpoints(folder: str | Path, kinds: tuple[str, ...] | None = None) -> list[Checkpoint]:
    """A run's checkpoints (``RUN`` or ``RUN/checkpoints``, local or ``s3://``) in training order.

    Every ``.pt``/``.safetensors``/``.ckpt`` file counts, whatever its name, and every sharded checkpoint's
    folder (its DCP index written); links, Composer's
    ``latest-rank0.pt`` (a copy of the newest, where a copy turned the link into a file) and other ranks'
    shards are left out. Files that read as no checkpoint are ``unreadable``, ordered by
    the batch count in their name, if any (so autoresume can set a torn newest file aside).
    """
    if str(folder).startswith("s3://"):
        return list_remote(str(folder))
    folder = Path(folder)
    if (folder / "checkpoints").is_dir():
        folder = folder / "checkpoints"
    if not folder.is_dir():
        raise WorkbenchError(f"checkpoint folder not found: {folder}")
    found = []
    for path in folder.iterdir():
        sharded = is_sharded_folder(path) and not path.name.endswith(".corrupt")  # set aside by autoresume
        if path.is_symlink() or not (sharded or path.is_file() and in_run_listing(path.name)):
            continue
        kind, step = local_kind(path)
        if kinds is None or kind in kinds:
            found.append(Checkpoint(str(path), kind, run_label(path), path, step))
    return sorted(found, key=lambda c: (c.step if c.step is not None else -1, c.path.stat().st_mtime_ns))


def find_checkpoint(ref: str | Path, *, roots: list[Path] | None = None, allow_download: bool | None = None,
                    parts: str | Path | None = None) -> Checkpoint:
    """What ``ref`` points at; with ``roots``, only local paths under them (and hub ids from the cache).

    ``parts`` names where a single file's other parts come from (``--parts``): a diffusers folder or a hub id, found
    as a checkpoint is (under ``roots`` too), checked, and recorded on the checkpoint."""
    found = _find(ref, roots=roots, allow_download=allow_download)
    if parts is None or not str(parts).strip():
        return found
    return replace(found, parts=_parts_of(found, str(parts).strip(), roots, allow_download))


def _parts_of(ckpt: Checkpoint, raw: str, roots: list[Path] | None, allow_download: bool | None) -> Path:
    """The folder ``raw`` names as ``ckpt``'s other parts, checked against the file (one line where it cannot be)."""
    from .family_single_file import check_parts

    if ckpt.kind != "single-file":
        raise CheckpointError(f"{ckpt.label} is a {ckpt.kind} checkpoint, which holds every part: parts are named for "
                              f"single files only")
    try:
        found = _find(raw, roots=roots, allow_download=allow_download)
    except WorkbenchError as e:
        reason = str(e).removeprefix("checkpoint not found: ")
        if reason != str(e):
            raise CheckpointError(f"parts not found: {reason}") from None
        if "is a folder but neither" in reason:  # local_kind's words for a folder without model_index.json
            raise CheckpointError(f"parts {raw}: a folder without model_index.json, not a diffusers pipeline") from None
        raise CheckpointError(f"parts: {e}") from None
    if found.kind not in ("diffusers", "hub"):
        raise CheckpointError(f"parts {raw}: a {found.kind} checkpoint, not a diffusers folder or hub id")
    check_parts(ckpt.path, ckpt.label, found.path, raw)
    return found.path


def _find(ref: str | Path, *, roots: list[Path] | None, allow_download: bool | None) -> Checkpoint:
    raw = str(ref).strip()
    if not raw or "\x00" in raw:
        raise WorkbenchError("no checkpoint given" if not raw else f"not a valid checkpoint reference: {raw!r}")
    if raw.startswith("s3://") or "://" in raw:
        if roots is not None:
            raise WorkbenchError(f"not a local path: {raw}")
        return _local(raw, fetch(raw), label=uri_label(raw))  # fetched once; kind and step from the local copy
    from .hub import hub_label, hub_offline, is_hub_id, resolve_hub

    if roots is not None:
        return _find_for_server(raw, roots, bool(allow_download))
    if os.path.lexists(raw):
        return _local(raw, Path(raw))
    if is_hub_id(raw):
        if allow_download is None:
            allow_download = roots is None and not hub_offline()
        try:
            return Checkpoint(raw, "hub", hub_label(raw), resolve_hub(raw, allow_download=allow_download))
        except CheckpointError as e:
            raise CheckpointError(f"checkpoint not found: {raw} is no local path, and as a hub id: {e}") from None
    raise CheckpointError(f"checkpoint not found: {raw}")


def _find_for_server(raw: str, roots: list[Path], allow_download: bool) -> Checkpoint:
    """``find_checkpoint`` for a server (the app): a path under the roots, or a hub id from the cache (or the hub,
    with ``allow_download``). What it answers depends on the text and on what is under the roots, never on the
    server's other files: one message for every path that leaves the roots, one for every name found nowhere,
    and none names a server folder (a hub id's failure is logged for the server's operator)."""
    from .hub import hub_label, resolve_hub, written_as_hub_id

    local = _under_roots(raw, roots)
    if local is not None:
        return _local(raw, local, label=label_under(local, roots))
    if written_as_hub_id(raw):
        try:
            return Checkpoint(raw, "hub", hub_label(raw), resolve_hub(raw, allow_download=allow_download))
        except CheckpointError as e:
            log.warning("hub id %s: %s", raw, e)
        where = "on the Hugging Face hub" if allow_download else "in the server's Hugging Face cache"
        raise CheckpointError(f"checkpoint not found: {raw} (not under the allowed folders, nor a pipeline {where})")
    raise CheckpointError(f"checkpoint not found: {raw}")


def _local(raw: str, path: Path, label: str | None = None) -> Checkpoint:
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {raw}")
    kind, step = local_kind(path)
    if kind == "unreadable":
        raise_reason(path)
    return Checkpoint(raw, kind, label or run_label(path), path, step)


def raise_reason(path: Path) -> None:
    """Why a file is no checkpoint, in one line: as a single file (by its suffix), else as a Composer file."""
    if path.suffix in (".safetensors", ".ckpt"):
        from .family_single_file import describe_file

        describe_file(path)
    read_checkpoint(path)


# ---------------------------------------------------------------------------------------------
# Roots: the folders a server may open checkpoints from


def resolve_roots(folders: list[str | Path]) -> list[Path]:
    """The allowed roots, resolved; each must be an existing folder."""
    roots: list[Path] = []
    for folder in folders:
        root = Path(folder).expanduser().resolve()
        if not root.is_dir():
            raise WorkbenchError(f"checkpoint folder not found: {folder} (give existing folders to --checkpoints)")
        if root not in roots:
            roots.append(root)
    if not roots:
        raise WorkbenchError("no checkpoint folders given (use --checkpoints DIR)")
    return roots


def _root_of(path: Path, roots: list[Path]) -> Path | None:
    return next((r for r in roots if path == r or path.is_relative_to(r)), None)


def label_under(path: Path, roots: list[Path]) -> str:
    """A path's name under its root, as the app lists it (prefixed by the root's name when there are several)."""
    root = _root_of(path, roots)
    if path == root:
        return root.name
    rel = path.relative_to(root).as_posix()
    return f"{root.name}/{rel}" if len(roots) > 1 else rel


def _under_roots(raw: str, roots: list[Path]) -> Path | None:
    """The resolved local path ``raw`` names under the roots; None when it names nothing local (a hub id?).

    Absolute paths are taken as they are; relative ones are relative to a root (the first one in which the
    path exists). A path that resolves outside every root (``..`` and symlinks followed) is refused before
    anything is asked of it: whether it exists changes nothing in the message.
    """
    given = Path(raw)
    candidates = [given] if given.is_absolute() else [root / given for root in roots]
    if not given.is_absolute() and given.parts:  # a label of several roots (ROOT_NAME/path), or a root's own name
        candidates += [r.joinpath(*given.parts[1:]) for r in roots if r.name == given.parts[0]]
    try:
        under = [c for c in candidates if _resolves_under(c, roots)]
        if not under:
            raise WorkbenchError(f"{raw} is outside the allowed checkpoint folders")
        existing = [c for c in under if os.path.lexists(c)]
        if not existing and not given.is_absolute():
            return None
        path = (existing or under)[0].resolve()
    except (OSError, RuntimeError, ValueError) as e:
        raise WorkbenchError(f"invalid checkpoint path {raw} ({type(e).__name__})") from None
    check_reads_inside(path, roots, raw)
    return path


def _resolves_under(path: Path, roots: list[Path]) -> bool:
    """Whether ``path`` resolves under a root; one that cannot be resolved (a symlink loop) counts as outside."""
    try:
        return _root_of(path.resolve(), roots) is not None
    except (OSError, RuntimeError, ValueError):
        return False


def first_link_out(path: Path, roots: list[Path]) -> Path | None:
    """The first thing at or under ``path`` that leads outside every root: ``path`` itself where it resolves
    outside, else a link anywhere inside it (links to folders under the roots are followed and their insides judged
    the same way, each real folder once); None where everything stays under the roots. The one judgement of where a
    checkpoint's files may lie, wherever a checkpoint is opened for a server or a watched run."""
    if not _resolves_under(path, roots):
        return path
    seen: set[Path] = set()
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        here = Path(dirpath)
        real = here.resolve()
        if real in seen:  # a folder reached again through a link (or a loop of them): judged already
            dirnames[:] = []
            continue
        seen.add(real)
        for name in dirnames + filenames:
            inside = here / name
            if inside.is_symlink() and not _resolves_under(inside, roots):
                return inside
    return None


def _read_from(path: Path) -> list[tuple[Path, Path]]:
    """What the door reads for the checkpoint at ``path``, each with the folder its messages name it from: the path
    itself (a file, or a folder and all it holds) and, for a single file, ``NAME.config/`` beside it where there is
    one (``family_single_file.parts_folder``)."""
    from .family_single_file import sidecar_folder

    read = [(path, path)]
    if path.suffix in (".safetensors", ".ckpt") and not path.is_dir() and os.path.lexists(sidecar_folder(path)):
        read.append((sidecar_folder(path), path.parent))
    return read


def check_reads_inside(path: Path, roots: list[Path], name: str,
                       folders: str = "the allowed checkpoint folders") -> None:
    """A one-line CheckpointError, naming the checkpoint ``name`` and never what lies outside, where anything the
    checkpoint at ``path`` reads (``_read_from``) leads outside the roots (``first_link_out``)."""
    for tree, named_from in _read_from(path):
        out = first_link_out(tree, roots)
        if out == path:
            raise CheckpointError(f"{name} is outside {folders}")
        if out is not None:
            raise CheckpointError(f"{name} links to {out.relative_to(named_from).as_posix()} outside {folders}")


def _natural(text: str) -> list:
    """Sort key that puts ba2 before ba10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def _holds_denoiser(folder: Path) -> bool:
    """Whether a pipeline folder holds the weights of a denoiser of any family (``unet/``, ``transformer/``): an SD3
    or Flux.1 folder, our own exports included, as well as a UNet's."""
    from ..families import FAMILIES

    return any(any((folder / name).glob("diffusion_pytorch_model*")) for name in {f.denoiser for f in FAMILIES})


def discover(roots: list[Path], max_depth: int = 8) -> list[Checkpoint]:
    """Every checkpoint under the roots: Composer files (any name), single files and diffusers folders.

    Hidden folders are skipped, symlinks are not followed into folders, and a symlinked file is listed
    only when it resolves under a root and is not another name for a listed file (``latest-rank0.pt``). A weights
    file that reads as no checkpoint (damaged, hostile, of another kind) is left out, its one-line reason logged
    once per version of the file, by its label; so is a checkpoint that would read anything outside the roots
    (``check_reads_inside``), before anything of it is read.
    """
    found: dict[Path, Checkpoint] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            here = Path(dirpath)
            depth = len(here.relative_to(root).parts)
            if "model_index.json" in filenames:
                if _holds_denoiser(here) and _reads_inside(here, roots):
                    found.setdefault(here, Checkpoint(str(here), "diffusers", label_under(here, roots), here))
                dirnames[:] = []  # a pipeline's subfolders hold its parts, not more checkpoints
                continue
            if "config.json" in filenames and any(n.startswith("diffusion_pytorch_model") for n in filenames):
                dirnames[:] = []  # one diffusers model saved alone (a ControlNet, a VAE): a part, no checkpoint
                continue
            if METADATA in filenames and here != root:  # a sharded Composer checkpoint: its parts are not more
                dirnames[:] = []
                if not _reads_inside(here, roots):
                    continue
                kind, step = local_kind(here)
                if kind != "unreadable":
                    found.setdefault(here, Checkpoint(str(here), kind, label_under(here, roots), here, step))
                elif reason := unreadable_reason(here):
                    log.warning("not listed: %s", reason.replace(str(here), label_under(here, roots)))
                continue
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS and depth < max_depth]
            for name in sorted(filenames):
                if not name.endswith(WEIGHT_SUFFIXES) or OTHER_RANKS.search(name):
                    continue
                path = (here / name).resolve()
                if path in found or _root_of(path, roots) is None or not path.is_file() or \
                        not _reads_inside(path, roots):
                    continue
                kind, step = local_kind(path)
                if kind != "unreadable":
                    found[path] = Checkpoint(str(path), kind, label_under(path, roots), path, step)
                elif reason := unreadable_reason(path):
                    log.warning("not listed: %s", reason.replace(str(path), label_under(path, roots)))
    return sorted(found.values(), key=lambda c: _natural(c.label))


_told_outside: set[str] = set()  # the link-out refusals the server's log has said


def _reads_inside(path: Path, roots: list[Path]) -> bool:
    """Whether a checkpoint ``discover`` found reads nothing outside the roots; where it would, the server's log
    says so once (``not listed: ...``)."""
    try:
        check_reads_inside(path, roots, label_under(path, roots))
    except CheckpointError as e:
        if str(e) not in _told_outside:
            _told_outside.add(str(e))
            log.warning("not listed: %s", e)
        return False
    return True


def with_label(ckpt: Checkpoint, label: str) -> Checkpoint:
    return replace(ckpt, label=label)
