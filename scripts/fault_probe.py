"""Fault probes for `openclaw-rl train` and `local` as real processes on loopback (issue #27 item 11).

Stage: client → proxy → spool → trainer, end to end under SIGKILL, SIGTERM, a full disk (RLIMIT_FSIZE)
and a killed engine or judge. Nothing here runs in the default suite: each probe starts servers and
trains (tens of CPU-seconds). ``tests/durability/test_train_faults.py`` runs them under
``OPENCLAW_TEST_FULL=1``; by hand::

    .venv/bin/python scripts/fault_probe.py kill-train --out /tmp/probe   # SIGKILL, restart, SIGTERM
    .venv/bin/python scripts/fault_probe.py fsize-train --out /tmp/probe  # ulimit -f under train
    .venv/bin/python scripts/fault_probe.py fsize-local --out /tmp/probe  # ulimit -f under local --simulate
    .venv/bin/python scripts/fault_probe.py kill-engine --out /tmp/probe  # SIGKILL the engine, then the judge

The client here is our own (not ``--simulate``), so that every reply the proxy acknowledged (a 200) is
known by (session, turn): after the fault, each must be a waiting turn or a sample in the spool, a
dropped turn the log names, or one of the samples the trainer consumed (metrics.jsonl counts them).
Each probe prints one JSON summary and exits non-zero when an acknowledged turn is unaccounted for.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.servers import free_port  # noqa: E402
from openclaw_rl.spool import Spool, SpoolLocked  # noqa: E402

CLI = [sys.executable, "-m", "openclaw_rl.cli"]
STARTED: list[subprocess.Popen] = []
DROP = re.compile(r"turn dropped: reason=(\S+) session=(\S+) turn=(\d+)")
REFUSED = re.compile(r"refusing sample \S+ \(session (\S+) turn (\d+)\)")  # stale: consumed, not trained


def model_dir() -> Path:
    from openclaw_rl.embedded.tiny_model import ensure_tiny_model

    return Path(ensure_tiny_model())


def wait_http(url: str, proc: subprocess.Popen, limit_s: float = 180) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[3:5]} exited with {proc.returncode} before serving")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {limit_s}s")


def start(args: list[str], log: Path, ulimit_kb: int = 0) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    cmd = CLI + args
    if ulimit_kb:
        cmd = ["bash", "-c", f"ulimit -S -f {ulimit_kb}; exec \"$@\"", "bash", *cmd]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    STARTED.append(proc)
    return proc


def kill_started() -> None:
    """Whatever this probe started and is still running (a probe that failed midway) is killed."""
    for proc in STARTED:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


class Clients:
    """`n` sessions chatting in threads; each 200 is recorded as (session, turn) in ``acked``."""

    def __init__(self, url: str, n: int, tag: str, max_tokens: int = 12):
        self.url, self.n, self.tag, self.max_tokens = url, n, tag, max_tokens
        self.acked: list[tuple[str, int]] = []
        self.refused: dict[str, int] = {}
        self.first_errors: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(n)]

    def __enter__(self) -> Clients:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def _run(self, k: int) -> None:
        sid = f"{self.tag}-{k}"
        messages: list[dict[str, str]] = []
        turn = 0
        with httpx.Client(timeout=60) as http:
            while not self.stop.is_set():
                # the rule judge scores "thanks" +1 and "no, try again" -1: every turn makes a sample
                said = "thanks, next question" if (turn + k) % 2 else "no, that is wrong, try again"
                messages.append({"role": "user", "content": f"{said} ({sid}, {turn}): say something kind"})
                try:
                    r = http.post(f"{self.url}/v1/chat/completions", headers={"X-Session-Id": sid},
                                  json={"messages": messages, "max_tokens": self.max_tokens})
                    status = str(r.status_code)
                except httpx.HTTPError as exc:
                    r, status = None, type(exc).__name__
                if r is not None and r.status_code == 200:
                    with self.lock:
                        self.acked.append((sid, turn + 1))  # the proxy numbers turns from 1
                    messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
                    turn += 1
                    continue
                messages.pop()
                with self.lock:
                    self.refused[status] = self.refused.get(status, 0) + 1
                    if len(self.first_errors) < 3:
                        self.first_errors.append(f"{status}: {(r.text if r is not None else '')[:200]}")
                self.stop.wait(0.5)


def spool_contents(spool_dir: Path) -> dict[str, Any]:
    """Waiting turns and samples in the spool (read without the lock), by (session, turn)."""
    spool = Spool(spool_dir)
    try:
        waiting = {(p["session_id"], int(p["index"])) for p in map(json.loads, spool.pending_turns())}
        samples = [(s.session_id, int(s.turn)) for s in spool.iter_samples()]
    finally:
        spool.close()
    return {"waiting": waiting, "samples": set(samples), "n_samples": len(samples)}


def drops(log: Path) -> set[tuple[str, int]]:
    text = log.read_text(errors="replace")
    return ({(m[2], int(m[3])) for m in DROP.finditer(text)}
            | {(m[1], int(m[2])) for m in REFUSED.finditer(text)})


def trained_samples(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return int(sum(r.get("rollout/samples", 0) for r in rows))


def steps(metrics: Path) -> int:
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def account(acked: list[tuple[str, int]], spool_dir: Path, logs: list[Path], metrics: Path) -> dict[str, Any]:
    """Acknowledged turns against what the spool, the logs and the trainer hold. A turn is the turn
    index the proxy gives it (0-based main-line index, matched against the client's count)."""
    held = spool_contents(spool_dir)
    dropped: set[tuple[str, int]] = set()
    for log in logs:
        dropped |= drops(log)
    acked_set = set(acked)
    in_spool = acked_set & (held["waiting"] | held["samples"])
    in_drops = (acked_set - in_spool) & dropped
    unaccounted = acked_set - in_spool - in_drops
    trained = trained_samples(metrics)
    return {"acked": len(acked_set), "waiting": len(held["waiting"]), "samples": held["n_samples"],
            "acked_in_spool": len(in_spool), "acked_dropped_in_log": len(in_drops), "trained_samples": trained,
            "not_in_spool_or_log": len(unaccounted), "lost_at_least": max(0, len(unaccounted) - trained),
            "unaccounted_examples": sorted(unaccounted)[:5]}


def first_lines(log: Path, n: int = 6, pattern: str = r"ERROR|error|Traceback|WARNING|interrupted|stop") -> list[str]:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if re.search(pattern, ln)]
    return lines[:n]


def lock_free(spool_dir: Path) -> bool:
    try:
        Spool(spool_dir, exclusive=True).close()
    except SpoolLocked:
        return False
    return True


class Backends:
    def __init__(self, out: Path, model: Path):
        self.out, self.model = out, model
        self.engine_port, self.judge_port = free_port(), free_port()
        self.engine = self.judge = None

    def start_engine(self) -> None:
        self.engine = start(["engine", "--model", str(self.model), "--port", str(self.engine_port)],
                            self.out / "engine.log")
        wait_http(f"http://127.0.0.1:{self.engine_port}/health", self.engine)

    def start_judge(self) -> None:
        self.judge = start(["judge", "--model", str(self.model), "--port", str(self.judge_port)], self.out / "judge.log")
        wait_http(f"http://127.0.0.1:{self.judge_port}/health", self.judge)

    def __enter__(self) -> Backends:
        self.start_engine()
        self.start_judge()
        return self

    def __exit__(self, *exc: Any) -> None:
        for p in (self.engine, self.judge):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)

    def train_args(self, out: Path, port: int, batch: int = 4) -> list[str]:
        return ["train", "--model", str(self.model), "--policy-url", f"http://127.0.0.1:{self.engine_port}",
                "--judge-url", f"http://127.0.0.1:{self.judge_port}", "--port", str(port), "--out-dir", str(out),
                "--batch-size", str(batch), "--lr", "5e-4", "--fidelity-copies", "0", "--session-ttl", "3600"]


def wait_for(cond: Any, proc: subprocess.Popen | None, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {limit_s}s")
        time.sleep(0.3)


def stop(proc: subprocess.Popen, sig: int, limit_s: float = 120) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        return -999  # hung


def probe_kill_train(out: Path) -> dict[str, Any]:
    """SIGKILL `train` after its first step with clients chatting; restart it on the same --out-dir,
    chat until a new step, then SIGTERM it."""
    result: dict[str, Any] = {}
    run = out / "run"
    with Backends(out, model_dir()) as b:
        port = free_port()
        log1 = out / "train1.log"
        proc = start(b.train_args(run, port), log1)
        wait_http(f"http://127.0.0.1:{port}/healthz", proc)
        metrics = run / "metrics.jsonl"
        with Clients(f"http://127.0.0.1:{port}", 6, "a") as clients:
            wait_for(lambda: steps(metrics) >= 1, proc, 300, "first step")
            result["locked_while_running"] = not lock_free(run / "spool")
            result["sigkill_rc"] = stop(proc, signal.SIGKILL)
            clients.stop.set()
        result["lock_free_after_kill"] = lock_free(run / "spool")
        result["after_kill"] = account(clients.acked, run / "spool", [log1], metrics)
        result["clients_refused_1"] = clients.refused
        steps_before = steps(metrics)

        log2 = out / "train2.log"
        proc = start(b.train_args(run, port), log2)
        wait_http(f"http://127.0.0.1:{port}/healthz", proc)
        with Clients(f"http://127.0.0.1:{port}", 6, "b") as clients2:
            wait_for(lambda: steps(metrics) > steps_before, proc, 300, "a step after the restart")
            result["steps_before_restart"], result["steps_after_restart"] = steps_before, steps(metrics)
            result["sigterm_rc"] = stop(proc, signal.SIGTERM)
            clients2.stop.set()
        result["report_written"] = (run / "report.json").exists()
        result["lock_free_after_sigterm"] = lock_free(run / "spool")
        result["after_sigterm"] = account(clients.acked + clients2.acked, run / "spool", [log1, log2], metrics)
        result["train2_lines"] = first_lines(log2)
    return result


def probe_fsize(out: Path, command: str, limit_kb: int) -> dict[str, Any]:
    """`train` (or `local --simulate`) under `ulimit -f limit_kb`: what does the first failed write do?"""
    result: dict[str, Any] = {"limit_kb": limit_kb}
    run = out / "run"
    port = free_port()
    log = out / f"{command}.log"
    backends = Backends(out, model_dir())
    try:
        if command == "train":
            backends.__enter__()
            args = backends.train_args(run, port)
        else:
            args = ["local", "--mode", "rl", "--simulate", "--interactions", "100000", "--batch-size", "4",
                    "--port", str(port), "--out-dir", str(run)]
        proc = start(args, log, ulimit_kb=limit_kb)
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", proc, 300)
        except RuntimeError as exc:
            result["start_error"] = str(exc)
        clients = Clients(f"http://127.0.0.1:{port}", 4, "f") if command == "train" else None
        if clients is not None and proc.poll() is None:
            clients.__enter__()
        deadline = time.monotonic() + 150
        health: Any = None
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()
                if health.get("ok") is False:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        result["healthz_when_stopped_waiting"] = health
        result["exited_by_itself"] = proc.poll()
        if proc.poll() is None and health and health.get("ok") is False:
            # "space returns": lift the file-size limit of the running process, then wait for a step
            import resource

            resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            s0 = steps(run / "metrics.jsonl")
            try:
                wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json().get("ok") is True,
                         proc, 60, "healthz ok after the limit was lifted")
                result["healthz_ok_again"] = True
                wait_for(lambda: steps(run / "metrics.jsonl") > s0, proc, 180, "a step after the limit was lifted")
                result["step_after_space_returned"] = True
            except RuntimeError as exc:
                result["after_space_returned"] = str(exc)
        if proc.poll() is None:
            result["sigterm_rc"] = stop(proc, signal.SIGTERM)
        else:
            result["rc"] = proc.returncode
        if clients is not None:
            clients.__exit__()
            result["clients_refused"] = clients.refused
            result["clients_first_errors"] = clients.first_errors
            result["account"] = account(clients.acked, run / "spool", [log], run / "metrics.jsonl")
        result["steps"] = steps(run / "metrics.jsonl")
        result["lock_free"] = lock_free(run / "spool") if (run / "spool").exists() else None
        text = log.read_text(errors="replace")
        result["tracebacks"] = text.count("Traceback")
        result["log_lines"] = len(text.splitlines())
        result["first_lines"] = first_lines(log, 8)
        result["last_lines"] = text.splitlines()[-6:]
        result["files"] = {str(p.relative_to(run)): p.stat().st_size for p in run.rglob("*") if p.is_file()}
    finally:
        backends.__exit__()
    return result


def probe_kill_backend(out: Path) -> dict[str, Any]:
    """Under `train` with clients chatting: SIGKILL the engine (turns in flight, new turns), start it again;
    then SIGKILL the judge and start it again. Training must go on, nothing acknowledged lost."""
    result: dict[str, Any] = {}
    run = out / "run"
    with Backends(out, model_dir()) as b:
        port = free_port()
        log = out / "train.log"
        proc = start(b.train_args(run, port), log)
        wait_http(f"http://127.0.0.1:{port}/healthz", proc)
        metrics = run / "metrics.jsonl"
        with Clients(f"http://127.0.0.1:{port}", 6, "e") as clients:
            wait_for(lambda: steps(metrics) >= 1, proc, 300, "first step")
            os.killpg(b.engine.pid, signal.SIGKILL)
            b.engine.wait(30)
            n = sum(clients.refused.values())
            wait_for(lambda: sum(clients.refused.values()) >= n + 3, proc, 60, "refusals with the engine down")
            result["refused_engine_down"] = dict(clients.refused)
            result["first_errors_engine_down"] = list(clients.first_errors)
            b.start_engine()
            s = steps(metrics)
            wait_for(lambda: steps(metrics) > s, proc, 300, "a step after the engine restarted")
            os.killpg(b.judge.pid, signal.SIGKILL)
            b.judge.wait(30)
            acked_at_kill = len(clients.acked)
            wait_for(lambda: len(clients.acked) >= acked_at_kill + 6, proc, 120, "replies with the judge down")
            time.sleep(3)  # judge retries run (1 s backoff, doubling): let some fail before it returns
            b.start_judge()
            s = steps(metrics)
            wait_for(lambda: steps(metrics) > s, proc, 300, "a step after the judge restarted")
            result["sigterm_rc"] = stop(proc, signal.SIGTERM)
            clients.stop.set()
        result["account"] = account(clients.acked, run / "spool", [log], metrics)
        result["refused_total"] = clients.refused
        result["steps"] = steps(metrics)
        result["restores"] = json.loads((run / "report.json").read_text()).get("restores")
        result["lines"] = first_lines(log, 10)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("probe", choices=["kill-train", "fsize-train", "fsize-local", "kill-engine"])
    p.add_argument("--out", required=True)
    p.add_argument("--limit-kb", type=int, default=0, help="ulimit -f for the fsize probes")
    ns = p.parse_args()
    atexit.register(kill_started)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    if ns.probe == "kill-train":
        result = probe_kill_train(out)
    elif ns.probe == "kill-engine":
        result = probe_kill_backend(out)
    else:
        result = probe_fsize(out, ns.probe.split("-")[1], ns.limit_kb or 2048)
    print(json.dumps(result, indent=1, default=sorted))
    lost = [v.get("lost_at_least", 0) for v in result.values() if isinstance(v, dict)]
    return 1 if any(lost) else 0


if __name__ == "__main__":
    sys.exit(main())
