"""The admin dashboard: live results, the chart and the exports, behind a token.

The token comes as ``Authorization: Bearer <token>``, or once as ``/admin?token=<token>``, which sets the
``dwb_admin`` cookie and redirects to a URL without it. The cookie is not the token: it is an expiry time and
an HMAC of it under the token (`session_cookie`), so a cookie read off a browser opens the dashboard until it
expires and reveals nothing that opens it for longer; every instance with the same token accepts it, and a new
token ends every session. Tokens and cookies are compared in constant time. Everything here may name models;
none of it is reachable without the token.
"""
from __future__ import annotations

import hashlib
import hmac
import io
import json
import re
import threading
import time
from html import escape

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from models.common import p_value_text

from .report import (BOTH_BAD_HEADERS, both_bad_rows, interval_only, results_csv, stopping_lines, study_name, summary,
                     votes_csv, votes_flip_text, votes_json)
from .statistics.resampling import REPORT_BOOTSTRAP

COOKIE = "dwb_admin"
MIN_TOKEN = 16  # characters; shorter tokens (an empty token file opened the pages to anyone) are refused
MIN_DISTINCT = 8  # different characters in a token: 16 spaces or "aaaaaaaabbbbbbbb" passed the length check
SESSION_S = 12 * 3600  # an admin cookie opens the dashboard for this long
EXPIRY = re.compile(r"[0-9]{1,12}")  # a cookie's expiry: Unix seconds in ASCII digits (12 reach the year 33658)
REFRESH_S = 30.0  # the dashboard's results are at most this old (the page reloads itself as often)


def _fmt(x, pct: bool = True) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.1f}%" if pct else f"{x:.3g}"


def _interval(iv) -> str:
    """A share's interval in percent as the report prints it (``report.interval_only``)."""
    return interval_only(*(iv or (None, None)))


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<div class='table'><table><tr>{head}</tr>{body}</table></div>"


def _preference_table(comparisons: list[dict]) -> str:
    """Each comparison's votes and the interval the verdicts use."""
    return _table(["question", "model a", "model b", "votes", "a wins", "b wins", "ties", "rate a",
                   "95% Wilson on effective votes", "votes that would flip it", "design effect", "p"],
                  [[c["question"], c["model_a"], c["model_b"], c["votes"], c["wins_a"], c["wins_b"], c["ties"],
                    _fmt(c["rate_a"]), _interval(c["clustered_wilson"]), votes_flip_text(c.get("flip")),
                    _fmt(c["design_effect"], pct=False), p_value_text(c["score_test_p"])] for c in comparisons])


def _other_intervals_table(comparisons: list[dict]) -> str:
    """The intervals and tests beside the verdict's, in a table of their own: with the first one's columns they
    made a table 2,500 px wide that a laptop screen showed a third of."""
    return _table(["question", "model a", "model b", "Wilson", "bootstrap by prompt", "by rater",
                   "by prompt and rater", "tie rate", "sign test p"],
                  [[c["question"], c["model_a"], c["model_b"], _interval(c["wilson"]), _interval(c["bootstrap_prompt"]),
                    _interval(c["bootstrap_rater"]), _interval(c["two_way"]), _fmt(c["tie_rate"]),
                    _fmt(c["sign_test_p"], pct=False)] for c in comparisons])


def dashboard_html(results: dict, counts: dict, exclude: bool) -> str:
    """The dashboard page; every value from the study or the votes is HTML-escaped."""
    toggle = "/admin" if exclude else "/admin?exclude=1"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='30'>",
        f"<title>{escape(study_name(results))}: human-eval admin</title>",
        "<link rel='stylesheet' href='/static/rate.css'></head><body class='admin'>",
        f"<h1>Human evaluation: {escape(study_name(results))}</h1>",
        f"<p>{counts['raters']} raters, {counts['impressions']} pairs shown, {counts['votes']} votes; "
        f"results below computed {escape(results['generated'])} from {results['counts']['votes']} votes. "
        f"Failing raters {'excluded' if exclude else 'included'} (<a href='{toggle}'>toggle</a>). "
        "Downloads: <a href='/admin/votes.csv'>votes.csv</a> <a href='/admin/votes.json'>votes.json</a> "
        "<a href='/admin/results.csv'>results.csv</a> "
        "<a href='/admin/results.json'>results.json</a></p>",
        f"<p id='stopping'>{escape(' '.join(stopping_lines(results)))}</p>",
        f"<img class='chart' alt='preference chart' src='/admin/chart.png{'?exclude=1' if exclude else ''}'>",
        "<h2>Preference (share of decisive votes for model a)</h2>", _preference_table(results["comparisons"]),
        "<h2>Other intervals and tests</h2>", _other_intervals_table(results["comparisons"]),
        "<h2>By category</h2>",
        _table(["question", "model a", "model b", "category", "votes", "rate a", "Wilson 95%", "tie rate"],
               [[c["question"], c["model_a"], c["model_b"], cat["category"], cat["votes"], _fmt(cat["rate_a"]),
                 _interval(cat["wilson"]), _fmt(cat["tie_rate"])] for c in results["comparisons"] for cat in c["categories"]]),
    ]
    for q, found in results.get("both_bad", {}).items():
        parts += [f"<h2>Both bad: {escape(q)}</h2>",
                  *(_table(header, rows) for header, rows in zip(BOTH_BAD_HEADERS, both_bad_rows(found)))]
    for q, rows in results.get("bradley_terry", {}).items():
        parts += [f"<h2>Bradley-Terry: {escape(q)}</h2>", _table(
            ["rank", "model", "score", "95% bootstrap by prompt", "votes that would flip it"],
            [[r["rank"], r["model"], f"{r['score']:+.3f}", f"[{r['interval'][0]:+.3f}, {r['interval'][1]:+.3f}]",
              votes_flip_text(r.get("flip"))] for r in sorted(rows, key=lambda r: r["rank"])])]
    parts += ["<h2>Agreement, checks and planning</h2>", f"<pre>{escape(summary(results))}</pre>",
              "<h2>Raters</h2>", _table(
                  ["rater", "label", "votes", "median response (ms)", "gold pass rate", "self-consistency", "excluded"],
                  [[r["rater"], r.get("label", r["rater"]), r["votes"], r["median_response_ms"] if r["median_response_ms"] is not None else "n/a",
                    _fmt(r["gold_pass_rate"]), _fmt(r["self_consistency"]), "yes" if r["excluded"] else ""]
                   for r in results["raters"]]),
              "</body></html>"]
    return "".join(parts)


def token_problem(token: str) -> str | None:
    """What makes `token` unfit to guard the dashboard (to follow "the admin token ..."), or None."""
    if not token.strip():
        return f"is empty or blank; it needs at least {MIN_TOKEN} characters"
    if len(token) < MIN_TOKEN:
        return (f"is too short: {len(token)} characters, it needs at least {MIN_TOKEN} characters "
                "(a shorter one can be guessed)")
    if not all("!" <= c <= "~" for c in token):
        return "has spaces or characters other than visible ASCII (it travels in a header and an address)"
    if len(set(token)) < MIN_DISTINCT:
        return (f"uses only {len(set(token))} different characters, it needs at least {MIN_DISTINCT} "
                "(a repetitive token can be guessed)")
    return None


def session_cookie(token: str, study_id: str, expires: int) -> str:
    """The admin cookie's value: its expiry (Unix time) and an HMAC-SHA256 of it and the study under the token."""
    message = f"dwb-admin-session\0{study_id}\0{expires}".encode()
    return f"{expires}.{hmac.new(token.encode(), message, hashlib.sha256).hexdigest()}"


class AdminGate:
    """The dashboard's token as a bearer header, or the session cookie ``/admin?token=`` sets."""

    def __init__(self, token: str, study_id: str, secure_cookie: bool = False):
        self.token, self.study_id, self.secure_cookie = token, study_id, secure_cookie

    def require(self, request: Request) -> None:
        bearer = request.headers.get("authorization", "")
        allowed = (self.token_matches(bearer[7:]) if bearer.lower().startswith("bearer ")
                   else self.cookie_valid(request.cookies.get(COOKIE, "")))
        if not allowed:
            raise HTTPException(401, "admin token required", headers={"WWW-Authenticate": "Bearer"})

    def token_matches(self, supplied: str) -> bool:
        return hmac.compare_digest(supplied.encode(), self.token.encode())

    def cookie_valid(self, cookie: str) -> bool:
        """Whether ``cookie`` is a session this token signed that has not expired; any other value, however it is
        made, is simply no session (an expiry of 5,000 digits, or of "²", which ``str.isdigit`` passes and ``int``
        refuses, answered 500)."""
        expires = cookie.partition(".")[0]
        if not EXPIRY.fullmatch(expires) or int(expires) < time.time():
            return False
        expected = session_cookie(self.token, self.study_id, int(expires))
        return hmac.compare_digest(cookie.encode("utf-8", "replace"), expected.encode())

    def login(self, request: Request, supplied: str) -> Response:
        """``/admin?token=...``: a session cookie set, and the token taken out of the address bar. The cookie is
        Secure when asked (``--secure-cookie``) or when the request came over https."""
        if not self.token_matches(supplied):
            raise HTTPException(401, "wrong admin token")
        response = RedirectResponse("/admin", status_code=303)
        response.set_cookie(COOKIE, session_cookie(self.token, self.study_id, int(time.time()) + SESSION_S),
                            max_age=SESSION_S, path="/admin", httponly=True, samesite="strict",
                            secure=self.secure_cookie or request.url.scheme == "https")
        return response


class AnalysisCache:
    """Analysis of the votes, recomputed when votes arrived, at most every ``REFRESH_S`` seconds: it takes the
    same CPU as the raters' requests, and a dashboard left open must not slow them."""

    def __init__(self, service):
        self.service, self.cache, self.lock = service, {}, threading.Lock()

    def get(self, exclude: bool) -> dict:
        from .analysis import analyze  # numpy, scipy: not needed to start serving

        store = self.service.store
        with self.lock:
            last = self.cache.get(exclude)
            if last is None or (time.monotonic() - last["at"] > REFRESH_S and last["last_vote"] != store.last_vote_id()):
                last_vote, votes = store.last_vote_id(), store.all_votes()
                results = analyze(self.service.study, votes, exclude_failing=exclude, n_boot=REPORT_BOOTSTRAP,
                                  target_width=self.service.study.target_width, labels=store.labels())
                self.cache[exclude] = last = {"at": time.monotonic(), "last_vote": last_vote, "votes": votes,
                                              "results": results}
            return last


def _download(body: str, media_type: str, filename: str) -> Response:
    return Response(body, media_type=media_type, headers={"Content-Disposition": f"attachment; filename={filename}"})


def add_admin_routes(app: FastAPI, service, token: str, secure_cookie: bool = False) -> None:
    """Mount /admin, /admin/results.json, /admin/results.csv, /admin/votes.csv, /admin/votes.json, /admin/chart.png."""
    gate, analysis = AdminGate(token, service.study.id, secure_cookie), AnalysisCache(service)

    async def results(request: Request, exclude: int) -> dict:
        gate.require(request)
        return (await run_in_threadpool(analysis.get, bool(exclude)))["results"]

    async def votes_and_labels(request: Request) -> tuple[list, dict]:
        gate.require(request)
        return await run_in_threadpool(service.store.all_votes), await run_in_threadpool(service.store.labels)

    @app.get("/admin", response_class=HTMLResponse)
    async def dashboard(request: Request, exclude: int = 0) -> Response:
        if request.query_params.get("token") is not None:
            return gate.login(request, request.query_params["token"])
        data = await results(request, exclude)
        counts = await run_in_threadpool(service.store.counts)
        return HTMLResponse(dashboard_html(data, counts, bool(exclude)))

    @app.get("/admin/results.json")
    async def results_json(request: Request, exclude: int = 0) -> Response:
        return Response(json.dumps(await results(request, exclude), indent=1), media_type="application/json")

    @app.get("/admin/results.csv")
    async def results_table(request: Request, exclude: int = 0) -> Response:
        return _download(results_csv(await results(request, exclude)), "text/csv", "results.csv")

    @app.get("/admin/votes.csv")
    async def votes_table(request: Request) -> Response:
        return _download(votes_csv(service.study, *await votes_and_labels(request)), "text/csv", "votes.csv")

    @app.get("/admin/votes.json")
    async def votes_list(request: Request) -> Response:
        return Response(votes_json(service.study, *await votes_and_labels(request)), media_type="application/json")

    @app.get("/admin/chart.png")
    async def chart(request: Request, exclude: int = 0) -> Response:
        data = await results(request, exclude)

        def render() -> bytes:
            from .chart import plot_preferences

            buf = io.BytesIO()
            plot_preferences(data, buf)
            return buf.getvalue()

        return Response(await run_in_threadpool(render), media_type="image/png")
