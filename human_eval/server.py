"""The rating server: a FastAPI app that shows raters blind pairs and appends their votes.

Rater-facing routes (nothing in them names a model, a checkpoint or a manifest field):

    GET  /                 the rating page (static HTML; the prompt is set with textContent, never parsed)
    GET  /static/{name}    its script and style sheet
    POST /api/session      {"rater": id or null} -> the rater's id (a random one when none is given)
    GET  /api/next         ?rater=ID -> the rater's next pair (or the unfinished one), or {"done": true}
    POST /api/vote         {"rater", "pair", "question", "answer": "A"|"B"|"none", "response_ms"}
    GET  /img/{token}      an image by opaque token: PNG pixels only, no metadata

Each rater walks the pairs in their own random order (`Study.order_for`); which side image *a* appears
on is drawn per impression and stored with it, so resuming shows the same sides again. Admin routes
(token-protected) are in `human_eval.admin`.
"""
from __future__ import annotations

import re
import secrets
from functools import lru_cache
from importlib import resources
from typing import Literal

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from .images import ImageCache
from .store import Impression, Store
from .study import Study

RATER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
TOKEN = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
MAX_BODY = 4096  # bytes; a vote is about 150
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"default-src 'self'; img-src 'self'; script-src 'self'; style-src 'self'; "
                                 b"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
]
STATIC = {"rate.js": "text/javascript; charset=utf-8", "rate.css": "text/css; charset=utf-8"}


class SessionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rater: str | None = Field(None, max_length=64)


class VoteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rater: str = Field(max_length=64)
    pair: str = Field(max_length=64)
    question: str = Field(max_length=32)
    answer: Literal["A", "B", "none"]
    response_ms: int | None = Field(None, ge=0, le=86_400_000)


class Guard:
    """ASGI wrapper: refuses oversized or unsized request bodies and adds security headers to every answer."""

    def __init__(self, app, max_body: int = MAX_BODY):
        self.app, self.max_body = app, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] in ("POST", "PUT", "PATCH"):
            length = dict(scope["headers"]).get(b"content-length")
            if length is None or not length.isdigit():
                return await _plain(send, 411, b"a request body needs a Content-Length")
            if int(length) > self.max_body:
                return await _plain(send, 413, b"request body too large")

        async def send_secured(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers += [h for h in SECURITY_HEADERS if h[0] not in names]
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_secured)


async def _plain(send, status: int, body: bytes) -> None:
    detail = b'{"detail":"' + body + b'"}'
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(detail)).encode()),
        (b"connection", b"close"), *SECURITY_HEADERS, (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": detail})


class RatingService:
    """The study, its vote store and its images, shared by every request."""

    def __init__(self, study: Study, store: Store, per_rater: int | None = None):
        self.study, self.store = study, store
        self.images = ImageCache(study.image_files())
        cap = per_rater or study.per_rater or len(study.pairs)
        self.cap = min(cap, len(study.pairs))
        self.n_questions = len(study.questions)
        self.order_for = lru_cache(maxsize=4096)(study.order_for)
        self.known_raters: set[str] = set()

    def require_rater(self, rater: str) -> None:
        if rater in self.known_raters:
            return
        if not RATER_ID.match(rater) or not self.store.has_rater(rater):
            raise HTTPException(404, "unknown rater (start a session first)")
        self.known_raters.add(rater)

    def next_pair(self, rater: str) -> dict:
        self.require_rater(rater)
        shown = self.store.impressions_of(rater)
        unfinished = [imp for imp in shown if len(imp.answers) < self.n_questions]
        completed = len(shown) - len(unfinished)
        if unfinished:
            imp = unfinished[0]
        elif len(shown) >= self.cap:
            return {"done": True, "progress": {"completed": completed, "total": self.cap}}
        else:
            seen = {imp.pair for imp in shown}
            pair = next(p for p in self.order_for(rater) if p not in seen)
            imp = self.store.show(rater, pair, swapped=secrets.randbelow(2) == 1)
        return self.view(imp, completed)

    def view(self, imp: Impression, completed: int) -> dict:
        """What the rater sees of one impression: the prompt and two opaque image URLs, left then right."""
        pair = self.study.by_id[imp.pair]
        left, right = (pair.b, pair.a) if imp.swapped else (pair.a, pair.b)
        return {
            "done": False, "pair": pair.id, "prompt": self.study.prompts[pair.prompt].text,
            "images": [f"/img/{left}", f"/img/{right}"],
            "questions": [{"id": q.id, "text": q.text} for q in self.study.questions],
            "answered": imp.answers, "progress": {"completed": completed, "total": self.cap},
        }

    def vote(self, v: VoteIn) -> dict:
        self.require_rater(v.rater)
        if v.pair not in self.study.by_id:
            raise HTTPException(404, "unknown pair")
        if v.question not in self.study.question_ids:
            raise HTTPException(422, f"unknown question (expected one of: {', '.join(self.study.question_ids)})")
        outcome, first = self.store.vote(v.rater, v.pair, v.question, v.answer, v.response_ms)
        if outcome == "not_shown":
            raise HTTPException(409, "this pair was not shown to this rater")
        if outcome == "conflict":
            raise HTTPException(409, f"already answered with {first}; votes cannot be changed")
        return {"recorded": outcome == "recorded"}


def create_app(study: Study, store: Store, admin_token: str, per_rater: int | None = None) -> Guard:
    """The ASGI app for one study: rater routes, admin routes, security headers and body limits."""
    service = RatingService(study, store, per_rater)
    app = FastAPI(title="human-eval", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    page = resources.files("human_eval").joinpath("static", "rate.html").read_bytes()
    static = {name: resources.files("human_eval").joinpath("static", name).read_bytes() for name in STATIC}

    @app.exception_handler(RequestValidationError)
    async def one_line_validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            return JSONResponse({"detail": "the request body is not valid JSON"}, status_code=422)
        where = ".".join(str(part) for part in first.get("loc", ()) if part not in ("body", "query"))
        return JSONResponse({"detail": f"{where}: {first.get('msg')}" if where else str(first.get("msg"))},
                            status_code=422)

    @app.get("/", response_class=HTMLResponse)
    def index() -> Response:
        return Response(page, media_type="text/html; charset=utf-8")

    @app.get("/static/{name}")
    def static_file(name: str) -> Response:
        if name not in static:
            raise HTTPException(404, "not found")
        return Response(static[name], media_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True}

    @app.post("/api/session")
    def session(body: SessionIn, request: Request) -> dict:
        rater = body.rater.strip() if body.rater and body.rater.strip() else f"r-{secrets.token_hex(6)}"
        if not RATER_ID.match(rater):
            raise HTTPException(422, "rater: use 1-64 letters, digits, '.', '_', '@' or '-'")
        created = service.store.add_rater(rater, request.headers.get("user-agent", ""))
        service.known_raters.add(rater)
        return {"rater": rater, "resumed": not created}

    @app.get("/api/next")
    def next_pair(rater: str = Query(max_length=64)) -> dict:
        return service.next_pair(rater)

    @app.post("/api/vote")
    def vote(body: VoteIn) -> dict:
        return service.vote(body)

    @app.get("/img/{token}")
    def image(token: str) -> Response:
        data = service.images.get(token) if TOKEN.match(token) else None
        if data is None:
            raise HTTPException(404, "not found")
        return Response(data, media_type="image/png", headers={"Cache-Control": "private, max-age=86400, immutable"})

    from .admin import add_admin_routes

    add_admin_routes(app, service, admin_token)
    return Guard(app)
