"""The session state machine: park each main-line turn until the next request brings its next state.

Stage: serving → **sessions** → mode scorer → spool. Turn numbers are assigned when a request
*arrives*, and the request's next state is attached to the previous turn right then, so judging starts
while the policy is still generating the new answer (upstream waits for the new answer first, and
loses the next state if that generation fails). A turn is judged once it has both its response and
its next state, or once its session ends (``session_done``, idle TTL, eviction). Judgements finish in
any order; outcomes are emitted strictly in turn order per session. Concurrent requests on one session
cannot corrupt that order because every transition below runs synchronously on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import NotFound
from .ids import UniqueIds
from .metrics import ProxyMetrics, log_safe
from .scoring import Ledger, Outcome, TurnScorer
from .turns import DropReason, Generation, Turn

log = logging.getLogger(__name__)

Sink = Callable[[Turn, Outcome], None]  # must not block: the spool writer enqueues
Persist = Callable[[Turn], None]  # must not block: saves a waiting turn for restart recovery


def _namespace(session_key: str) -> str:
    """The API key namespace of a session key ("<namespace>\\x1f<session id>", see serving)."""
    head, sep, _ = session_key.partition("\x1f")
    return head if sep else ""


@dataclass
class Session:
    key: str
    next_index: int = 1  # number the next arriving turn gets
    emit_next: int = 1  # the turn whose outcome is emitted next
    turns: dict[int, Turn] = field(default_factory=dict)  # arrived, not yet emitted
    judged: dict[int, Outcome | tuple[Any, None]] = field(default_factory=dict)
    started: set[int] = field(default_factory=set)  # turns whose judgement has been started
    ledger: Ledger = field(default_factory=Ledger)
    last_seen: float = field(default_factory=time.monotonic)
    closing: bool = False  # no further next states will come
    epoch: str = field(default_factory=lambda: uuid.uuid4().hex[:12])  # this incarnation of the session id

    @property
    def busy(self) -> bool:
        return any(t.generation is None for t in self.turns.values())


class SessionTracker:
    def __init__(self, scorer: TurnScorer, sink: Sink, metrics: ProxyMetrics, *, ttl_s: float = 900.0,
                 max_sessions: int = 100_000, persist: Persist | None = None,
                 persist_next_state: Persist | None = None, on_end: Callable[[str], None] | None = None):
        self.scorer, self.sink, self.metrics = scorer, sink, metrics
        self.persist = persist or (lambda turn: None)
        self.persist_next_state = persist_next_state or self.persist
        self.on_end = on_end or (lambda key: None)  # e.g. free the session's cached prompt prefix
        self.ttl_s, self.max_sessions = ttl_s, max_sessions
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        # a scorer that sees a session whole (OEL) holds its turns until the session ends, then is told
        # which turns it will be asked to judge (``session_closing``) before the judgements start
        self._holds = bool(getattr(scorer, "holds_until_session_end", False))
        self._tasks: set[asyncio.Task] = set()
        self._owner: dict[int, Session] = {}  # id(turn) → its session, also after the session is closed
        self._lru: dict[str, OrderedDict[str, None]] = {}  # per API key namespace: session keys, LRU first
        self._sweeper: asyncio.Task | None = None
        self.ids = UniqueIds()  # session epochs (not secrets; ids.py)

    # --- request lifecycle ---------------------------------------------------------------------------

    def begin(self, turn_template: Turn, next_state: dict[str, str] | None) -> Turn:
        """Register an arriving main-line request; returns its Turn (with its index set)."""
        session = self.sessions.get(turn_template.session_key)
        if session is None or session.closing:
            session = self._open(turn_template.session_key)
        self._touch(session.key)
        session.last_seen = time.monotonic()
        prev = session.turns.get(session.next_index - 1)
        if prev is not None and self._is_retry_of(session, prev, turn_template):
            # The client asks the same thing again: it never used prev's reply (timeout + retry, resend,
            # regenerate), so this request replaces prev instead of becoming its next state.
            self._finish(session, prev.index, Outcome(drop=DropReason.SUPERSEDED_BY_RETRY,
                                                      drop_detail=f"turn {session.next_index} repeats its prompt"))
        elif prev is not None and prev.next_state is None and next_state is not None:
            prev.next_state = next_state
            if prev.generation is not None:  # persisted whole when it completed: only its next state is new
                self.persist_next_state(prev)
            self._maybe_judge(session, prev)
        turn_template.index = session.next_index
        turn_template.epoch = session.epoch
        session.next_index += 1
        session.turns[turn_template.index] = turn_template
        self._owner[id(turn_template)] = session
        self.metrics.sessions.labels("tracked").set(len(self.sessions))
        return turn_template

    def complete(self, turn: Turn, generation: Generation) -> Any:
        """The policy answered; the turn waits for its next state (or is judged now if it has one).

        Returns what ``persist`` returned (the writer's future: done once the turn is committed), or None
        when nothing needs to be durable (dropped, or already superseded)."""
        session = self._owner.get(id(turn))
        if session is None or turn.index in session.judged:  # superseded by a retry while generating
            return None
        turn.generation = generation
        session.last_seen = time.monotonic()
        if not generation.response_ids:
            self._finish(session, turn.index, Outcome(drop=DropReason.EMPTY_RESPONSE))
        elif generation.finish_reason == "abort":
            self._finish(session, turn.index, Outcome(drop=DropReason.ABORTED))
        else:
            durable = self.persist(turn)
            self._maybe_judge(session, turn)
            return durable
        return None

    def feedback(self, key: str, rating: float, text: str | None) -> tuple[int, str]:
        """Explicit feedback on a session's latest turn: its next state if it has none yet, and its score.

        Returns (turn index, "next_state" | "override"). Raises NotFound when there is no open turn.
        """
        session = self.sessions.get(key)
        turn = session.turns.get(session.next_index - 1) if session else None
        if session is None or turn is None or turn.index in session.started or turn.index in session.judged:
            raise NotFound("no turn of this session is waiting for feedback (unknown session, or its latest "
                           "turn is already judged)")
        turn.feedback = float(rating)
        how = "override"
        if turn.next_state is None:
            turn.next_state = {"role": "user", "content": text or f"[explicit feedback: {rating:+g}]"}
            how = "next_state"
        session.last_seen = time.monotonic()
        if turn.generation is not None:
            self.persist(turn)
        self._maybe_judge(session, turn)
        return turn.index, how

    def restore(self, turns: list[Turn]) -> int:
        """Re-park turns persisted before a restart: waiting ones wait again, judged-not-emitted re-run.

        The newest epoch of each session id is live again (its next request brings the next state);
        older epochs were ending and are judged without one.
        """
        groups: dict[tuple[str, str], list[Turn]] = {}
        for t in turns:
            groups.setdefault((t.session_key, t.epoch), []).append(t)
        latest = {key: epoch for (key, epoch), ts in sorted(groups.items(), key=lambda kv: min(t.created for t in kv[1]))}
        for (key, epoch), ts in groups.items():
            ts.sort(key=lambda t: t.index)
            session = Session(key, next_index=ts[-1].index + 1, emit_next=ts[0].index, epoch=epoch,
                              closing=latest[key] != epoch)
            present = {t.index for t in ts}
            for i in range(ts[0].index, ts[-1].index + 1):
                if i not in present:  # failed before the restart; its drop was already counted then
                    session.judged[i] = Outcome(drop=DropReason.GENERATION_FAILED)
            for t in ts:
                session.turns[t.index] = t
                self._owner[id(t)] = session
            if not session.closing:
                self.sessions[key] = session
                self._touch(key)
            else:
                self._announce_closing(session)
            for t in ts:
                self._maybe_judge(session, t)
        if turns:
            log.warning("restored %d waiting turns of %d sessions from the spool", len(turns), len(groups))
        return len(turns)

    def fail(self, turn: Turn, reason: DropReason, detail: str = "") -> None:
        session = self._owner.get(id(turn))
        if session is not None and turn.index not in session.judged:
            self._finish(session, turn.index, Outcome(drop=reason, drop_detail=detail))

    def end_session(self, key: str, why: str = "done") -> None:
        """No more next states will come: judge what is parked without one, then forget the session."""
        session = self.sessions.pop(key, None)
        self.on_end(key)
        if session is None:
            return
        self._untouch(key)
        session.closing = True
        if log.isEnabledFor(logging.DEBUG):  # log_safe's escaping only for a line that is written
            log.debug("session %s closing (%s) with %d open turns", log_safe(key), why, len(session.turns))
        self._announce_closing(session)
        for turn in list(session.turns.values()):
            self._maybe_judge(session, turn)
        self.metrics.sessions.labels("tracked").set(len(self.sessions))

    def delete_user(self, user: str) -> int:
        """Forget every session of `user` (the namespace of their session keys): each turn not yet emitted, the
        one being generated included, is emitted now as a ``user_deleted`` drop (counted and logged; its
        spool row and record lines go with the user's deletion, ``users/deletion.py``). A judgement or
        generation still running for one of them finds its turn gone and keeps nothing. Returns the turns
        dropped. The user's next request opens a fresh session."""
        doomed = {id(s): s for s in [*self.sessions.values(), *self._owner.values()] if _namespace(s.key) == user}
        dropped = 0
        for session in doomed.values():
            if self.sessions.get(session.key) is session:
                del self.sessions[session.key]
                self._untouch(session.key)
                self.on_end(session.key)
            session.closing = True
            dropped += len(session.turns)
            for i in range(session.emit_next, session.next_index):
                session.judged[i] = Outcome(drop=DropReason.USER_DELETED)
            session.started.clear()
            self._finish(session, session.next_index - 1, Outcome(drop=DropReason.USER_DELETED))
        self.metrics.sessions.labels("tracked").set(len(self.sessions))
        if dropped or doomed:
            log.warning("user %s deleted: %d sessions forgotten, %d waiting turns dropped", log_safe(user),
                        len(doomed), dropped)
        return dropped

    # --- internals -----------------------------------------------------------------------------------

    @staticmethod
    def _is_retry_of(session: Session, prev: Turn, turn: Turn) -> bool:
        """The retry rule: same session, prev still waits for its next state (not judged, no feedback),
        and the new prompt is token for token prev's prompt."""
        return (prev.next_state is None and prev.feedback is None and prev.index not in session.started
                and prev.index not in session.judged and prev.prompt_ids == turn.prompt_ids)

    def _touch(self, key: str) -> None:
        lru = self._lru.setdefault(_namespace(key), OrderedDict())
        lru[key] = None
        lru.move_to_end(key)

    def _untouch(self, key: str) -> None:
        namespace = _namespace(key)
        lru = self._lru.get(namespace)
        if lru is not None:
            lru.pop(key, None)
            if not lru:
                del self._lru[namespace]

    def _open(self, key: str) -> Session:
        """A new session; at the limit, flush the least recently used idle session *of the same API key*
        (sessions are per key: one key cannot evict another's)."""
        lru = self._lru.get(_namespace(key), OrderedDict())
        while len(lru) >= self.max_sessions:
            oldest = next((k for k in lru if not self.sessions[k].busy), None)
            if oldest is None:
                break
            log.warning("session limit %d of this API key reached: flushing least recently used session %s",
                        self.max_sessions, log_safe(oldest))
            self.end_session(oldest, "evicted")
        session = Session(key, epoch=self.ids.hex(12))
        self.sessions[key] = session
        return session

    def _announce_closing(self, session: Session) -> None:
        hook = getattr(self.scorer, "session_closing", None) if self._holds else None
        if hook is not None:
            hook([t for i, t in sorted(session.turns.items()) if t.generation is not None
                  and i not in session.started and i not in session.judged])

    def _maybe_judge(self, session: Session, turn: Turn) -> None:
        if turn.generation is None or turn.index in session.started or turn.index in session.judged:
            return
        if not session.closing and (turn.next_state is None or self._holds):
            return  # a holding scorer (OEL) judges every turn of a session only once it has ended
        session.started.add(turn.index)
        task = asyncio.get_running_loop().create_task(self._judge(session, turn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _judge(self, session: Session, turn: Turn) -> None:
        try:
            judgement = await self.scorer.judge(turn)
        except Exception as e:  # a judge bug must cost one turn, never the session's order
            log.exception("judging session %s turn %d failed", log_safe(turn.session_id), turn.index)
            self._finish(session, turn.index, Outcome(drop=DropReason.JUDGE_FAILED, drop_detail=repr(e)))
            return
        self._finish(session, turn.index, (judgement, None))

    def _finish(self, session: Session, index: int, result: Outcome | tuple[Any, None]) -> None:
        if index < session.emit_next:  # emitted already (its user was deleted while it was judged): nothing to do
            return
        session.judged[index] = result
        while session.emit_next in session.judged:
            i = session.emit_next
            session.emit_next += 1
            turn = session.turns.pop(i, None)
            result = session.judged.pop(i)
            session.started.discard(i)
            if turn is None:
                continue
            self._owner.pop(id(turn), None)
            if isinstance(result, tuple):
                try:
                    outcome = self.scorer.build(turn, result[0], session.ledger)
                except Exception as e:
                    log.exception("building samples for session %s turn %d failed", log_safe(turn.session_id), i)
                    outcome = Outcome(drop=DropReason.JUDGE_FAILED, drop_detail=repr(e))
            else:
                outcome = result
            if outcome.drop is not None:
                self.metrics.drop(outcome.drop, turn.session_id, turn.index, outcome.drop_detail)
            self.sink(turn, outcome)

    # --- idle sessions ---------------------------------------------------------------------------------

    def sweep(self, now: float | None = None) -> int:
        """End sessions idle for longer than the TTL; returns how many."""
        now = time.monotonic() if now is None else now
        idle = [k for k, s in self.sessions.items() if now - s.last_seen > self.ttl_s and not s.busy]
        for key in idle:
            self.end_session(key, "idle")
        return len(idle)

    def start_sweeper(self) -> None:
        async def loop() -> None:
            while True:
                await asyncio.sleep(max(0.05, min(self.ttl_s / 4, 30.0)))
                self.sweep()
        self._sweeper = asyncio.get_running_loop().create_task(loop())

    async def drain(self, timeout: float = 30.0) -> None:
        """Graceful shutdown: let the judgements in flight finish (up to ``timeout``) and keep every
        waiting turn where it is. Those are already persisted, so a restart resumes them exactly as
        after a crash; ending the sessions here would throw away every turn still waiting for its next
        state. A judgement cut off by the timeout is re-run after the restart."""
        if self._sweeper:
            self._sweeper.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    @property
    def pending_turns(self) -> int:
        """Turns waiting for a next state or a judgement in live sessions."""
        return sum(len(s.turns) for s in self.sessions.values())

    @property
    def judging(self) -> int:
        """Judgements in flight."""
        return len(self._tasks)

    async def wait_judged(self, timeout: float = 30.0) -> None:
        """Wait until no judgement is in flight; each one emits its session's judged turns, in order, as it
        ends. (Tests synchronise on this instead of sleeping.) TimeoutError if they take longer."""
        while self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=timeout)
            if pending:
                raise TimeoutError(f"{len(pending)} judgements still running after {timeout}s")

    @property
    def unsettled_turns(self) -> int:
        """Every turn not yet emitted, including those of sessions already ended."""
        return len(self._owner)
