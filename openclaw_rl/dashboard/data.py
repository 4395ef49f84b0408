"""The dashboard's queries: sessions, turns, training steps and drops, from the run's own files.

Stage: read-only, beside the pipeline. Everything comes from what the run already keeps: the turn
journal (``journal.py``: outcomes, batches, trained steps), the trainer's ``metrics.jsonl`` (one line
per step, Slime's metric names), and the turns still waiting (the live session tracker, or the spool's
pending rows for a stopped run). Every query takes the caller's API-key namespace and returns only its
sessions (``None``: every namespace, for a stopped run's dashboard opened without keys). Training steps
are shared by all keys and carry no conversation text, so every key sees them.
The files are re-read per request; a cache keyed on their size and mtime keeps polling cheap.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .journal import JOURNAL, ROTATED, namespace_of, read_journal

# The curves of the overview: (metric name in metrics.jsonl, title). Names are Slime's.
CURVES = [
    ("rollout/reward_mean", "reward (batch mean)"),
    ("train/loss", "loss"),
    ("train/rollout_fidelity_abs_diff", "fidelity |Δlogprob| (same weights)"),
    ("train/train_rollout_logprob_abs_diff", "|Δlogprob| with staleness"),
    ("train/staleness_mean", "staleness (steps)"),
    ("sim/preferred_rate", "learning curve: preferred-behaviour rate (simulated users)"),
]


Rows = list[dict[str, Any]]


@dataclass
class Sources:
    """Where a dashboard reads. ``waiting(ns)`` returns the waiting turns' records (``Turn.to_record`` shape
    plus ``state``), at least those the key of namespace ``ns`` may see (None: all), called on the proxy's
    event loop for a live run; the routes also take an awaitable of them (a ``serve --workers`` worker asks
    its owner, ``workers/app.py``, which sends only that key's rows over the socket, as previews: the reply
    trimmed as the page shows it, no next state). ``waiting_turn(ns, session, turn)``, where set, returns one
    turn's rows in full for the turn page (a worker's second call); without it the page reads ``waiting``."""

    journal_dir: Path
    metrics_path: Path | None = None
    tokenizer: Any = None
    waiting: Callable[[str | None], Rows | Awaitable[Rows]] = lambda ns: []
    waiting_turn: Callable[[str | None, str, int], Rows | Awaitable[Rows]] | None = None
    _cache: dict[str, Any] = field(default_factory=dict)

    def journal(self) -> list[dict[str, Any]]:
        stamp = tuple(_stamp(self.journal_dir / name) for name in (ROTATED, JOURNAL))
        if self._cache.get("journal_stamp") != stamp:
            self._cache["journal"] = list(read_journal(self.journal_dir))
            self._cache["journal_stamp"] = stamp
        return self._cache["journal"]

    def steps(self) -> list[dict[str, Any]]:
        if self.metrics_path is None:
            return []
        stamp = _stamp(self.metrics_path)
        if self._cache.get("metrics_stamp") != stamp:
            rows = []
            if stamp is not None:
                for text in self.metrics_path.read_text(errors="replace").splitlines():
                    try:
                        rows.append(json.loads(text))
                    except ValueError:
                        continue
            self._cache["metrics"], self._cache["metrics_stamp"] = rows, stamp
        return self._cache["metrics"]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _visible(ns: str | None, line_ns: str) -> bool:
    return ns is None or line_ns == ns or line_ns.startswith(ns + "/")  # a trusted key sees its users (users/)


@dataclass
class Index:
    turns: list[dict[str, Any]]
    trained: dict[str, int | None]  # sample id -> trainer step
    leased: set[str]
    step_times: list[tuple[float, int | None]]


def index(src: Sources) -> Index:
    batches: dict[str, list[str]] = {}
    trained: dict[str, int | None] = {}
    turns, step_times = [], []
    for line in src.journal():
        ev = line.get("ev")
        if ev == "turn":
            turns.append(line)
        elif ev == "batch":
            batches[line["batch"]] = line.get("samples") or []
        elif ev == "trained":
            for sid in batches.pop(line["batch"], []):
                trained[sid] = line.get("step")
            step_times.append((line.get("t", 0.0), line.get("step")))
    leased = {sid for ids in batches.values() for sid in ids}
    return Index(turns, trained, leased, step_times)


def fate(turn: dict[str, Any], idx: Index) -> dict[str, Any]:
    """What became of a finished turn: dropped (reason), sampled (in the spool), in a batch, or trained."""
    if turn.get("drop"):
        return {"state": "dropped", "reason": turn["drop"], "detail": turn.get("detail")}
    ids = [s["id"] for s in turn.get("samples") or []]
    steps = [idx.trained[i] for i in ids if i in idx.trained]
    if steps:
        return {"state": "trained", "step": steps[0], "weight_version": turn.get("weight_version"),
                "trained_into": f"step-{steps[0]}" if steps[0] is not None else None}
    if any(i in idx.leased for i in ids):
        return {"state": "training", "weight_version": turn.get("weight_version")}
    return {"state": "sampled", "weight_version": turn.get("weight_version")}


def _summary(turn: dict[str, Any], idx: Index) -> dict[str, Any]:
    rewards = [s.get("reward") for s in turn.get("samples") or []]
    return {"session": turn["session"], "epoch": turn.get("epoch", ""), "turn": turn["turn"],
            "time": turn.get("t"), "reply": _clip(turn.get("reply")), "reward": rewards[0] if rewards else None,
            "fate": fate(turn, idx)}


PREVIEW_CHARS = 160  # a reply as the session and overview pages show it


def _clip(text: Any, n: int = PREVIEW_CHARS) -> Any:
    """The page's preview of ``text``; a preview clips to itself, so the owner may send it clipped."""
    return text[:n] + "…" if isinstance(text, str) and len(text) > n else text


def _waiting(src: Sources, ns: str | None) -> list[dict[str, Any]]:
    out = []
    for rec in src.waiting(ns):
        if not _visible(ns, namespace_of(rec.get("session_key", ""))):
            continue
        out.append({"session": rec.get("session_id"), "epoch": rec.get("epoch", ""), "turn": rec.get("index"),
                    "time": rec.get("created"), "reply": _clip(rec.get("response_text")),
                    "reward": None, "fate": {"state": "waiting", "reason": rec.get("state")}})
    return out


def sessions(src: Sources, ns: str | None) -> list[dict[str, Any]]:
    idx = index(src)
    groups: dict[str, dict[str, Any]] = {}
    rows = [_summary(t, idx) for t in idx.turns if _visible(ns, t.get("ns", ""))] + _waiting(src, ns)
    for row in rows:
        g = groups.setdefault(row["session"], {"session": row["session"], "turns": 0, "last": 0.0,
                                               "states": Counter()})
        g["turns"] += 1
        g["last"] = max(g["last"], row["time"] or 0.0)
        g["states"][row["fate"]["state"]] += 1
    return sorted(({**g, "states": dict(g["states"])} for g in groups.values()), key=lambda g: -g["last"])


def session_turns(src: Sources, ns: str | None, session: str) -> list[dict[str, Any]]:
    idx = index(src)
    rows = [_summary(t, idx) for t in idx.turns if t["session"] == session and _visible(ns, t.get("ns", ""))]
    rows += [w for w in _waiting(src, ns) if w["session"] == session]
    return sorted(rows, key=lambda r: (r["time"] or 0.0, r["turn"]))


def turn_detail(src: Sources, ns: str | None, session: str, turn: int, epoch: str | None = None) -> dict | None:
    idx = index(src)
    found = None
    for t in idx.turns:  # the newest line for this turn wins (a session id may be reused: epoch tells)
        if (t["session"] == session and t["turn"] == turn and _visible(ns, t.get("ns", ""))
                and (epoch is None or t.get("epoch", "") == epoch)):
            found = t
    if found is None:
        for w in src.waiting(ns):
            if (w.get("session_id") == session and w.get("index") == turn
                    and _visible(ns, namespace_of(w.get("session_key", "")))):
                return {"session": session, "turn": turn, "epoch": w.get("epoch", ""), "time": w.get("created"),
                        "reply": w.get("response_text"), "next_state": w.get("next_state"),
                        "fate": {"state": "waiting", "reason": w.get("state")}, "samples": [], "judge": None}
        return None
    samples = []
    for s in found.get("samples") or []:
        tokens = _token_texts(src.tokenizer, s.get("ids") or [])
        samples.append({"id": s["id"], "kind": s.get("kind"), "reward": s.get("reward"), "tokens": tokens,
                        "advantage": s.get("advantage"), "masked": s.get("masked") or []})
    return {"session": session, "turn": turn, "epoch": found.get("epoch", ""), "time": found.get("t"),
            "prompt": found.get("prompt"), "reply": found.get("reply"), "finish": found.get("finish"),
            "next_state": found.get("next_state"), "feedback": found.get("feedback"),
            "judge": found.get("judge"), "fate": fate(found, idx), "samples": samples,
            "weight_version": found.get("weight_version")}


def _token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token's text, such that the pieces join to the decoded reply: a character split over several
    byte-level tokens is shown on the token that completes it (the others show nothing)."""
    if tokenizer is None:
        return [f"#{i}" for i in ids]
    pieces, prefix, read = [], 0, 0
    try:
        for i in range(len(ids)):
            before = tokenizer.decode(ids[prefix:read])
            after = tokenizer.decode(ids[prefix:i + 1])
            if len(after) > len(before) and not after.endswith("\ufffd"):
                pieces.append(after[len(before):])
                prefix, read = read, i + 1
            else:
                pieces.append("")
    except Exception:
        return [f"#{i}" for i in ids]
    return pieces


def training(src: Sources) -> dict[str, Any]:
    """The curves of the overview: one point per step that logged the metric."""
    rows = src.steps()
    curves = []
    for name, title in CURVES:
        points = [[r["step"], r[name]] for r in rows if isinstance(r.get(name), (int, float))]
        if points:
            curves.append({"name": name, "title": title, "points": points})
    last = rows[-1] if rows else {}
    return {"steps": len(rows), "last": {k: v for k, v in last.items() if isinstance(v, (int, float))},
            "curves": curves}


def drops(src: Sources, ns: str | None) -> dict[str, Any]:
    """Dropped turns by reason, per training step (the turns finished before step N was acknowledged), or
    per minute when nothing trains (``serve``)."""
    idx = index(src)
    mine = [t for t in idx.turns if t.get("drop") and _visible(ns, t.get("ns", ""))]
    totals = Counter(t["drop"] for t in mine)
    buckets: dict[str, Counter] = {}
    if idx.step_times:
        for t in mine:
            step = next((s for at, s in idx.step_times if at >= t.get("t", 0.0)), None)
            label = f"step {step}" if step is not None else "after the last step"
            buckets.setdefault(label, Counter())[t["drop"]] += 1
    else:
        import time as _time

        for t in mine:
            label = _time.strftime("%H:%M", _time.localtime(t.get("t", 0.0)))
            buckets.setdefault(label, Counter())[t["drop"]] += 1
    series = [{"label": k, "counts": dict(v)} for k, v in buckets.items()]
    return {"totals": dict(totals), "series": series}


def waiting_from_tracker(tracker: Any, ns: str | None = None, *, preview: bool = False,
                         turn: tuple[str, int] | None = None) -> list[dict[str, Any]]:
    """The live tracker's turns that have no outcome yet, those namespace ``ns`` may see (None: all; call on
    the proxy's event loop). ``preview``: only what the session and overview pages show (the reply clipped to
    ``PREVIEW_CHARS``, no next state), what a worker's dashboard asks its owner for, so the rows that cross the
    socket per poll stay small however long the replies; ``turn`` (session id, index): that turn's rows only."""
    out = []
    for session in list(tracker.sessions.values()):
        for t in list(session.turns.values()):
            if not _visible(ns, namespace_of(t.session_key)) or (turn is not None and (t.session_id, t.index) != turn):
                continue
            gen = t.generation
            state = ("generating" if gen is None else "waiting for its next state" if t.next_state is None
                     else "being judged")
            text = gen.text if gen else None
            out.append({"session_key": t.session_key, "session_id": t.session_id, "index": t.index,
                        "epoch": t.epoch, "created": t.created, "response_text": _clip(text) if preview else text,
                        "next_state": None if preview else t.next_state, "state": state})
    return out


def waiting_from_spool(spool_dir: Path) -> list[dict[str, Any]]:
    """A stopped run's waiting turns: the spool's pending rows, read without opening it for writing."""
    import sqlite3

    path = Path(spool_dir) / "samples.sqlite3"
    try:  # the file may go between a check and the open (a deleted or moved spool): no rows, not an error
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return []
    out = []
    try:
        try:  # a next state that came after its turn's record is in a row of its own (Spool.save_next_state)
            rows = con.execute("SELECT t.payload, n.next_state FROM pending_turns t LEFT JOIN pending_next_states n "
                               "ON n.session_key = t.session_key AND n.epoch = t.epoch AND n.turn = t.turn").fetchall()
        except sqlite3.OperationalError:  # a spool from before that table
            rows = [(payload, None) for (payload,) in con.execute("SELECT payload FROM pending_turns")]
        for payload, next_state in rows:
            rec = json.loads(payload)
            gen = rec.get("generation") or {}
            out.append({"session_key": rec.get("session_key", ""), "session_id": rec.get("session_id"),
                        "index": rec.get("index"), "epoch": rec.get("epoch", ""), "created": rec.get("created"),
                        "response_text": gen.get("text"),
                        "next_state": rec.get("next_state") if next_state is None else json.loads(next_state),
                        "state": "saved in the spool, waiting for the next start"})
    except sqlite3.Error:
        return []
    finally:
        con.close()
    return out
