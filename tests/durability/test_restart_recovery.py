"""Nothing lost: the proxy is SIGKILLed mid-traffic and restarted on the same spool.

Turns waiting for their next state survive the kill and are judged when the session's next request
arrives at the restarted proxy; every sample exists exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx

from openclaw_rl.servers import free_port
from openclaw_rl.spool import Spool


def start_proxy(policy_url: str, judge_url: str, tokenizer_dir: str, port: int, spool: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "openclaw_rl.cli", "serve", "--policy-url", policy_url,
                             "--judge-url", judge_url, "--tokenizer", tokenizer_dir, "--port", str(port),
                             "--prm-m", "1", "--spool-dir", spool], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("proxy did not start")


def test_sigkill_mid_traffic_loses_and_duplicates_nothing(policy_server, judge_server, tiny_model_dir, tmp_path):
    spool_dir, port = str(tmp_path / "spool"), free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_proxy(policy_server.url, judge_server.url, str(tiny_model_dir), port, spool_dir)
    histories = {f"s{i}": [{"role": "user", "content": "hello"}] for i in range(6)}

    def turn(sid: str, next_user: str | None, done: bool = False) -> bool:
        headers = {"X-Session-Id": sid, **({"X-Session-Done": "1"} if done else {})}
        try:
            r = httpx.post(f"{url}/v1/chat/completions", json={"messages": histories[sid]}, headers=headers, timeout=30)
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
    policy_server.model.ttft_s = 1.0
    inflight = [threading.Thread(target=turn, args=(sid, None)) for sid in ("late1", "late2")]
    for sid in ("late1", "late2"):
        histories[sid] = [{"role": "user", "content": "hello"}]
    for t in inflight:
        t.start()
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    for t in inflight:
        t.join(10)
    policy_server.model.ttft_s = 0.0

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
    got = [(s.session_id, s.turn) for s in Spool(spool_dir).iter_samples()]
    assert len(got) == len(set(got)), "a sample was duplicated"
    assert set(got) >= expected, f"lost: {expected - set(got)}"
    assert all(s.reward == 1.0 for s in Spool(spool_dir).iter_samples() if (s.session_id, s.turn) in expected)
