"""A ``serve --workers`` worker's dashboard and its owner's ``waiting`` call: per poll, only what the pages
show crosses the socket (each waiting turn's reply trimmed as the page trims it, no next state), however
long the replies, and the turn page still gets its one turn in full (a second call).

The owner's side is ``OwnerHub._call`` on a stand-in tracker, its answer encoded and decoded as the socket
carries it (``wire``); the worker's side is ``Worker.waiting`` / ``waiting_turn`` behind the real dashboard
routes. The whole path on real processes: tests/core/test_workers.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openclaw_rl.dashboard import data
from openclaw_rl.dashboard.routes import dashboard_router
from openclaw_rl.workers import wire
from openclaw_rl.workers.app import Worker
from openclaw_rl.workers.owner import OwnerHub

LONG_REPLY = "a long reply " * 80_000  # about 1 MB
LONG_NEXT_STATE = {"role": "user", "content": "n" * 200_000}
ROWS_PER_KEY = 3


def stand_in_tracker() -> Any:
    """Waiting turns of two keys (alice, bob), each with a long reply and a long next state."""
    sessions = {}
    for ns in ("alice", "bob"):
        for i in range(ROWS_PER_KEY):
            sid = f"{ns}-{i}"
            turn = SimpleNamespace(session_key=f"{ns}\x1f{sid}", session_id=sid, index=1, epoch="", created=float(i),
                                   generation=SimpleNamespace(text=f"{sid}: {LONG_REPLY}"), next_state=LONG_NEXT_STATE)
            sessions[f"{ns}\x1f{sid}"] = SimpleNamespace(turns={1: turn})
    return SimpleNamespace(sessions=sessions)


class SocketOwner:
    """``OwnerClient.call`` as the worker sees it: the owner's ``_call`` answer through ``wire``'s encoding."""

    def __init__(self, tracker: Any):
        self.hub = SimpleNamespace(proxy=SimpleNamespace(tracker=tracker))
        self.frames: list[int] = []

    async def call(self, what: str, timeout_s: float = 30.0, **args: Any) -> Any:
        value = await OwnerHub._call(self.hub, wire.decode(wire.encode(wire.Call(1, what, args))[4:]))  # type: ignore[arg-type]
        frame = wire.encode(wire.Answer(1, value=value))
        self.frames.append(len(frame))
        return wire.decode(frame[wire.HEADER.size:]).value


@pytest.fixture
def worker_dashboard(tmp_path: Path) -> Any:
    tracker = stand_in_tracker()
    owner = SocketOwner(tracker)
    worker = SimpleNamespace(owner=owner, waiting_timeout_s=1.0, index=0,
                             settings=SimpleNamespace(spool=SimpleNamespace(dir=str(tmp_path))))
    worker._waiting = Worker._waiting.__get__(worker)
    sources = data.Sources(tmp_path, waiting=Worker.waiting.__get__(worker),
                           waiting_turn=Worker.waiting_turn.__get__(worker))
    app = FastAPI()
    app.include_router(dashboard_router(sources, lambda authorization: (authorization or "").removeprefix("Bearer ")
                                        or None))
    one_process = data.Sources(tmp_path, waiting=lambda ns: data.waiting_from_tracker(tracker, ns))
    return app, owner, one_process


def get(app: FastAPI, path: str, key: str | None, status: int = 200, **params: Any) -> Any:
    async def ask() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://worker") as client:
            return await client.get(path, params=params, headers={"Authorization": f"Bearer {key}"} if key else {})
    r = asyncio.run(ask())
    assert r.status_code == status, r.text
    return r.json()


def test_the_admin_keys_poll_gets_previews_only_and_the_turn_page_its_turn_in_full(worker_dashboard):
    app, owner, one_process = worker_dashboard
    overview = get(app, "/dashboard/api/overview", None)  # None: the admin's view, every namespace
    assert len(overview["sessions"]) == 2 * ROWS_PER_KEY
    assert len(owner.frames) == 1 and owner.frames[0] < 4096, owner.frames  # not 6 x 1.2 MB
    assert overview["sessions"] == data.sessions(one_process, None)  # what the one-process page shows

    page = get(app, "/dashboard/api/session", None, id="bob-1")
    assert page["turns"] == data.session_turns(one_process, None, "bob-1")
    assert page["turns"][0]["reply"] == "bob-1: " + LONG_REPLY[:data.PREVIEW_CHARS - len("bob-1: ")] + "…"
    assert owner.frames[-1] < 4096

    detail = get(app, "/dashboard/api/turn", None, session="bob-1", turn=1)
    assert detail["reply"] == "bob-1: " + LONG_REPLY and detail["next_state"] == LONG_NEXT_STATE
    assert detail == data.turn_detail(one_process, None, "bob-1", 1)
    assert len(asyncio.run(owner.call("waiting", ns=None, session="bob-1", turn=1))) == 1


def test_a_keys_rows_stay_its_own_in_previews_and_in_full(worker_dashboard):
    app, owner, _ = worker_dashboard
    overview = get(app, "/dashboard/api/overview", "alice")
    assert sorted(s["session"] for s in overview["sessions"]) == [f"alice-{i}" for i in range(ROWS_PER_KEY)]
    get(app, "/dashboard/api/turn", "alice", status=404, session="bob-1", turn=1)
    assert owner.frames[-1] < 4096  # no other key's turn in full either
