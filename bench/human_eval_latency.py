"""human_eval: serving latency and vote throughput at 50 concurrent raters (target: p99 under 50 ms).

A study of 3 models x 200 DrawBench prompts (600 model pairs, 128 px images) is served by `dwb human-eval
serve` (uvicorn, SQLite in WAL mode) in its own process on 127.0.0.1; this process plays the raters,
each on its own keep-alive connection, like a browser tab, with a minimal HTTP/1.1 client so that the
measuring side takes little of the CPU the server needs. Two runs, each with a fresh vote store:

  paced      50 raters who arrive within the first second and look at each pair: after the pair and
             its two images arrive, and after each vote, they wait an exponential think time (mean
             --think seconds; people take several seconds per answer, so the default 0.5 s is a heavy
             load); 40 votes each.
  saturated  the same 50 raters with no think time at all: the most votes per second the server takes
             on this machine; latency here is mostly queueing behind the other 49.

Latency is measured per request, from writing the request to reading the last byte of the answer.
Each rater starts a session and sends its server-issued key with every request, as the page does.
After each run the votes in the store are compared with the votes sent: every one, once, as sent.

Run: .venv/bin/python bench/human_eval_latency.py [--raters 50 --votes 40 --think 0.5]
Smoke: .venv/bin/python bench/human_eval_latency.py --smoke (12 prompts, 3 raters x 4 votes; every answer 200)
DrawBench's prompts are the set the workbench ships (``--prompts drawbench``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _common import RUN, parse_args, report

MODELS = ("model-a", "model-b", "model-c")
ADMIN_TOKEN = "bench-admin-token-0123"  # the server refuses tokens under 16 characters


def build_study(n_prompts: int) -> Path:
    """Three models' manifests of the first ``n_prompts`` DrawBench prompts (smooth 128 px images), then
    `dwb human-eval create`."""
    from PIL import Image

    from human_eval.samples import read_prompts

    root = RUN.out / f"human-eval-{n_prompts}"
    study = root / "study"
    if (study / "study.json").is_file():
        return study
    prompts = read_prompts("drawbench")[:n_prompts]
    args = []
    yy, xx = np.mgrid[0:128, 0:128] / 127.0
    for m, name in enumerate(MODELS):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(m)
        lines = []
        for i, (prompt, category) in enumerate(prompts):
            c = rng.random((3, 3))
            pixels = np.stack([c[k, 0] * xx + c[k, 1] * yy + c[k, 2] * xx * yy for k in range(3)], -1)  # (128, 128, 3)
            Image.fromarray((255 * pixels / pixels.max()).astype(np.uint8)).save(folder / f"{i:03d}_0.png")
            lines.append(json.dumps({"prompt": prompt, "prompt_index": i, "category": category, "image_index": 0,
                                     "seed": 0, "checkpoint": f"/ckpt/{name}.pt", "model": name, "guidance": 7.5,
                                     "sampler": "ddim", "steps": 50, "width": 128, "height": 128,
                                     "path": f"{i:03d}_0.png"}))
        (folder / "manifest.jsonl").write_text("\n".join(lines) + "\n")
        args += ["--samples", str(folder / "manifest.jsonl")]
    subprocess.run([str(Path(sys.executable).parent / "dwb"), "human-eval", "create", str(study), *args], check=True,
                   stdout=subprocess.DEVNULL)
    return study


class Connection:
    """One keep-alive HTTP/1.1 connection: just enough client for JSON and PNG answers with Content-Length."""

    def __init__(self, port: int):
        self.port = port

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def request(self, method: str, path: str, body: dict | None = None, key: str | None = None) -> tuple[int, bytes, float]:
        data = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + (f"X-Rater-Key: {key}\r\n" if key else "")
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        t0 = time.perf_counter()
        self.writer.write(head.encode() + b"\r\n" + data)
        header = await self.reader.readuntil(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
        payload = await self.reader.readexactly(length)
        return int(lines[0].split()[1]), payload, (time.perf_counter() - t0) * 1000

    def close(self) -> None:
        self.writer.close()


async def rater(port: int, label: str, votes: int, think: float, images: bool, times: dict, rng: random.Random,
                sent_votes: dict) -> None:
    conn = Connection(port)
    await conn.open()
    key = None

    async def timed(kind: str, method: str, path: str, body: dict | None = None) -> bytes:
        status, payload, ms = await conn.request(method, path, body, key)
        if status != 200:
            raise RuntimeError(f"{kind}: {status} {payload[:200]!r}")
        times[kind].append(ms)
        return payload

    async def pause() -> None:
        if think:
            await asyncio.sleep(rng.expovariate(1 / think))

    if think:
        await asyncio.sleep(rng.uniform(0, 2 * think))  # raters arrive over a second or so, not in one instant
    session = json.loads(await timed("session", "POST", "/api/session", {"rater": label}))
    name, key = session["rater"], session["key"]
    sent = 0
    while sent < votes:
        pair = json.loads(await timed("next", "GET", f"/api/next?rater={name}"))
        if pair["done"]:
            break
        if images:
            for url in pair["images"]:
                await timed("image", "GET", url)
        for q in pair["questions"]:
            await pause()
            answer = rng.choice(("A", "B", "none"))
            await timed("vote", "POST", "/api/vote", {"rater": name, "pair": pair["pair"], "question": q["id"],
                                                      "answer": answer, "response_ms": 1000})
            sent_votes[name, pair["pair"], q["id"]] = answer
            sent += 1
    conn.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def wait_listening(server: subprocess.Popen, port: int, limit_s: float = 120.0) -> None:
    """Until the server accepts connections (its start-up imports take seconds, more on a busy machine)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"dwb human-eval serve exited with status {server.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"dwb human-eval serve did not listen on port {port} within {limit_s:.0f} s")


def run(study: Path, raters: int, votes: int, think: float, images: bool, seed: int) -> dict:
    for f in study.glob("votes.sqlite*"):
        f.unlink()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([str(Path(sys.executable).parent / "dwb"), "human-eval", "serve", str(study), "--port",
                               str(port), "--admin-token", ADMIN_TOKEN], stdout=subprocess.DEVNULL)
    try:
        wait_listening(server, port)
        times: dict[str, list[float]] = {"session": [], "next": [], "image": [], "vote": []}
        sent_votes: dict[tuple[str, str, str], str] = {}
        cpu0, t0 = cpu_seconds(server.pid), time.perf_counter()

        async def main() -> None:
            await asyncio.gather(*(rater(port, f"bench{i:03d}", votes, think, images, times, random.Random(seed + i),
                                         sent_votes) for i in range(raters)))

        asyncio.run(main())
        wall, cpu = time.perf_counter() - t0, cpu_seconds(server.pid) - cpu0
    finally:
        server.terminate()
        server.wait(10)
    check_stored(study, sent_votes, raters * votes)
    requests = sum(len(v) for v in times.values())
    out = {"raters": raters, "votes_per_rater": votes, "think_s": think, "wall_s": round(wall, 2),
           "votes": len(times["vote"]), "votes_per_s": round(len(times["vote"]) / wall, 1),
           "requests_per_s": round(requests / wall, 1), "server_cpu_ms_per_request": round(1000 * cpu / requests, 3)}
    for kind, ms in times.items():
        if ms:
            out[f"{kind}_ms"] = {"p50": round(float(np.percentile(ms, 50)), 2), "p99": round(float(np.percentile(ms, 99)), 2),
                                 "max": round(max(ms), 2), "n": len(ms)}
    out["_times"] = times
    return out


def check_stored(study: Path, sent: dict, expected: int) -> None:
    """The store holds exactly the votes sent: each once, with the answer sent."""
    with sqlite3.connect(study / "votes.sqlite") as conn:
        stored = conn.execute("SELECT rater_id, pair_id, question, answer FROM votes").fetchall()
    if len(sent) != expected or len(stored) != len(sent) or {(r, p, q): a for r, p, q, a in stored} != sent:
        raise SystemExit(f"check failed: {expected} votes meant, {len(sent)} sent, {len(stored)} stored")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        for kind in ("next", "vote", "image"):
            ms = np.sort(r["_times"].get(kind, []))
            if len(ms):
                ax.plot(ms, np.arange(1, len(ms) + 1) / len(ms), label=f"{kind} (p99 {np.percentile(ms, 99):.1f} ms)")
        ax.axvline(50, color="grey", ls="--", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{name}: {r['raters']} raters, {r['votes_per_s']} votes/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raters", type=int, default=50)
    parser.add_argument("--votes", type=int, default=40, help="votes per rater (2 per pair)")
    parser.add_argument("--think", type=float, default=0.5, help="mean think time of the paced run, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=200, help="DrawBench prompts in the study (3 model pairs each)")
    args = parse_args(parser, smoke=dict(prompts=12, raters=3, votes=4, think=0.05))
    study = build_study(args.prompts)
    results = {"paced": run(study, args.raters, args.votes, args.think, True, args.seed),
               "saturated": run(study, args.raters, args.votes, 0.0, False, args.seed)}
    plot(results, RUN.out / "human_eval_latency.png")
    for r in results.values():
        del r["_times"]
    report("human_eval_latency", {"target": "p99 < 50 ms for fetching a pair and submitting a vote, 50 raters",
                                  "prompts": args.prompts,
                                  "model_pairs": math.comb(len(MODELS), 2) * args.prompts,
                                  "plot": str(RUN.out / "human_eval_latency.png"), **results})


if __name__ == "__main__":
    main()
