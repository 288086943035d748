"""`dwb evaluate compare`'s pages, and the images they show, served from the results folders the app reads.

A compare page (``OUT/compare/<A>-vs-<B>.html``) shows its images by links relative to itself
(``../samples/...``), so it is served from where it lies: ``/results-files/<folder key>/<path in the folder>``,
the key a hash of the folder's path (no server path reaches the page). Served are only regular files that
resolve inside one of the results folders the app reads (``ScoreFiles.results_folders``; a link that leads out
of it is refused), and only compare pages (``compare/*.html``) and images; a results store, a checkpoint or
anything else in the folder gets 404. A page is served with a ``sandbox`` content security policy: no script
runs in it, and it has no access to the app's origin.
"""
from __future__ import annotations

import hashlib
import mimetypes
from pathlib import Path
from urllib.parse import quote

ROUTE = "/results-files/"
IMAGES = {".png", ".jpg", ".jpeg", ".webp"}
POLICY = "sandbox; default-src 'none'; img-src 'self'; style-src 'unsafe-inline'"


def folder_key(folder: Path) -> str:
    return hashlib.sha256(str(folder).encode()).hexdigest()[:16]


def page_url(folder: Path, page: Path) -> str:
    """The page's address, relative to the app's (a proxy's path prefix kept)."""
    return f"{ROUTE.lstrip('/')}{folder_key(folder)}/{quote(page.relative_to(folder).as_posix())}"


def servable(folders: list[Path], key: str, relative: str) -> Path | None:
    """The file ``relative`` names in the folder whose key is ``key``, if it is one the route serves."""
    folder = next((f for f in folders if folder_key(f) == key), None)
    if folder is None or not relative or "\0" in relative:
        return None
    try:
        root, path = folder.resolve(strict=True), (folder / relative).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if not path.is_relative_to(root) or not path.is_file():
        return None
    inside = path.relative_to(root)
    page = inside.suffix == ".html" and inside.parent == Path("compare")
    return path if page or inside.suffix.lower() in IMAGES else None


class ResultsFiles:
    """ASGI middleware: GET (and HEAD) ``/results-files/<key>/<path>`` answered from the results folders that
    ``folders()`` lists at the time of the request; every other request goes on to the app."""

    def __init__(self, app, folders):
        self.app, self.folders = app, folders

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        path = path.removeprefix(scope.get("root_path", "")) if not path.startswith(ROUTE) else path
        if not path.startswith(ROUTE) or scope["method"] not in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        key, _, relative = path[len(ROUTE):].partition("/")
        found = servable(self.folders(), key, relative)  # ASGI's path is decoded already
        if found is None:
            return await answer(send, 404, b"not found", "text/plain; charset=utf-8")
        kind = mimetypes.guess_type(found.name)[0] or "application/octet-stream"
        body = found.read_bytes() if scope["method"] == "GET" else b""
        await answer(send, 200, body, kind + ("; charset=utf-8" if kind == "text/html" else ""),
                     length=found.stat().st_size)


async def answer(send, status: int, body: bytes, kind: str, length: int | None = None) -> None:
    headers = [(b"content-type", kind.encode()), (b"content-length", str(len(body) if length is None else length)
                                                  .encode()), (b"content-security-policy", POLICY.encode()),
               (b"x-content-type-options", b"nosniff"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
