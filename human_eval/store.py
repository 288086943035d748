"""The vote store: raters, impressions and votes, through SQLAlchemy Core.

SQLite in WAL mode by default (one file next to the study; readers never block the writer, and a
committed vote survives the server process being killed); any SQLAlchemy URL, such as
``postgresql+psycopg://user@host/db``, lets several server instances share one store.

Votes are append-only: one row per rater, pair and question, enforced by a unique constraint (and, on
SQLite, by triggers that refuse UPDATE and DELETE). An impression records one showing of a pair to a
rater and which side image *a* was on.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import (DDL, Boolean, Column, Float, Integer, MetaData, String, Table, UniqueConstraint, create_engine,
                        event, func, inspect, select, text)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError

from .errors import HumanEvalError
from .study import ANSWERS

metadata = MetaData()

meta = Table("meta", metadata, Column("key", String(64), primary_key=True), Column("value", String(256), nullable=False))

raters = Table(
    "raters", metadata,
    Column("id", String(64), primary_key=True),
    Column("created_at", Float, nullable=False),
    Column("user_agent", String(256)),
    Column("label", String(64)),  # what the rater typed, or the crowd platform's worker id
)

impressions = Table(
    "impressions", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("rater_id", String(64), nullable=False),
    Column("pair_id", String(64), nullable=False),
    Column("swapped", Boolean, nullable=False),  # True: image b on the left
    Column("shown_at", Float, nullable=False),
    UniqueConstraint("rater_id", "pair_id", name="one_impression_per_rater_and_pair"),
)

votes = Table(
    "votes", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("rater_id", String(64), nullable=False),
    Column("pair_id", String(64), nullable=False),
    Column("question", String(32), nullable=False),
    Column("answer", String(8), nullable=False),  # as displayed: A (left), B (right), none, good (both), bad (both)
    Column("choice", String(8), nullable=False),  # the pair's image: a, b; a tie as answered: none, good, bad
    Column("swapped", Boolean, nullable=False),
    Column("client_ms", Integer),  # the browser's time from showing the question to the answer
    Column("server_ms", Integer, nullable=False),  # the server's time from the impression to this vote
    Column("created_at", Float, nullable=False),
    UniqueConstraint("rater_id", "pair_id", "question", name="one_vote_per_rater_pair_question"),
)

for _verb in ("UPDATE", "DELETE"):
    event.listen(votes, "after_create", DDL(
        f"CREATE TRIGGER IF NOT EXISTS votes_append_only_{_verb.lower()} BEFORE {_verb} ON votes "
        "BEGIN SELECT RAISE(ABORT, 'votes are append-only'); END").execute_if(dialect="sqlite"))
event.listen(votes, "after_create", DDL(
    "CREATE OR REPLACE FUNCTION votes_append_only() RETURNS trigger LANGUAGE plpgsql AS "
    "$body$ BEGIN RAISE EXCEPTION 'votes are append-only'; END $body$").execute_if(dialect="postgresql"))
event.listen(votes, "after_create", DDL(
    "CREATE TRIGGER votes_append_only BEFORE UPDATE OR DELETE ON votes "
    "FOR EACH ROW EXECUTE FUNCTION votes_append_only()").execute_if(dialect="postgresql"))


def database_url(value: str | Path) -> str:
    """A SQLAlchemy URL, or a plain file path made into a SQLite URL."""
    value = str(value)
    return value if "://" in value else f"sqlite:///{Path(value).resolve()}"


@dataclass
class Impression:
    pair: str
    swapped: bool
    shown_at: float
    answers: dict[str, str] = field(default_factory=dict)  # question -> answer as displayed


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes, fast commits
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


class Store:
    """One study's votes in one database."""

    def __init__(self, url: str, study_id: str, *, create: bool = True):
        self.url = url
        kwargs: dict = {}
        if url.startswith("sqlite"):
            path = url.split("///", 1)[-1]
            if not create and not Path(path).is_file():
                raise HumanEvalError(f"no votes database at {path} (serve the study first, or pass --db)")
            kwargs = {"connect_args": {"check_same_thread": False, "timeout": 10}, "pool_size": 8, "max_overflow": 24}
        else:
            kwargs = {"pool_size": 8, "max_overflow": 24, "pool_pre_ping": True}
        try:
            self.engine: Engine = create_engine(url, **kwargs)
        except Exception as e:  # noqa: BLE001 - a bad URL or a missing driver is the user's to fix
            raise HumanEvalError(f"cannot open database {url}: {e}") from None
        # SQLite takes one writer at a time; waiting here wakes at once, while SQLite's busy handler sleeps
        # in steps of up to 100 ms, which is where the latency tail came from under concurrent votes
        self._write = threading.Lock() if self.engine.dialect.name == "sqlite" else contextlib.nullcontext()
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        try:
            metadata.create_all(self.engine)
            self._add_label_column()
            self._claim(study_id)
        except OperationalError as e:
            raise HumanEvalError(f"cannot open database {url}: {e.orig}") from None

    def _claim(self, study_id: str) -> None:
        """Tie the database to one study, so votes never land against another study's pairs."""
        with self.engine.begin() as conn:
            found = conn.execute(select(meta.c.value).where(meta.c.key == "study_id")).scalar()
            if found is None:
                try:
                    conn.execute(meta.insert().values(key="study_id", value=study_id))
                except IntegrityError:  # another instance claimed it first
                    found = conn.execute(select(meta.c.value).where(meta.c.key == "study_id")).scalar()
        if found is not None and found != study_id:
            raise HumanEvalError(f"database {self.url} holds the votes of another study ({found}, not {study_id})")

    def _add_label_column(self) -> None:
        """Stores made before raters had labels gain the column (a no-op on current ones)."""
        if "label" not in {c["name"] for c in inspect(self.engine).get_columns("raters")}:
            with self.engine.begin() as conn:
                conn.execute(text("ALTER TABLE raters ADD COLUMN label VARCHAR(64)"))

    def close(self) -> None:
        self.engine.dispose()

    # raters

    def add_rater(self, rater: str, label: str | None = None, user_agent: str = "") -> bool:
        """Register a rater; False when the id already exists (the rater resumes)."""
        try:
            with self._write, self.engine.begin() as conn:
                conn.execute(raters.insert().values(id=rater, created_at=time.time(), user_agent=user_agent[:256],
                                                    label=label or rater))
            return True
        except IntegrityError:
            return False

    def has_rater(self, rater: str) -> bool:
        with self.engine.connect() as conn:
            return conn.execute(select(raters.c.id).where(raters.c.id == rater)).first() is not None

    def label_of(self, rater: str) -> str:
        with self.engine.connect() as conn:
            return conn.execute(select(raters.c.label).where(raters.c.id == rater)).scalar() or rater

    # impressions

    def impressions_of(self, rater: str) -> list[Impression]:
        """Every pair shown to a rater with the answers given so far, oldest first."""
        query = (select(impressions.c.pair_id, impressions.c.swapped, impressions.c.shown_at, votes.c.question,
                        votes.c.answer)
                 .select_from(impressions.outerjoin(votes, (votes.c.rater_id == impressions.c.rater_id)
                                                    & (votes.c.pair_id == impressions.c.pair_id)))
                 .where(impressions.c.rater_id == rater).order_by(impressions.c.id))
        shown: dict[str, Impression] = {}
        with self.engine.connect() as conn:
            for pair, swapped, shown_at, question, answer in conn.execute(query):
                imp = shown.setdefault(pair, Impression(pair, bool(swapped), shown_at))
                if question is not None:
                    imp.answers[question] = answer
        return list(shown.values())

    def impression(self, rater: str, pair: str) -> Impression | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(impressions.c.swapped, impressions.c.shown_at)
                               .where(impressions.c.rater_id == rater, impressions.c.pair_id == pair)).first()
        return None if row is None else Impression(pair, bool(row.swapped), row.shown_at)

    def show(self, rater: str, pair: str, swapped: bool) -> Impression:
        """Record that `pair` is shown to `rater`; an existing impression wins a race and is returned."""
        now = time.time()
        try:
            with self._write, self.engine.begin() as conn:
                conn.execute(impressions.insert().values(rater_id=rater, pair_id=pair, swapped=swapped, shown_at=now))
            return Impression(pair, swapped, now)
        except IntegrityError:
            existing = self.impression(rater, pair)
            assert existing is not None
            return existing

    # votes

    def vote(self, rater: str, pair: str, question: str, answer: str, client_ms: int | None) -> tuple[str, str | None]:
        """Append one vote: ("recorded", the image chosen: a, b, or the tie as answered: none, good, bad),
        ("duplicate", None) for the same answer again, ("conflict", first answer) for a different one, or
        ("not_shown", None). Which answers a study offers is the server's to check (``Study.answers``)."""
        if answer not in ANSWERS:
            raise HumanEvalError(f"unknown answer {answer[:16]!r} (expected one of: {', '.join(ANSWERS)})")
        imp = self.impression(rater, pair)
        if imp is None:
            return "not_shown", None
        choice = answer if answer not in ("A", "B") else ("a" if (answer == "A") != imp.swapped else "b")
        now = time.time()
        try:
            with self._write, self.engine.begin() as conn:
                conn.execute(votes.insert().values(
                    rater_id=rater, pair_id=pair, question=question, answer=answer, choice=choice, swapped=imp.swapped,
                    client_ms=client_ms, server_ms=int(round((now - imp.shown_at) * 1000)), created_at=now))
            return "recorded", choice
        except IntegrityError:
            with self.engine.connect() as conn:
                first = conn.execute(select(votes.c.answer).where(
                    votes.c.rater_id == rater, votes.c.pair_id == pair, votes.c.question == question)).scalar()
            return ("duplicate", None) if first == answer else ("conflict", first)

    def all_votes(self) -> list[dict]:
        """Every vote, oldest first, as plain dicts."""
        with self.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(select(votes).order_by(votes.c.id))]

    def labels(self) -> dict[str, str]:
        """Every rater's label (the id itself where none was stored)."""
        with self.engine.connect() as conn:
            return {r: label or r for r, label in conn.execute(select(raters.c.id, raters.c.label))}

    def vote_counts(self) -> list[tuple[str, str, str, int]]:
        """(pair, question, choice, votes) for every combination that has votes."""
        query = select(votes.c.pair_id, votes.c.question, votes.c.choice, func.count()).group_by(
            votes.c.pair_id, votes.c.question, votes.c.choice)
        with self.engine.connect() as conn:
            return [tuple(row) for row in conn.execute(query)]

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            return {name: conn.execute(select(func.count()).select_from(table)).scalar_one()
                    for name, table in (("raters", raters), ("impressions", impressions), ("votes", votes))}

    def last_vote_id(self) -> int:
        with self.engine.connect() as conn:
            return conn.execute(select(func.coalesce(func.max(votes.c.id), 0))).scalar_one()
