"""The suite's one harness for servers: a real process started as users start it (`dwb app`, `dwb human-eval
serve`, moto's S3 server), on 127.0.0.1 and a port free at the time, waited for until it answers, its output
kept in a log file, stopped at the end. The fixtures of each area say which command and which URL answers."""
from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the one port helper of the suite)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(port: int, data: bytes = b"") -> socket.socket:
    """A raw TCP connection to a server on 127.0.0.1 that has sent ``data`` (a request cut short, say)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(data)
    return sock


def still_open(sockets: list[socket.socket], seconds: float) -> list[socket.socket]:
    """The sockets the server has not closed (no EOF, no reset) after watching them for `seconds`."""
    left = set(sockets)
    with selectors.DefaultSelector() as watch:
        for sock in sockets:
            watch.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + seconds
        while left and (wait := deadline - time.monotonic()) > 0:
            for key, _ in watch.select(wait):
                try:
                    data = key.fileobj.recv(65536)
                except ConnectionError:
                    data = b""
                if not data:
                    watch.unregister(key.fileobj)
                    left.discard(key.fileobj)
    return [s for s in sockets if s in left]


class ServerExited(RuntimeError):
    """The server process ended before it answered; ``output`` is what it wrote (stdout and stderr)."""

    def __init__(self, returncode: int, output: str):
        super().__init__(f"server exited ({returncode}): {output[-2000:]}")
        self.returncode, self.output = returncode, output


class ServerProcess:
    """``argv`` in a subprocess (which must listen on 127.0.0.1:``port``), ready once ``ready_path`` answers 200.

    Its stdout and stderr go to ``log`` (a temporary file when none is given, removed when stopped): a file,
    not a pipe, so a chatty server never blocks on a pipe nobody reads, and a test can read what it said.
    """

    def __init__(self, argv: list, *, port: int, ready_path: str = "/", timeout: float = 30.0, log: Path | None = None,
                 env: dict | None = None, cwd: Path | None = None):
        self.argv, self.port, self.ready_path, self.timeout = [str(a) for a in argv], port, ready_path, timeout
        self.env, self.cwd = env, cwd
        self.url = f"http://127.0.0.1:{port}"
        self.log, self._own_log = log, log is None
        self.proc: subprocess.Popen | None = None

    def launch(self):
        """Start the process without waiting for it (a test may do other work while it starts)."""
        if self.log is None:
            fd, name = tempfile.mkstemp(prefix="dwb-server-", suffix=".log")
            os.close(fd)
            self.log = Path(name)
        self._out = open(self.log, "w")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
        self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=env, stdout=self._out, stderr=subprocess.STDOUT,
                                     text=True)
        return self

    def wait_ready(self, timeout: float | None = None):
        """Return once ``ready_path`` answers 200 (within ``timeout`` s); ``ServerExited`` if the process ends first."""
        timeout = timeout or self.timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                output = self.output()
                self.stop()
                raise ServerExited(self.proc.returncode, output)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    return self
            time.sleep(0.1)
        output = self.output()
        self.stop()
        raise RuntimeError(f"{self.argv[0]} did not answer within {timeout} s: {output[-2000:]}")

    def start(self, timeout: float | None = None):
        return self.launch().wait_ready(timeout)

    def output(self) -> str:
        """What the process has written so far (stdout and stderr, in order)."""
        return self.log.read_text() if self.log and self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, as in a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s; closes (and removes a temporary) log."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc and not self._out.closed:
            self._out.close()
            if self._own_log:
                self.log.unlink(missing_ok=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
