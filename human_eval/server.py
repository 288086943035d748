"""The rating server: a FastAPI app that shows raters blind pairs and appends their votes.

Rater-facing routes (nothing in them names a model, a checkpoint or a manifest field):

    GET  /                 the rating page (static HTML; the prompt is set with textContent, never parsed)
    GET  /static/{name}    its script and style sheet
    POST /api/session      {"rater": typed id or null} -> a new rater {"rater", "label", "key", "resumed"};
                           {"rater": id, "key": key} -> that rater again (a returning browser, a rater link)
    GET  /api/next         ?rater=ID -> the rater's next pair (or the unfinished one), or {"done": true}
    POST /api/vote         {"rater", "pair", "question", "answer": "A"|"B"|"none"|"good"|"bad", "response_ms"}
                           (the study's answers only: "none", or "good" and "bad" where its ties are good_bad)
    GET  /img/{token}      an image by opaque token: PNG pixels only, at the study's one size, no metadata

`next` and `vote` need the rater's key in the ``X-Rater-Key`` header (`human_eval.raters`); without it
they answer 401 whether or not the id exists. Each rater walks the pairs in their own random order
(`Study.order_for`), or, with adaptive allocation, the next pair of the model pair that needs votes
most (`human_eval.statistics.allocation`); which side image *a* appears on is drawn per impression and stored
with it, so resuming shows the same sides again. Admin routes (token-protected) are in `human_eval.admin`.
"""
from __future__ import annotations

import re
import secrets
import threading
import time
from functools import lru_cache
from importlib import resources
from typing import Literal

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from .statistics.allocation import Allocator
from .errors import HumanEvalError
from .images import ImageCache
from .raters import KEY_HEADER, NewRaterLimit, key_matches, new_rater_id, valid_rater_id
from .store import Impression, Store
from .study import ANSWERS, Study

TOKEN = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
NEW_RATERS_PER_MINUTE = 60  # per client address
ALLOCATION_REFRESH_S = 30.0  # adaptive allocation re-reads the store's counts (other instances' votes) this often
BAD_ID = "rater: use 1-64 letters, digits, '.', '_', '@' or '-'"
NO_KEY = "this rater's key is missing or wrong (start a session on the rating page, or use your rater link)"
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
    rater: str | None = Field(None, max_length=80)  # typed ids are trimmed to at most 64
    key: str | None = Field(None, max_length=64)


class VoteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rater: str = Field(max_length=64)
    pair: str = Field(max_length=64)
    question: str = Field(max_length=32)
    answer: Literal[ANSWERS]  # any study's; the study's own are checked per vote
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

    def __init__(self, study: Study, store: Store, per_rater: int | None = None,
                 new_raters_per_minute: int = NEW_RATERS_PER_MINUTE):
        self.study, self.store = study, store
        self.images = ImageCache(study.image_files(), study.image_size)
        cap = per_rater or study.per_rater or len(study.pairs)
        self.cap = min(cap, len(study.pairs))
        self.n_questions = len(study.questions)
        self.order_for = lru_cache(maxsize=4096)(study.order_for)
        self.known_raters: set[str] = set()
        self.new_raters = NewRaterLimit(new_raters_per_minute)
        self.allocator: Allocator | None = None
        if study.allocation == "adaptive":
            main = {p.id: study.models_of(p) for p in study.pairs if p.kind == "main"}
            self.allocator = Allocator(main, study.question_ids, study.target_width)
            self.allocator.load(store.vote_counts())
        self._loaded_at = time.monotonic()
        self._refresh = threading.Lock()

    # who is asking

    def authenticate(self, rater: str, key: str | None) -> None:
        """401 unless `key` is the rater's key; the same answer for ids that exist and ids that do not."""
        if not valid_rater_id(rater):
            raise HTTPException(422, BAD_ID)
        if not key_matches(self.study.secret, rater, key):
            raise HTTPException(401, NO_KEY)
        if rater not in self.known_raters:
            if not self.store.has_rater(rater):
                raise HTTPException(404, "start a session first")
            self.known_raters.add(rater)

    def start_session(self, body: SessionIn, address: str, user_agent: str) -> dict:
        """A returning rater with their key, or a new rater labelled with what was typed (never an existing one)."""
        if body.key is not None:
            rater = body.rater or ""
            if not valid_rater_id(rater):
                raise HTTPException(422, BAD_ID)
            if not key_matches(self.study.secret, rater, body.key):
                raise HTTPException(403, "this rater link is not valid (ask for a new one)")
            created = self.store.add_rater(rater, rater, user_agent)
            self.known_raters.add(rater)
            return {"rater": rater, "label": self.store.label_of(rater), "key": body.key, "resumed": not created}
        label = (body.rater or "").strip()
        if label and not valid_rater_id(label):
            raise HTTPException(422, BAD_ID)
        wait = self.new_raters.take(address)
        if wait:
            raise HTTPException(429, "too many new raters from this address; please try again in a minute",
                                headers={"Retry-After": str(int(wait))})
        rater = new_rater_id()
        while not self.store.add_rater(rater, label or rater, user_agent):  # 48 random bits: a clash is a formality
            rater = new_rater_id()
        self.known_raters.add(rater)
        return {"rater": rater, "label": label or rater, "key": self.study.rater_key(rater), "resumed": False}

    # what they see

    def next_pair(self, rater: str) -> dict:
        shown = self.store.impressions_of(rater)
        unfinished = [imp for imp in shown if len(imp.answers) < self.n_questions]
        completed = len(shown) - len(unfinished)
        if unfinished:
            imp = unfinished[0]
        elif len(shown) >= self.cap:
            return {"done": True, "progress": {"completed": completed, "total": self.cap}}
        else:
            pair = self.next_unseen(rater, {imp.pair for imp in shown})
            imp = self.store.show(rater, pair, swapped=secrets.randbelow(2) == 1)
            if self.allocator is not None:
                self.allocator.shown(pair)
        return self.view(imp, completed)

    def next_unseen(self, rater: str, seen: set[str]) -> str:
        """The rater's next pair in their own order; with adaptive allocation a main pair goes to the model
        pair that needs votes most (its first pair in this rater's order), checks keep their place."""
        unseen = (p for p in self.order_for(rater) if p not in seen)
        first = next(unseen)
        if self.allocator is None or self.study.by_id[first].kind != "main":
            return first
        self.refresh_allocation()
        options: dict[tuple[str, str], str] = {self.study.models_of(self.study.by_id[first]): first}
        for pair_id in unseen:
            pair = self.study.by_id[pair_id]
            if pair.kind == "main":
                options.setdefault(self.study.models_of(pair), pair_id)
        return options[self.allocator.choose(list(options))]

    def refresh_allocation(self) -> None:
        """Re-read vote counts from the store now and then: other instances on the same database take votes too."""
        if time.monotonic() - self._loaded_at > ALLOCATION_REFRESH_S and self._refresh.acquire(blocking=False):
            try:
                self._loaded_at = time.monotonic()
                self.allocator.load(self.store.vote_counts())
            finally:
                self._refresh.release()

    def view(self, imp: Impression, completed: int) -> dict:
        """What the rater sees of one impression: the prompt and two opaque image URLs, left then right."""
        pair = self.study.by_id[imp.pair]
        left, right = (pair.b, pair.a) if imp.swapped else (pair.a, pair.b)
        return {
            "done": False, "pair": pair.id, "prompt": self.study.prompts[pair.prompt].text,
            "images": [f"/img/{left}", f"/img/{right}"],
            "questions": [{"id": q.id, "text": q.text} for q in self.study.questions],
            "answers": list(self.study.answers), "answered": imp.answers, "progress": {"completed": completed, "total": self.cap},
        }

    def vote(self, v: VoteIn) -> dict:
        if v.pair not in self.study.by_id:
            raise HTTPException(404, "unknown pair")
        if v.question not in self.study.question_ids:
            raise HTTPException(422, f"unknown question (expected one of: {', '.join(self.study.question_ids)})")
        if v.answer not in self.study.answers:
            raise HTTPException(422, f"this study does not offer the answer {v.answer} "
                                     f"(expected one of: {', '.join(self.study.answers)})")
        outcome, detail = self.store.vote(v.rater, v.pair, v.question, v.answer, v.response_ms)
        if outcome == "not_shown":
            raise HTTPException(409, "this pair was not shown to this rater")
        if outcome == "conflict":
            raise HTTPException(409, f"already answered with {detail}; votes cannot be changed")
        if outcome == "recorded" and self.allocator is not None:
            self.allocator.record(v.pair, v.question, detail)
        return {"recorded": outcome == "recorded"}


def create_app(study: Study, store: Store, admin_token: str, per_rater: int | None = None,
               new_raters_per_minute: int = NEW_RATERS_PER_MINUTE, secure_cookie: bool = False) -> Guard:
    """The ASGI app for one study: rater routes, admin routes, security headers and body limits."""
    from .admin import add_admin_routes, token_problem

    if problem := token_problem(admin_token):
        raise HumanEvalError(f"the admin token {problem}")
    service = RatingService(study, store, per_rater, new_raters_per_minute)
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
        address = request.client.host if request.client else ""
        return service.start_session(body, address, request.headers.get("user-agent", ""))

    @app.get("/api/next")
    def next_pair(request: Request, rater: str = Query(max_length=64)) -> dict:
        service.authenticate(rater, request.headers.get(KEY_HEADER))
        return service.next_pair(rater)

    @app.post("/api/vote")
    def vote(body: VoteIn, request: Request) -> dict:
        service.authenticate(body.rater, request.headers.get(KEY_HEADER))
        return service.vote(body)

    @app.get("/img/{token}")
    def image(token: str) -> Response:
        data = service.images.get(token) if TOKEN.match(token) else None
        if data is None:
            raise HTTPException(404, "not found")
        return Response(data, media_type="image/png", headers={"Cache-Control": "private, max-age=86400, immutable"})

    add_admin_routes(app, service, admin_token, secure_cookie)
    return Guard(app)
