"""The dashboard's journal and queries through a real proxy: what became of each turn, key by key.

Two API keys talk to an OPD proxy (scripted policy; the hint-aware scripted teacher), then a batch is
leased and acknowledged as a trainer does. Each key must see its own sessions only, each turn's fate
(dropped with its reason, trained in step N), the judge's votes and hint, and the teacher's per-token
advantage; the page and its assets load nothing from elsewhere.
"""

from __future__ import annotations

import re
import threading

import httpx
import pytest
from support import HINT, settle, wait_for_samples

from openclaw_rl.dashboard.journal import JOURNAL, ROTATED, TurnJournal, read_journal

KEYS = ["key-alice", "key-bob"]


def talk(url: str, key: str, sid: str, user_turns: list[str]) -> None:
    convo: list[dict] = []
    for i, text in enumerate(user_turns):
        convo.append({"role": "user", "content": text})
        headers = {"X-Session-Id": sid, "Authorization": f"Bearer {key}"}
        if i == len(user_turns) - 1:
            headers["X-Session-Done"] = "1"
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": convo}, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        convo.append(r.json()["choices"][0]["message"])


def get(url: str, path: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{url}{path}", headers=headers, timeout=30)


@pytest.fixture
def proxy_with_two_keys(policy_server, teacher_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, teacher_server.url, mode="opd", judge_votes=1, proxy_api_keys=KEYS)
    talk(url, KEYS[0], "alice-1", ["hello", "that is wrong", "thanks"])  # turn 1 hinted, 2 no_hint, 3 no_next_state
    talk(url, KEYS[1], "bob-1", ["hello", "bye"])
    wait_for_samples(proxy, 1)
    settle(proxy)
    return proxy, url


def test_each_key_sees_its_own_sessions_and_why_each_turn_trained_or_not(proxy_with_two_keys):
    proxy, url = proxy_with_two_keys
    from openclaw_rl.runtime import ProxyRuntime

    # what a trainer does: lease the batch, train it as step 7, acknowledge it (ProxyRuntime's own methods)
    runtime = ProxyRuntime.__new__(ProxyRuntime)
    runtime.proxy, runtime._unacked = proxy, []
    proxy.gate.open()
    batch = runtime.collect(1)
    runtime.ack(batch.batch_id, 7)
    proxy.journal.flush()

    assert get(url, "/dashboard/api/overview", None).status_code == 401
    assert get(url, "/dashboard/api/overview", "key-eve").status_code == 401
    alice = get(url, "/dashboard/api/overview", KEYS[0]).json()
    bob = get(url, "/dashboard/api/overview", KEYS[1]).json()
    assert [s["session"] for s in alice["sessions"]] == ["alice-1"]
    assert [s["session"] for s in bob["sessions"]] == ["bob-1"]
    assert alice["sessions"][0]["states"] == {"trained": 1, "dropped": 2}
    assert alice["drops"]["totals"] == {"no_hint": 1, "no_next_state": 1}
    assert bob["drops"]["totals"] == {"no_hint": 1, "no_next_state": 1}

    turns = get(url, "/dashboard/api/session?id=alice-1", KEYS[0]).json()["turns"]
    assert [(t["turn"], t["fate"]["state"]) for t in turns] == [(1, "trained"), (2, "dropped"), (3, "dropped")]
    assert turns[1]["fate"]["reason"] == "no_hint" and turns[2]["fate"]["reason"] == "no_next_state"
    assert get(url, "/dashboard/api/session?id=alice-1", KEYS[1]).json()["turns"] == []  # bob sees none of it

    detail = get(url, "/dashboard/api/turn?session=alice-1&turn=1", KEYS[0]).json()
    assert detail["fate"] == {"state": "trained", "step": 7, "weight_version": detail["weight_version"],
                              "trained_into": "step-7"}
    assert detail["judge"]["hint"] == HINT and detail["judge"]["votes"][0]["raw"]  # the vote with its reasoning
    assert detail["next_state"]["content"] == "that is wrong"
    sample = proxy_sample = batch.samples[0]
    shown = detail["samples"][0]
    assert shown["id"] == sample.sample_id and len(shown["tokens"]) == sample.response_length
    expected = [round(t - r, 4) for t, r in zip(proxy_sample.teacher_log_probs, proxy_sample.rollout_log_probs)]
    assert shown["advantage"] == expected  # the teacher's per-token advantage, token by token
    assert "".join(shown["tokens"]) == proxy.renderer.tokenizer.decode(sample.response_ids)
    assert get(url, "/dashboard/api/turn?session=alice-1&turn=1", KEYS[1]).status_code == 404


def test_a_waiting_turn_shows_as_waiting_to_its_key_only(policy_server, teacher_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, teacher_server.url, mode="opd", judge_votes=1, proxy_api_keys=KEYS)
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}]},
                   headers={"X-Session-Id": "open", "Authorization": f"Bearer {KEYS[0]}"}, timeout=30)
    assert r.status_code == 200
    turns = get(url, "/dashboard/api/session?id=open", KEYS[0]).json()["turns"]
    assert [(t["turn"], t["fate"]) for t in turns] == [(1, {"state": "waiting", "reason": "waiting for its next state"})]
    assert get(url, "/dashboard/api/session?id=open", KEYS[1]).json()["turns"] == []


def test_the_page_loads_nothing_from_elsewhere(policy_server, make_proxy):
    proxy, url = make_proxy(policy_server.url, proxy_api_keys=KEYS)
    page = httpx.get(f"{url}/dashboard", timeout=30)  # no key: the page holds no data
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    texts = [page.text] + [httpx.get(f"{url}/dashboard/static/{n}", timeout=30).text for n in ("app.js", "style.css")]
    for text in texts:
        assert not re.search(r"(src|href)=[\"']?(https?:)?//", text)
        assert not re.search(r"url\(\s*[\"']?(https?:)?//", text)
    assert httpx.get(f"{url}/dashboard/static/..%2Fjournal.py", timeout=30).status_code == 404


def test_the_journal_is_bounded_and_survives_a_torn_line(tmp_path):
    journal = TurnJournal(tmp_path, max_bytes=2_000)
    for i in range(100):
        journal.batch(f"b{i}", [f"sample-{i}-{j}" for j in range(8)])
    journal.flush()
    journal.close()
    assert (tmp_path / ROTATED).exists()
    assert (tmp_path / JOURNAL).stat().st_size <= 2_000 and (tmp_path / ROTATED).stat().st_size <= 2_000
    with open(tmp_path / JOURNAL, "ab") as f:
        f.write(b'{"ev": "batch", "batch": "torn')  # a crash mid-line
    lines = list(read_journal(tmp_path))
    assert lines and lines[-1]["batch"] == "b99"
    assert [int(line["batch"][1:]) for line in lines] == sorted(int(line["batch"][1:]) for line in lines)


def test_the_journal_writes_a_burst_of_lines_at_once_and_each_line_whole(tmp_path, monkeypatch):
    """Lines queued together go out in one write (not a write per turn), only whole lines are ever written, and
    without any flush a line reaches the file ~``GATHER_S`` after its burst began."""
    from openclaw_rl.dashboard import journal as journal_module

    writes: list[bytes] = []
    real_open = journal_module.TurnJournal._open

    def recording_open(self):
        real_open(self)
        raw = self._file
        write = raw.write

        class Recording:
            def write(self, data):
                writes.append(bytes(data))
                return write(data)

            def __getattr__(self, name):
                return getattr(raw, name)

        self._file = Recording()

    monkeypatch.setattr(journal_module.TurnJournal, "_open", recording_open)
    release = threading.Event()
    handle = journal_module.TurnJournal._handle

    def held(self, op, a, b):  # the first line holds the thread until the burst is queued behind it
        handle(self, op, a, b)
        if op == "line" and a.get("ev") == "hold":
            release.wait(10)

    monkeypatch.setattr(journal_module.TurnJournal, "_handle", held)
    journal = TurnJournal(tmp_path)
    journal._queue.put(("line", {"ev": "hold"}, None))
    for i in range(50):
        journal.batch(f"b{i}", ["s"])
    release.set()
    pause = threading.Event()  # never set: a 10 ms wait between looks
    for _ in range(1000):  # no flush: the quiet moment writes them (waits up to 10 s for that)
        if (tmp_path / JOURNAL).exists() and b'"b49"' in (tmp_path / JOURNAL).read_bytes():
            break
        pause.wait(0.01)
    lines = list(read_journal(tmp_path))
    journal.close()
    assert [line["batch"] for line in lines if line["ev"] == "batch"] == [f"b{i}" for i in range(50)]
    assert len(writes) == 1, len(writes)  # 51 lines, one burst: one write, not one per line
    assert all(w.endswith(b"\n") for w in writes)


def test_a_stopped_runs_dashboard_without_keys_shows_every_session_and_its_metrics(tmp_path):
    """`openclaw-rl dashboard --spool-dir`: the journal, the spool's waiting turns and metrics.jsonl beside it."""
    from fastapi.testclient import TestClient

    from openclaw_rl.cli import build_parser
    from openclaw_rl.dashboard.command import standalone_app
    from openclaw_rl.spool import Spool

    spool_dir = tmp_path / "spool"
    spool = Spool(spool_dir)
    spool.save_turn(("ns-b\x1fwaiting", "e", 1), '{"session_key": "ns-b\\u001fwaiting", "session_id": "waiting", '
                                                   '"index": 1, "epoch": "e", "created": 1.0, "next_state": null}')
    spool.close()
    (spool_dir / JOURNAL).write_text('{"ev": "turn", "t": 2.0, "ns": "ns-a", "session": "done", "epoch": "e", '
                                     '"turn": 1, "drop": "zero_score", "samples": []}\n')
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "rollout/reward_mean": 0.5, "train/loss": 0.1}\n')
    client = TestClient(standalone_app(spool_dir))
    overview = client.get("/dashboard/api/overview").json()
    assert {s["session"]: s["states"] for s in overview["sessions"]} == {"done": {"dropped": 1}, "waiting": {"waiting": 1}}
    assert [c["name"] for c in overview["training"]["curves"]] == ["rollout/reward_mean", "train/loss"]
    assert overview["drops"]["totals"] == {"zero_score": 1}
    assert build_parser().parse_args(["dashboard", "--spool-dir", str(spool_dir)]).port == 8400


def test_a_rotation_that_fails_once_does_not_stop_the_journal(tmp_path, monkeypatch):
    """The rename of a full journal fails (e.g. the file was removed under it): that line is lost and counted,
    and the next lines are written again, not refused forever by a closed file."""
    from pathlib import Path as P

    journal = TurnJournal(tmp_path, max_bytes=300)  # two long lines do not fit, a long and a short one do
    journal.batch("first", ["x" * 150])
    journal.flush()
    real_replace = P.replace
    failures = []

    def failing_once(self, target):
        if not failures:
            failures.append(self)
            raise FileNotFoundError("gone")
        return real_replace(self, target)

    monkeypatch.setattr(P, "replace", failing_once)
    journal.batch("second", ["y" * 150])  # would rotate: the rename fails
    journal.flush()
    journal.batch("third", [])
    journal.flush()
    journal.close()
    assert failures and journal.errors == 1
    assert "third" in [line["batch"] for line in read_journal(tmp_path)]
