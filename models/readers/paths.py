"""The one judge of a local path that data from elsewhere leads to: a file a folder's listing found, a name written
in the data (a ``save_to_disk`` folder's ``state.json``, an MDS index's shards, a tar member)."""
from __future__ import annotations

import stat
from pathlib import Path, PurePosixPath


def unsafe_name(name: str) -> bool:
    """A file name from elsewhere (a tar member, an object key) that leads out of its folder: absolute, with a
    ``..`` part, a backslash or a NUL."""
    path = PurePosixPath(name)
    return path.is_absolute() or ".." in path.parts or "\\" in name or "\x00" in name


def outside_root(root: str | Path, name: str | Path, links: bool = False) -> str | None:
    """Why the local file ``name`` may not be read as part of the folder ``root``, or None when it may.

    The one judge of every local path a source leads to: a file a folder's listing found, a name written in
    the data (a ``save_to_disk`` folder's ``state.json``, an MDS index's shards). ``name`` is relative to
    ``root`` (``/``-separated). Refused: a name that leads out (absolute, ``..``, backslash, NUL), a symbolic
    link on the way below ``root`` (a caption linked to ``/proc/self/environ`` put the process's environment
    into a dataset), and anything but a regular file. With ``links``, links are followed and only where they
    end is judged (a path into a cache whose files are links to blobs); ``name`` may then be absolute.
    """
    base = Path(root).resolve()  # the root the user named may itself be a link
    if links:
        path = (base / name).resolve()
        if not path.is_relative_to(base):
            return "leads out of its folder"
    else:
        if unsafe_name(str(name)):
            return "leads out of its folder"
        path = base
        for part in PurePosixPath(name).parts:
            path = path / part
            if path.is_symlink():
                return "is a symbolic link"
    try:
        mode = path.stat().st_mode
    except OSError:
        return "does not exist"
    return None if stat.S_ISREG(mode) else "is not a regular file"
