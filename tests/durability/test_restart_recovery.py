"""Nothing lost: the proxy is SIGKILLed mid-traffic (once, then many times at random while clients
retry), or stopped gracefully (SIGTERM, SIGINT), and restarted on the same spool.

Turns waiting for their next state survive and are judged when the session's next request arrives at
the restarted proxy; a reply the client received is never lost; every sample exists exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time

import httpx
import pytest
from support import http_client, serve_cli

from openclaw_rl.servers import free_port
from openclaw_rl.spool import Spool


def start_proxy(policy_url: str, judge_url: str, tokenizer_dir: str, port: int, spool: str) -> subprocess.Popen:
    return serve_cli(port, "--policy-url", policy_url, "--judge-url", judge_url, "--tokenizer", tokenizer_dir,
                     "--prm-m", "1", "--spool-dir", spool)


def test_sigkill_mid_traffic_loses_and_duplicates_nothing(policy_server, judge_server, tiny_model_dir, tmp_path):
    spool_dir, port = str(tmp_path / "spool"), free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_proxy(policy_server.url, judge_server.url, str(tiny_model_dir), port, spool_dir)
    histories = {f"s{i}": [{"role": "user", "content": "hello"}] for i in range(6)}
    http = http_client()

    def turn(sid: str, next_user: str | None, done: bool = False) -> bool:
        headers = {"X-Session-Id": sid, **({"X-Session-Done": "1"} if done else {})}
        try:
            r = http.post(f"{url}/v1/chat/completions", json={"messages": histories[sid]}, headers=headers)
        except httpx.HTTPError:
            return False
        if r.status_code != 200:
            return False
        histories[sid].append(r.json()["choices"][0]["message"])
        if next_user:
            histories[sid].append({"role": "user", "content": next_user})
        return True

    for sid in histories:  # turn 1 of every session: answered, waiting for its next state
        assert turn(sid, "thanks, that helps")
    for sid in list(histories)[:3]:  # turn 2 for half: turn 1 gets judged, turn 2 waits
        assert turn(sid, "thanks again")
    # in-flight traffic at the moment of the kill (slow policy): those clients get errors, no samples
    model, reply = policy_server.model, policy_server.model.responder
    generating = threading.Semaphore(0)  # released as each request starts generating at the policy

    def held_reply(prompt_ids: list[int]) -> str:
        generating.release()
        return reply(prompt_ids)

    model.ttft_s, model.responder = 5.0, held_reply  # still generating when the proxy is killed
    inflight = [threading.Thread(target=turn, args=(sid, None)) for sid in ("late1", "late2")]
    for sid in ("late1", "late2"):
        histories[sid] = [{"role": "user", "content": "hello"}]
    for t in inflight:
        t.start()
    assert all(generating.acquire(timeout=60) for _ in inflight), "the late requests never reached the policy"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    for t in inflight:
        t.join(10)
    model.ttft_s, model.responder = 0.0, reply

    proc = start_proxy(policy_server.url, judge_server.url, str(tiny_model_dir), port, spool_dir)
    try:
        for sid in [s for s in histories if s.startswith("s")]:  # the next states arrive after the restart
            assert turn(sid, None, done=True)
        deadline = time.time() + 20
        expected = {(f"s{i}", 1) for i in range(6)} | {(f"s{i}", 2) for i in range(3)}
        while time.time() < deadline:
            got = [(s.session_id, s.turn) for s in Spool(spool_dir).iter_samples()]
            if set(got) >= expected:
                break
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        http.close()
    got = [(s.session_id, s.turn) for s in Spool(spool_dir).iter_samples()]
    assert len(got) == len(set(got)), "a sample was duplicated"
    assert set(got) >= expected, f"lost: {expected - set(got)}"
    assert all(s.reward == 1.0 for s in Spool(spool_dir).iter_samples() if (s.session_id, s.turn) in expected)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_graceful_stop_keeps_waiting_turns_like_a_crash(policy_server, judge_server, tiny_model_dir, tmp_path, sig):
    spool_dir, port = str(tmp_path / "spool"), free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_proxy(policy_server.url, judge_server.url, str(tiny_model_dir), port, spool_dir)
    sessions = [f"g{i}" for i in range(30)]
    replies = {}
    http = http_client()
    try:
        for sid in sessions:  # one answered turn each, waiting for its next state
            r = http.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                          headers={"X-Session-Id": sid})
            assert r.status_code == 200
            replies[sid] = r.json()["choices"][0]["message"]
    finally:
        proc.send_signal(sig)
        assert proc.wait(60) in (0, -sig)  # uvicorn re-raises the signal after its graceful shutdown
    # the old shutdown ended every session: 30 × no_next_state and no pending row left
    assert len(Spool(spool_dir).pending_turns()) == 30
    proc = start_proxy(policy_server.url, judge_server.url, str(tiny_model_dir), port, spool_dir)
    try:
        for sid in sessions:
            convo = [{"role": "user", "content": "hi"}, replies[sid], {"role": "user", "content": "thanks"}]
            r = http.post(f"{url}/v1/chat/completions", json={"messages": convo},
                          headers={"X-Session-Id": sid, "X-Session-Done": "1"})
            assert r.status_code == 200
        got = wait_spool(spool_dir, 30)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        http.close()
    assert sorted(got) == sorted((sid, 1) for sid in sessions)


def wait_spool(spool_dir: str, n: int, timeout: float = 60) -> list[tuple[str, int]]:
    deadline = time.time() + timeout
    while True:
        got = [(s.session_id, s.turn) for s in Spool(spool_dir).iter_samples()]
        if len(got) >= n or time.time() > deadline:
            return got
        time.sleep(0.2)


FULL = os.environ.get("OPENCLAW_TEST_FULL") == "1"


@pytest.mark.slow
def test_random_sigkills_with_client_retries_lose_and_duplicate_nothing(policy_server, judge_server, tiny_model_dir,
                                                                         tmp_path):
    """Clients retry every failed request (bounded) while the proxy is SIGKILLed at random moments and
    restarted. Every reply a client received and answered must become exactly one sample."""
    sessions, turns, kills = (20, 10, 12) if FULL else (6, 5, 3)
    rng = random.Random(11)
    spool_dir, port = str(tmp_path / "spool"), free_port()
    url = f"http://127.0.0.1:{port}"
    args = (policy_server.url, judge_server.url, str(tiny_model_dir), port, spool_dir)
    proc = [start_proxy(*args)]
    used: dict[str, list[int]] = {f"k{i}": [] for i in range(sessions)}  # prompt_tokens of replies used
    failures: list[str] = []
    deadline = time.time() + 900  # bounded: restarts take 5-40 s each on a loaded 2-core machine
    http = http_client()  # shared by the client threads

    def post(sid: str, convo: list, done: bool) -> dict | None:
        headers = {"X-Session-Id": sid, **({"X-Session-Done": "1"} if done else {})}
        last = ""
        while time.time() < deadline:  # retry every failure, as a client SDK does
            try:
                r = http.post(f"{url}/v1/chat/completions", json={"messages": convo}, headers=headers)
                if r.status_code == 200:
                    return r.json()
                last = f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as e:
                last = repr(e)
            time.sleep(rng.uniform(0.05, 0.2))
        failures.append(f"{sid} at turn {len(convo) // 2 + 1}: {last}")
        return None

    def client(sid: str) -> None:
        convo = [{"role": "user", "content": f"hello {sid}"}]
        for k in range(turns + 1):
            reply = post(sid, convo, done=k == turns)
            if reply is None:
                return
            if k < turns:  # this reply is used: the next request brings its next state
                used[sid].append(reply["usage"]["prompt_tokens"])
                convo += [reply["choices"][0]["message"], {"role": "user", "content": f"thanks {k}"}]
            time.sleep(rng.uniform(0, 0.3))

    threads = [threading.Thread(target=client, args=(sid,)) for sid in used]
    for t in threads:
        t.start()
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(0.3, 2.0))
            proc[0].send_signal(signal.SIGKILL)
            proc[0].wait(10)
            proc[0] = start_proxy(*args)
        for t in threads:
            t.join(300)
        got = wait_spool(spool_dir, sessions * turns)
    finally:
        proc[0].send_signal(signal.SIGINT)
        proc[0].wait(60)
        http.close()
    assert not failures
    samples = list(Spool(spool_dir).iter_samples())
    keys = [(s.session_id, len(s.prompt_ids)) for s in samples]
    assert len(keys) == len(set(keys)), "a turn became two samples"
    expected = {(sid, n) for sid, ns in used.items() for n in ns}
    assert len(expected) == sessions * turns
    assert set(keys) == expected, f"lost: {sorted(expected - set(keys))[:5]}, unexpected: {sorted(set(keys) - expected)[:5]}"
    assert all(s.reward == 1.0 for s in samples) and len(got) == sessions * turns
