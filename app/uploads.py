"""Uploads: what Gradio's upload route (``POST /gradio_api/upload``) may keep on the server's disk, per client and
in all, and their deletion once an event reads them or after ``--upload-max-age`` seconds.

Gradio caps each file (``--max-upload-mb``), not how many a client sends: 20 files of 7 MB in one request and 20
more requests wrote 280 MiB in 3.7 s, kept until the sweep. ``UploadLimit``, an ASGI middleware in front of
Gradio's routes, counts each client's live uploads (on disk, or being received) and refuses, with 413 and one
line, an upload that would take its client past ``--max-client-upload-mb`` or the server past
``--max-total-upload-mb``: by its Content-Length before a byte of it is read, or, for a body sent in chunks,
at the chunk that passes the limit. Gradio then deletes what it had written of it, as it does when a client
leaves in the middle of an upload (it did not: each left its partial file in the temporary folder for good).
A client is its peer address (``app.handlers.client_of``).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time

from .gradio_patches import upload_abort

log = logging.getLogger("app")
MiB = 2**20
UPLOAD_ROUTE = "/gradio_api/upload"
MAX_CLIENT_UPLOAD_MB = 32  # four files at --max-upload-mb's 8: PNG Info and a prompt file read one at a time
MAX_TOTAL_UPLOAD_MB = 256  # the temporary folder's share of the disk: eight clients at their limit
BLOCK = 4096


def on_disk(size: int) -> int:
    """What a stored upload takes: its 4 KiB blocks (at least one) and one for its folder (Gradio keeps each
    upload in a folder named by its hash). So many tiny files count too."""
    return BLOCK * (1 + max(1, -(-size // BLOCK)))


class UploadRefused(Exception):
    """An upload over a limit of ``Uploads``; its message is the one line the client gets."""


class Uploads:
    """The uploads Gradio's route wrote (``Blocks.upload_file_set``), whose they are, and the limits on them."""

    def __init__(self, files: set[str] | None = None, *, max_client_mb: int = MAX_CLIENT_UPLOAD_MB,
                 max_total_mb: int = MAX_TOTAL_UPLOAD_MB):
        self.files = set() if files is None else files
        self.max_client, self.max_total = max_client_mb * MiB, max_total_mb * MiB
        self._kept: dict[str, tuple[str, int]] = {}  # path -> (client, bytes counted)
        self._receiving: dict[object, tuple[str, int]] = {}  # an upload request -> (client, bytes so far)
        self._by_client: dict[str, int] = {}
        self._total = 0
        self._lock = threading.Lock()

    def held(self, client: str | None = None) -> int:
        """Bytes of live uploads (kept or being received): the client's, or everyone's."""
        with self._lock:
            return self._total if client is None else self._by_client.get(client, 0)

    def _count(self, client: str, n: int) -> None:
        self._total += n
        self._by_client[client] = self._by_client.get(client, 0) + n
        if not self._by_client[client]:
            del self._by_client[client]

    def receive(self, request: object, client: str, n: int) -> None:
        """Count ``n`` more bytes of an upload being received; UploadRefused (nothing counted) past a limit."""
        with self._lock:
            mine = self._by_client.get(client, 0) + n
            if mine > self.max_client:
                raise UploadRefused(f"this client's uploads on the server would come to {mine / MiB:.1f} MiB; at "
                                    f"most {self.max_client // MiB} MiB at once (dwb app --max-client-upload-mb)")
            if self._total + n > self.max_total:
                raise UploadRefused(f"the server's uploads would come to {(self._total + n) / MiB:.1f} MiB; at most "
                                    f"{self.max_total // MiB} MiB at once (dwb app --max-total-upload-mb)")
            self._count(client, n)
            had = self._receiving.get(request, (client, 0))[1]
            self._receiving[request] = (client, had + n)

    def received(self, request: object, paths: list[str]) -> None:
        """The upload ended: the bytes counted while receiving it give way to the files it left on disk."""
        with self._lock:
            client, n = self._receiving.pop(request, ("", 0))
            self._count(client, -n)
            for path in paths:
                if path in self._kept or not os.path.isfile(path):
                    continue
                size = on_disk(os.path.getsize(path))
                self._kept[path] = (client, size)
                self._count(client, size)

    def _forget(self, path: str) -> None:
        with self._lock:
            self.files.discard(path)
            client, size = self._kept.pop(path, ("", 0))
            self._count(client, -size)

    def discard(self, path: str) -> None:
        """Delete an upload once it is read: nothing a visitor sends is kept or served back. Only files the upload
        route wrote: the same folder holds the images the app made, and those stay."""
        if path in self.files:
            try:
                os.remove(path)
            except OSError:
                pass
            self._forget(path)

    def sweep(self, max_age: float, every: float) -> threading.Thread:
        """Delete, every ``every`` seconds, uploads older than ``max_age`` that no event read (and so deleted):
        a visitor can post files to the upload route without ever calling an event."""
        def sweep() -> None:
            while True:
                time.sleep(every)
                now = time.time()
                for path in list(self.files):
                    try:
                        if now - os.path.getmtime(path) > max_age:
                            os.remove(path)
                            self._forget(path)
                    except FileNotFoundError:
                        self._forget(path)
                    except OSError:
                        continue

        thread = threading.Thread(target=sweep, name="dwb-upload-sweep", daemon=True)
        thread.start()
        return thread


class UploadLimit:
    """ASGI middleware: each request to Gradio's upload route counted against ``uploads``' limits (see above)."""

    def __init__(self, app, uploads: Uploads):
        self.app, self.uploads = app, uploads

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].rstrip("/").endswith(UPLOAD_ROUTE):
            return await self.app(scope, receive, send)
        client, declared, request = (scope.get("client") or ("",))[0], content_length(scope), object()
        try:
            self.uploads.receive(request, client, declared or 0)
        except UploadRefused as e:
            return await refuse(send, e)
        refused: list[UploadRefused] = []
        answer: list[bytes] = []

        async def counted_receive():
            message = await receive()
            if message["type"] == "http.disconnect":
                raise upload_abort("the client left during its upload")  # Gradio deletes what it wrote of it
            if declared is None:  # sent in chunks: counted as they come
                try:
                    self.uploads.receive(request, client, len(message.get("body", b"")))
                except UploadRefused as e:
                    refused.append(e)
                    raise upload_abort(str(e)) from None
            return message

        async def kept_send(message) -> None:
            if refused:
                return  # Gradio's answer to the aborted upload: ours goes instead
            if message["type"] == "http.response.body":
                answer.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counted_receive, kept_send)
        finally:
            self.uploads.received(request, written(b"".join(answer)))
        if refused:
            log.warning("upload refused for %s: %s", client, refused[0])
            await refuse(send, refused[0])


def content_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return max(0, int(value))
            except ValueError:
                return None
    return None


def written(answer: bytes) -> list[str]:
    """The paths the upload route answered with (a JSON list), or none."""
    try:
        paths = json.loads(answer)
    except ValueError:
        return []
    return [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else []


async def refuse(send, e: UploadRefused) -> None:
    body = f"{e}\n".encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
