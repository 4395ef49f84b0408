"""A 200 means the turn is saved: replies wait for their turn's commit, and a turn the spool cannot take
(a full disk, the spool file deleted, a commit slower than ``DURABLE_WAIT_S``) gets a 503, or an error
event before ``[DONE]`` in a stream. One proxy per spool. Checked for the proxy as ``serve``, ``train``
and ``local`` each build it.

A full disk without root: SQLite's ``PRAGMA max_page_count`` on the proxy's own connection makes every
commit that needs a new page fail with SQLITE_FULL, exactly the error a full disk gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import http_client, metric, settle

from openclaw_rl import serving
from openclaw_rl.servers import free_port
from openclaw_rl.spool import Spool, SpoolLocked, SpoolMissing

BIG = "word " * 4000  # ~20 KB of prompt: its waiting row needs new database pages


def chat(http: httpx.Client, url: str, sid: str, messages: list[dict[str, Any]], stream: bool) -> tuple[int, list[str], Any]:
    """(status, SSE data lines or [], parsed JSON body or None)."""
    body = {"messages": messages, "stream": stream}
    if not stream:
        r = http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-Id": sid})
        return r.status_code, [], r.json()
    with http.stream("POST", f"{url}/v1/chat/completions", json=body, headers={"X-Session-Id": sid}) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    return r.status_code, lines, None


def assert_refused(status: int, lines: list[str], body: Any) -> None:
    """A 503 (non-streamed), or a stream whose last event before [DONE] is an error and that has no
    finish_reason chunk: no client can take it for a complete answer."""
    if lines:
        assert status == 200 and lines[-1] == "[DONE]"
        error = json.loads(lines[-2])["error"]
        assert error["type"] == "service_unavailable" and "could not save this turn" in error["message"]
        assert not any('"finish_reason":"' in line for line in lines)
    else:
        assert status == 503 and body["error"]["type"] == "service_unavailable", body


def assert_complete(status: int, lines: list[str], body: Any) -> None:
    assert status == 200
    if lines:
        assert lines[-1] == "[DONE]" and '"finish_reason":"stop"' in lines[-2], lines[-3:]
    else:
        assert body["choices"][0]["finish_reason"] == "stop"


# --- the proxy as each command wires it --------------------------------------------------------------------


@pytest.fixture(params=["serve", "train", "local"])
def wired(request: pytest.FixtureRequest, tmp_path, tiny_model_dir, tokenizer, policy_server,
          judge_server) -> Iterator[Any]:
    """(proxy, url): ``serve`` builds a Proxy and serves its app; ``train`` (settings from its command line)
    and ``local`` (its own settings) run it in a ProxyRuntime, whose gate the trainer opens."""
    if request.param == "serve":
        from openclaw_rl.config import load_settings
        from openclaw_rl.server import Proxy
        from openclaw_rl.servers import BackgroundServer

        settings = load_settings({"proxy_tokenizer": str(tiny_model_dir), "proxy_policy_url": policy_server.url,
                                  "judge_url": judge_server.url, "judge_votes": 1, "spool_dir": str(tmp_path / "spool")},
                                 env={})
        proxy = Proxy.build(settings, tokenizer=tokenizer)
        with BackgroundServer(proxy.app) as server:
            proxy.server = server
            yield proxy, server.url
        proxy.writer.close()
        return
    from openclaw_rl.runtime import ProxyRuntime

    if request.param == "train":
        from openclaw_rl.cli import build_parser, settings_from_cli

        ns = build_parser("train").parse_args(["train", "--model", str(tiny_model_dir), "--policy-url", policy_server.url,
                                               "--judge-url", judge_server.url, "--port", str(free_port()),
                                               "--spool-dir", str(tmp_path / "spool")])
        settings = settings_from_cli(ns)
        settings.proxy.tokenizer = settings.proxy.tokenizer or ns.model  # as ExternalStack does
    else:
        from openclaw_rl.config import load_settings

        # LocalStack._start's proxy settings: hold-mode pauses, records on, the rollout temperature fixed
        settings = load_settings({
            "mode": "rl", "proxy_port": free_port(), "proxy_tokenizer": str(tiny_model_dir),
            "proxy_policy_url": policy_server.url, "judge_url": judge_server.url, "judge_votes": 1,
            "judge_max_new_tokens": 128, "spool_dir": str(tmp_path / "spool"), "proxy_record_dir": str(tmp_path / "records"),
            "proxy_pause_mode": "hold", "proxy_max_new_tokens": 64, "proxy_served_model_name": "tiny",
            "proxy_rollout_temperature": 1.0, "proxy_session_ttl_s": 900.0}, env={})
    runtime = ProxyRuntime(settings, tokenizer=tokenizer)
    try:
        runtime.proxy.gate.open()  # what collect() does while it gathers a batch
        runtime.proxy.server = runtime.server
        yield runtime.proxy, runtime.url
    finally:
        runtime.stop()


class HeldCommits:
    """The tracker's ``persist`` (the writer's commit future) behind futures the test resolves: each reply's
    future resolves only after ``release()`` and the real commit. ``awaited`` is set when a reply starts
    waiting on one (asyncio.wrap_future adds a done callback)."""

    def __init__(self, proxy: Any, progress: threading.Event):
        self.real, self.progress = proxy.tracker.persist, progress
        self.pairs: list[tuple[Future, Future]] = []
        proxy.tracker.persist = self

    def __call__(self, turn: Any) -> Future:
        progress = self.progress

        class Watched(Future):
            def add_done_callback(self, fn: Any) -> None:
                super().add_done_callback(fn)
                progress.set()

        held = Watched()
        self.pairs.append((self.real(turn), held))
        return held

    def release(self) -> None:
        for real, held in self.pairs:
            real.result(30)
            if not held.done():  # a reply that gave up has cancelled it
                held.set_result(True)


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
def test_reply_waits_for_its_commit_and_is_refused_past_the_wait(wired, stream, monkeypatch):
    """Issue #34 item 1: with the commit held, neither the 200 body nor a stream's finish chunk and [DONE]
    leaves before it resolves; past DURABLE_WAIT_S the reply is refused and the turn dropped as not_durable."""
    proxy, url = wired
    progress = threading.Event()  # a reply waits on its commit, or the client got its answer's end
    held = HeldCommits(proxy, progress)
    got: dict[str, Any] = {}
    ended = threading.Event()

    def ask() -> None:
        got["reply"] = chat(http, url, "held", [{"role": "user", "content": "hello"}], stream)
        ended.set()
        progress.set()

    with http_client() as http:
        asker = threading.Thread(target=ask)
        asker.start()
        assert progress.wait(30)
        assert not ended.is_set(), "the reply ended before its turn's commit resolved"
        held.release()
        asker.join(30)
        assert_complete(*got["reply"])
        # the waiting turn is in the file, for any reader, once the client has its answer
        assert len(Spool(proxy.spool.dir).pending_turns()) == 1

        monkeypatch.setattr(serving, "DURABLE_WAIT_S", 0.2)  # a commit that never resolves in time
        assert_refused(*chat(http, url, "slow", [{"role": "user", "content": "hi there"}], stream))
        assert metric(proxy, "openclaw_replies_not_durable_total", reason="timeout") == 1
        assert metric(proxy, "openclaw_turns_dropped_total", reason="not_durable") == 1
        held.release()


# --- a full disk --------------------------------------------------------------------------------------------


def fill_disk(proxy: Any, full: bool) -> None:
    """SQLITE_FULL for every commit that needs a new page (or room again), on the writer's own connection."""
    spool = proxy.spool
    with spool._lock:
        pages = spool._db.execute("PRAGMA page_count").fetchone()[0]
        spool._db.execute(f"PRAGMA max_page_count = {pages if full else 1 << 30}")


def health(http: httpx.Client, url: str) -> dict[str, Any]:
    return http.get(f"{url}/healthz").json()


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
def test_full_disk_refuses_replies_and_saves_what_it_holds_once_space_returns(wired, stream):
    proxy, url = wired
    first = [{"role": "user", "content": "hello " + BIG}]
    with http_client() as http:
        status, lines, body = chat(http, url, "a", first, stream)
        assert_complete(status, lines, body)  # saved: the disk still had room
        answer = body["choices"][0]["message"] if body else {"role": "assistant", "content": "x"}
        fill_disk(proxy, True)
        # the next request brings turn 1's next state (judged +1: its sample cannot be written, so it is held
        # in memory) and is itself refused, as is any other new turn
        second = first + [answer, {"role": "user", "content": "thanks " + BIG}]
        assert_refused(*chat(http, url, "a", second, stream))
        # while the spool is failing, a new turn is refused before the policy spends a generation on it
        tracked = len(proxy.tracker.sessions)
        status, _, _ = chat(http, url, "b", [{"role": "user", "content": "other " + BIG}], stream)
        assert status == 503
        assert len(proxy.tracker.sessions) == tracked  # no session, no turn, no generation for "b"
        assert metric(proxy, "openclaw_replies_not_durable_total", reason="write_failed") == 1
        assert metric(proxy, "openclaw_replies_not_durable_total", reason="spool_failing") == 1
        settle(proxy)  # turn 1 judged; turn 2's drop is counted after it, in turn order
        assert metric(proxy, "openclaw_turns_dropped_total", reason="not_durable") == 1
        state = health(http, url)
        assert state["ok"] is False and "database or disk is full" in state["spool"]["error"]
        assert state["spool"]["overflow"] == 1  # turn 1's sample, in memory
        assert metric(proxy, "openclaw_spool_ok") == 0

        fill_disk(proxy, False)  # space returns: the writer's retry (every second, or now) saves what it held
        proxy.writer.retry()
        proxy.writer.flush()
        state = health(http, url)
        assert state["ok"] is True and state["spool"]["overflow"] == 0 and "error" not in state["spool"]
        # as a restart would see it: turn 1's sample is in the file; the refused turns are gone for good
        reader = Spool(proxy.spool.dir)
        assert [(s.session_id, s.turn, s.reward) for s in reader.iter_samples()] == [("a", 1, 1.0)]
        assert reader.pending_turns() == []
        assert_complete(*chat(http, url, "c", [{"role": "user", "content": "hello again"}], stream))


def test_writer_holds_a_waiting_turn_it_cannot_commit_and_saves_it_with_room_again(tmp_path):
    """A waiting turn's next state that meets a full disk stays in memory (the turn is still live) and is
    committed by the retry once there is room: a restart then resumes the turn with it."""
    from array import array

    from openclaw_rl.metrics import ProxyMetrics
    from openclaw_rl.scoring import Outcome
    from openclaw_rl.turns import DropReason, Turn
    from openclaw_rl.writer import SampleWriter

    spool = Spool(tmp_path, exclusive=True)
    writer = SampleWriter(spool, ProxyMetrics())
    turn = Turn(session_key="k", session_id="s", index=1, prompt_ids=array("i", [1, 2, 3]), messages=None,
                tools=None, sampling_temperature=None, epoch="e")
    assert writer.save_turn(turn).result(10) is True
    proxy = type("P", (), {"spool": spool})
    fill_disk(proxy, True)
    turn.next_state = {"role": "user", "content": BIG}
    with pytest.raises(Exception, match="database or disk is full"):
        writer.save_next_state(turn).result(10)
    assert list(writer.unsaved) == [("k", "e", 1)] and writer.health()["ok"] is False
    writer.retry()
    writer.flush()
    assert list(writer.unsaved) == [("k", "e", 1)]  # still full: still held
    fill_disk(proxy, False)
    writer.retry()
    writer.flush()
    assert not writer.unsaved and writer.health()["ok"] is True
    assert [json.loads(p)["next_state"]["content"] for p in Spool(tmp_path).pending_turns()] == [BIG]

    # full again, and the failed turn is then dropped (its reply was refused): nothing is held any more, yet
    # the spool stays "not ok" until a write of some size commits again, not just until the next retry
    fill_disk(proxy, True)
    other = Turn(session_key="k2", session_id="s2", index=1, prompt_ids=array("i", range(20000)), messages=None,
                 tools=None, sampling_temperature=None, epoch="e")
    with pytest.raises(Exception, match="database or disk is full"):
        writer.save_turn(other).result(10)
    writer(other, Outcome(drop=DropReason.NOT_DURABLE))
    writer.retry()
    writer.flush()
    assert not writer.unsaved and writer.health()["ok"] is False
    fill_disk(proxy, False)
    writer.retry()
    writer.flush()
    assert writer.health()["ok"] is True
    writer.close()
    spool.close()


def test_disk_full_under_a_file_size_limit_in_a_subprocess(tmp_path):
    """The error from the operating system, not SQLite's page limit: a writer process whose files may not
    grow (RLIMIT_FSIZE, SIGXFSZ ignored so the write fails with EFBIG; SQLite reports it as a disk I/O
    error) cannot commit a big waiting turn: the future fails and the turn is held. With the limit lifted,
    the writer's retry commits it."""
    import subprocess
    import sys

    code = r"""
import resource, signal, sys
from array import array
from openclaw_rl.metrics import ProxyMetrics
from openclaw_rl.spool import Spool
from openclaw_rl.turns import Turn
from openclaw_rl.writer import SampleWriter
spool = Spool(sys.argv[1], exclusive=True)
writer = SampleWriter(spool, ProxyMetrics())
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
size = spool.path.stat().st_size + (spool.dir / "samples.sqlite3-wal").stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 4096, hard))
turn = Turn(session_key="k", session_id="s", index=1, prompt_ids=array("i", range(50000)), messages=None,
            tools=None, sampling_temperature=None, epoch="e")
try:
    writer.save_turn(turn).result(30)
    print("saved")
except Exception as e:
    print("refused:", e, "| held:", len(writer.unsaved), "| ok:", writer.health()["ok"])
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
writer.retry()
writer.flush()
print("after: held:", len(writer.unsaved), "| ok:", writer.health()["ok"])
writer.close()
"""
    Spool(tmp_path).close()  # the file exists before the limit applies
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines() == ["refused: disk I/O error | held: 1 | ok: False", "after: held: 0 | ok: True"], \
        out.stdout + out.stderr
    assert len(Spool(tmp_path).pending_turns()) == 1


# --- a deleted or replaced spool ----------------------------------------------------------------------------


def test_deleted_spool_is_refused_then_written_back(make_proxy, policy_server, caplog):
    proxy, url = make_proxy(policy_server.url)
    hello = [{"role": "user", "content": "hello"}]
    with http_client() as http:
        assert chat(http, url, "a", hello, False)[0] == 200
        for name in ("samples.sqlite3", "samples.sqlite3-wal", "samples.sqlite3-shm", "samples.sqlite3.lock"):
            (proxy.spool.dir / name).unlink()  # `rm spool/*`
        status, _, body = chat(http, url, "b", hello, False)
        assert status == 503 and "was deleted" in body["error"]["message"]
        assert metric(proxy, "openclaw_replies_not_durable_total", reason="spool_missing") == 1
        state = health(http, url)
        assert state["ok"] is False and "was deleted" in state["spool"]["error"]
        assert any("was deleted" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)

        proxy.writer.retry()  # the writer's periodic check (every second) finds it and writes the file back
        proxy.writer.flush()
        assert health(http, url)["ok"] is True
        waiting = [json.loads(p) for p in Spool(proxy.spool.dir).pending_turns()]
        assert [(w["session_id"], w["index"]) for w in waiting] == [("a", 1)]  # committed before the rm
        with pytest.raises(SpoolLocked):  # the lock file is back too
            Spool(proxy.spool.dir, exclusive=True)
        assert chat(http, url, "c", hello, False)[0] == 200
        assert sorted(json.loads(p)["session_id"] for p in Spool(proxy.spool.dir).pending_turns()) == ["a", "c"]


def test_replaced_spool_file_is_refused_and_left_alone(tmp_path):
    spool = Spool(tmp_path / "s", exclusive=True)
    spool.check_file()
    other = Spool(tmp_path / "other")
    other.close()
    os.replace(other.path, spool.path)
    with pytest.raises(SpoolMissing, match="replaced by another file"):
        spool.save_turn(("k", "e", 1), "{}")
    assert spool.restore_file() is False  # never written over
    assert Spool(tmp_path / "s").pending_turns() == []


# --- one proxy per spool ------------------------------------------------------------------------------------


def test_one_writer_per_spool_readers_welcome(tmp_path):
    first = Spool(tmp_path, exclusive=True)
    with pytest.raises(SpoolLocked, match=f"pid {os.getpid()}.*one proxy per spool"):
        Spool(tmp_path, exclusive=True)
    reader = Spool(tmp_path)  # `openclaw-rl samples`, tests: no lock needed to read
    assert reader.pending_turns() == []
    reader.close()
    first.unlock()  # the proxy shut down
    Spool(tmp_path, exclusive=True).close()


def test_second_proxy_on_a_spool_fails_to_start(make_proxy, policy_server, tiny_model_dir, tokenizer, tmp_path):
    from openclaw_rl.config import load_settings
    from openclaw_rl.server import Proxy

    proxy, _ = make_proxy(policy_server.url)
    settings = load_settings({"proxy_tokenizer": str(tiny_model_dir), "proxy_policy_url": policy_server.url,
                              "spool_dir": str(proxy.spool.dir)}, env={})
    with pytest.raises(SpoolLocked, match="one proxy per spool"):
        Proxy.build(settings, tokenizer=tokenizer)


# --- `local` under SIGKILL (heavy: behind OPENCLAW_TEST_FULL) ------------------------------------------------


@pytest.mark.skipif(os.environ.get("OPENCLAW_TEST_FULL") != "1",
                    reason="starts and trains `openclaw-rl local` (tens of CPU-seconds); OPENCLAW_TEST_FULL=1 runs it")
def test_local_killed_mid_run_leaves_its_spool_whole_and_free(tmp_path, tiny_model_dir):
    """SIGKILL `openclaw-rl local` after its first step, with simulated users still chatting: the kernel drops
    the spool lock (a new proxy may take the spool at once), the database is consistent, and every waiting
    turn and untrained sample committed before the kill reads back."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    env = {**os.environ, "OPENCLAW_RL_CACHE": str(tiny_model_dir.parent), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "openclaw_rl.cli", "local", "--mode", "rl", "--simulate",
                             "--interactions", "100000", "--batch-size", "2", "--port", str(free_port()),
                             "--out-dir", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = out / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text().strip()):  # another process: nothing to wait on
            assert proc.poll() is None and time.monotonic() < deadline, "no training step"
            time.sleep(0.2)
        with pytest.raises(SpoolLocked):  # while it runs, the spool is its own
            Spool(out / "spool", exclusive=True)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    spool = Spool(out / "spool", exclusive=True)  # quick_check passed, and the lock is free
    spool.release_leases()
    samples, waiting = list(spool.iter_samples()), spool.pending_turns()
    assert all(s.response_ids for s in samples) and all(json.loads(w)["generation"] for w in waiting)
    assert samples or waiting
    spool.close()


def test_a_full_disk_at_start_up_is_not_called_a_corrupt_spool(tmp_path: Path) -> None:
    """A proxy started on a full disk used to say the spool 'is corrupt' and to move it aside. With the
    file size limited below one SQLite page (the OS's own EFBIG, as a full disk gives ENOSPC) the new
    spool cannot be written: it must say so, name the setting, and not call it corrupt."""
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))
        from openclaw_rl.spool import Spool, SpoolUnwritable
        try:
            Spool({str(tmp_path / "spool")!r})
        except SpoolUnwritable as e:
            print("UNWRITABLE", e)
            sys.exit(0)
        sys.exit(3)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cannot be written" in done.stdout and "--spool-dir" in done.stdout and "corrupt" not in done.stdout
