"""The hostile cases of ``scripts/load_test.py``: one attack per flag against ``openclaw-rl serve`` in front
of ``openclaw-rl mock-sglang`` (policy and judge), each measured the same way.

Stage: a benchmark of the whole proxy (client → proxy → sessions → scorer → spool), as an attacker would
run it: separate processes on loopback. While one attack runs, a bystander (its own API key, its own
client address 127.0.0.1) drives ``sessions`` x ``turns`` main-line turns, each request bounded by a
timeout and retried a bounded number of times. Afterwards the proxies are stopped (SIGINT: waiting turns
stay in the spool) and the spool is read back, read-only. Printed per attack: turns acknowledged (200s)
against turns saved (samples plus pending turns of the bystander's sessions), per session: acknowledged turns missing
from the spool, duplicates, bystander requests ok / failed, latency p50 / max, and ``/proc/loadavg``.

Attacks: a slow-body flood and an idle-socket flood (``floods.py``: sockets from 127.0.0.2 … reopened
as soon as the proxy closes them), a full disk (a small tmpfs when run as root and ``mount`` works, else, mid-run,
``RLIMIT_FSIZE`` on the serve process), the spool files deleted mid-run, two proxies on one spool, a huge
policy or judge body (``mock-sglang --pad-bytes``), a backend whose text differs from its output ids
(``--mismatch-text``), and random SIGKILLs of the proxy (restarted on the same port and spool; the
bystander retries). Everything is bounded in count and time and sends to 127.0.0.0/8 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from openclaw_rl.bench.floods import ATTACKER_KEY, flood
from openclaw_rl.bench.mock import MISMATCH_PREFIX
from openclaw_rl.servers import free_port

HOST = "127.0.0.1"
BYSTANDER_KEY = "bystander-key"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class AttackConfig:
    sessions: int = 8
    turns: int = 6
    timeout_s: float = 10.0  # per bystander request
    attempts: int = 1  # per bystander turn (more with --sigkill: the client retries)
    seconds: float = 0.0  # spread each bystander session's turns over this long (0: back to back)
    slow_body: int = 0  # sockets dripping their body
    idle: int = 0  # sockets that never send a byte
    addresses: int = 1  # attacker source addresses 127.0.0.2 …
    disk_full_kb: int = 0
    disk_full_how: str = "auto"  # auto (tmpfs when root and mount work, else rlimit), tmpfs, rlimit
    delete_spool: bool = False
    two_proxies: bool = False
    huge_policy_mb: float = 0.0
    huge_judge_mb: float = 0.0
    mismatch_text: bool = False
    sigkill: int = 0
    serve_args: list[str] = field(default_factory=list)


@dataclass
class Bystander:
    ok: int = 0
    failed: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    acked: set[tuple[str, int]] = field(default_factory=set)

    def percentile(self, q: float) -> float:
        data = sorted(self.latencies)
        return data[min(len(data) - 1, int(q * len(data)))] if data else 0.0


class Processes:
    """mock-sglang policy and judge, and one or two ``serve`` processes, each with its log in ``workdir``."""

    def __init__(self, tokenizer_dir: str, workdir: Path, cfg: AttackConfig):
        self.tokenizer_dir, self.workdir, self.cfg = tokenizer_dir, workdir, cfg
        self.policy_port, self.judge_port = free_port(HOST), free_port(HOST)
        self.proxy_ports = [free_port(HOST) for _ in range(2 if cfg.two_proxies else 1)]
        self.mocks: list[subprocess.Popen] = []
        self.proxies: list[subprocess.Popen | None] = [None] * len(self.proxy_ports)
        self.spool = workdir / "spool"
        self.disk_how = ""
        self._mounted = False
        self._drains: list[threading.Thread] = []

    def _env(self) -> dict[str, str]:
        return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}

    def _spawn(self, name: str, args: list[str], level: str = "WARNING") -> subprocess.Popen:
        """Output goes through a pipe (a file-size limit on the child must not hit its log) to ``name.log``."""
        proc = subprocess.Popen([sys.executable, "-m", "openclaw_rl.cli", "--log-level", level, *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self._env(),
                                start_new_session=True)
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (closed by the drain)

        def drain() -> None:
            with log:
                for line in proc.stdout:  # type: ignore[union-attr]
                    log.write(line)
        t = threading.Thread(target=drain, daemon=True)
        t.start()
        self._drains.append(t)
        return proc

    def prepare_spool(self) -> None:
        """The spool dir; on a ``disk_full_kb`` tmpfs when that can be mounted, else noted for RLIMIT_FSIZE."""
        self.spool.mkdir(parents=True, exist_ok=True)
        kb = self.cfg.disk_full_kb
        if not kb:
            return
        if self.cfg.disk_full_how != "rlimit" and os.geteuid() == 0 and shutil.which("mount"):
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(self.spool)],
                               capture_output=True, text=True)
            if r.returncode == 0:
                self._mounted = True
                self.disk_how = (f"a 16 MiB tmpfs mounted on the spool dir, filled after a third of the turns "
                                 f"to {kb} KiB free")
                return
            why = f"mount failed: {r.stderr.strip()[:80]}"
        else:
            why = "asked for" if self.cfg.disk_full_how == "rlimit" else "not root or no mount"
        if self.cfg.disk_full_how == "tmpfs":
            raise RuntimeError(f"--disk-full-how tmpfs: cannot mount one ({why})")
        self.disk_how = (f"RLIMIT_FSIZE on every serve process, set after a third of the turns to the largest "
                         f"spool file + {kb} KiB ({why})")

    def fill_disk(self) -> str:
        """The disk fills up: on the tmpfs a filler file leaves ``disk_full_kb`` free; without one, the size of
        any file each serve process writes is limited (prlimit on the running process) to the largest spool
        file now + ``disk_full_kb``: from then on the spool cannot grow."""
        kb = self.cfg.disk_full_kb
        if self._mounted:
            filler, chunk = self.spool / "filler.bin", b"\0" * (64 << 10)
            # until the tmpfs is full (bounded by its 16 MiB), then give ``kb`` back
            with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
                for _ in range(16 * 16 + 1):
                    f.write(chunk)
            size = filler.stat().st_size
            os.truncate(filler, max(0, size - kb * 1024))
            st = os.statvfs(self.spool)
            return f"tmpfs filled: {st.f_bavail * st.f_frsize // 1024} KiB free"
        sizes = [f.stat().st_size for f in self.spool.glob("samples.sqlite3*") if f.is_file()]
        cap = max(sizes, default=0) + kb * 1024
        for proc in self.proxies:
            if proc is not None and proc.poll() is None:
                resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (cap, cap))
        return f"RLIMIT_FSIZE {cap} bytes set on serve (spool files now {sizes})"

    def start_mocks(self) -> None:
        common = ["mock-sglang", "--tokenizer", self.tokenizer_dir, "--reply-tokens", "32"]
        policy = [*common, "--port", str(self.policy_port)]
        if self.cfg.huge_policy_mb:
            policy += ["--pad-bytes", str(int(self.cfg.huge_policy_mb * 1e6))]
        if self.cfg.mismatch_text:
            policy += ["--mismatch-text"]
        judge = [*common, "--port", str(self.judge_port), "--judge"]
        if self.cfg.huge_judge_mb:
            judge += ["--pad-bytes", str(int(self.cfg.huge_judge_mb * 1e6))]
        self.mocks = [self._spawn("policy", policy), self._spawn("judge", judge)]
        for port, proc in ((self.policy_port, self.mocks[0]), (self.judge_port, self.mocks[1])):
            wait_healthy(f"http://{HOST}:{port}/health", proc)

    def start_proxy(self, i: int) -> None:
        args = ["serve", "--mode", "rl", "--policy-url", f"http://{HOST}:{self.policy_port}",
                "--judge-url", f"http://{HOST}:{self.judge_port}", "--prm-m", "3", "--tokenizer", self.tokenizer_dir,
                "--port", str(self.proxy_ports[i]), "--spool-dir", str(self.spool), "--session-ttl", "3600",
                "--api-key", BYSTANDER_KEY, "--api-key", ATTACKER_KEY, *self.cfg.serve_args]
        proc = self._spawn(f"proxy-{i}", args, "INFO")  # INFO: each dropped turn's line, read by logged_drops
        self.proxies[i] = proc
        wait_healthy(f"http://{HOST}:{self.proxy_ports[i]}/healthz", proc)

    def kill_proxy(self, i: int) -> None:
        proc = self.proxies[i]
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def stop(self) -> None:
        procs = [p for p in (*self.proxies, *self.mocks) if p is not None]
        for proc in procs:  # proxies first: SIGINT lets each one keep its waiting turns in the spool
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for t in self._drains:
            t.join(10)

    def unmount(self) -> None:
        if self._mounted:
            subprocess.run(["umount", str(self.spool)], capture_output=True)


_DROP_LINE = re.compile(r"turn dropped: reason=(\S+) session=(\S+) turn=(\d+)")


def logged_drops(workdir: Path) -> list[tuple[str, str, int]]:
    """(reason, session, turn) of every ``turn dropped`` line in the proxies' logs: a turn acknowledged and
    then dropped for a reason (a judge that failed, a turn refused as not durable) is counted, not lost."""
    out = []
    for log_path in sorted(workdir.glob("proxy-*.log")):
        for m in _DROP_LINE.finditer(log_path.read_text(errors="replace")):
            out.append((m.group(1), m.group(2), int(m.group(3))))
    return out


COUNTERS = ("openclaw_turns_dropped_total", "openclaw_slow_clients_total", "openclaw_spool_errors_total",
            "openclaw_backpressure_total", "openclaw_exactness_violations_total")


def proxy_counters(ports: list[int]) -> dict[str, float]:
    """Turns dropped (by reason), connections refused or cut, spool errors … summed over the live proxies
    (a SIGKILLed proxy's counters die with it)."""
    out: Counter = Counter()
    for port in ports:
        with contextlib.suppress(httpx.HTTPError):
            text = httpx.get(f"http://{HOST}:{port}/metrics", timeout=10,
                             headers={"Authorization": f"Bearer {BYSTANDER_KEY}"}).text
            for line in text.splitlines():
                name, _, value = line.rpartition(" ")
                if name.startswith(COUNTERS) and not name.startswith("#"):
                    with contextlib.suppress(ValueError):
                        out[name.replace("openclaw_", "").replace("_total", "")] += float(value)
    return {k: v for k, v in sorted(out.items()) if v}


def peak_rss_mb(pid: int) -> float | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode} (see its log)")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2, headers={"Authorization": f"Bearer {BYSTANDER_KEY}"}).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up within {timeout_s:g} s")


# --- the bystander ---------------------------------------------------------------------------------------

async def bystander(urls: list[str], cfg: AttackConfig, out: Bystander, progress: asyncio.Event | None = None,
                    progress_at: int = 0) -> None:
    """``sessions`` x ``turns`` main-line turns from 127.0.0.1 with the bystander's key; a turn is tried up to
    ``attempts`` times (0.2 s apart, doubling up to 2 s) and the session goes on with its next turn either way."""
    transport = httpx.AsyncHTTPTransport(local_address=HOST, retries=0)
    headers = {"Authorization": f"Bearer {BYSTANDER_KEY}"}

    async def session(client: httpx.AsyncClient, i: int) -> None:
        sid, begun = f"by-{i}", time.monotonic()
        history: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful agent."},
                                         {"role": "user", "content": f"session {sid}: please help with task 0"}]
        for t in range(cfg.turns):
            url, reply = urls[i % len(urls)], None  # odd sessions move to a second proxy once it is up
            for attempt in range(cfg.attempts):
                start = time.perf_counter()
                try:
                    r = await client.post(f"{url}/v1/chat/completions", headers={**headers, "X-Session-Id": sid},
                                          json={"model": "policy", "messages": history, "max_tokens": 32})
                except httpx.HTTPError as e:
                    out.failed[type(e).__name__] += 1
                else:
                    if r.status_code == 200:
                        out.latencies.append(time.perf_counter() - start)
                        out.ok += 1
                        out.acked.add((sid, t + 1))
                        reply = r.json()["choices"][0]["message"]
                        break
                    out.failed[str(r.status_code)] += 1
                await asyncio.sleep(min(2.0, 0.2 * 2 ** attempt))
            if progress is not None and out.ok >= progress_at:
                progress.set()
            history += [reply or {"role": "assistant", "content": "(no reply)"},
                        {"role": "user", "content": f"thanks, that worked. Now task {t + 1}"}]
            if cfg.seconds and t + 1 < cfg.turns:  # paced: the turns span the attack
                await asyncio.sleep(max(0.0, begun + cfg.seconds * (t + 1) / cfg.turns - time.monotonic()))

    async with httpx.AsyncClient(transport=transport, timeout=cfg.timeout_s, trust_env=False) as client:
        await asyncio.gather(*(session(client, i) for i in range(cfg.sessions)))


# --- reading the spool back ------------------------------------------------------------------------------

def read_spool(spool: Path) -> dict[str, Any]:
    """Samples and pending turns of the bystander's sessions, read-only (a missing file reads as empty)."""
    path = spool / "samples.sqlite3"
    if not path.exists():
        return {"samples": 0, "pending": 0, "keys": [], "note": "no spool file", "rewards": {}}
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            samples = [json.loads(p) for (p,) in db.execute("SELECT payload FROM samples")]
            pending = [json.loads(p) for (p,) in db.execute("SELECT payload FROM pending_turns")]
        finally:
            db.close()
    except (sqlite3.Error, ValueError) as e:
        return {"samples": 0, "pending": 0, "keys": [], "rewards": {}, "note": f"unreadable: {' '.join(str(e).split())[:120]}"}
    keys = [(_sid(s.get("session_id", "")), int(s.get("turn", 0))) for s in samples]
    pend = [(_sid(p.get("session_id", "")), int(p.get("index", 0))) for p in pending]
    rewards = Counter(float(s.get("reward", 0.0)) for s in samples if _sid(s.get("session_id", "")).startswith("by-"))
    mismatched = sum(str(s.get("response_text", "")).startswith(MISMATCH_PREFIX) for s in samples)
    mine = [k for k in keys if k[0].startswith("by-")]
    mine_pending = [k for k in pend if k[0].startswith("by-")]
    note = f"{mismatched} samples carry the backend's text that is not their ids" if mismatched else ""
    return {"samples": len(mine), "pending": len(mine_pending), "keys": mine + mine_pending, "note": note,
            "rewards": dict(sorted(rewards.items()))}


def _sid(value: str) -> str:
    return value.rsplit("\x1f", 1)[-1]


# --- one attack ------------------------------------------------------------------------------------------

def describe(cfg: AttackConfig) -> str:
    parts = []
    if cfg.slow_body:
        parts.append(f"slow-body flood {cfg.slow_body} sockets from {cfg.addresses} address(es)")
    if cfg.idle:
        parts.append(f"idle-socket flood {cfg.idle} sockets from {cfg.addresses} address(es)")
    if cfg.disk_full_kb:
        parts.append(f"disk full at {cfg.disk_full_kb} KiB")
    if cfg.delete_spool:
        parts.append("spool files deleted mid-run")
    if cfg.two_proxies:
        parts.append("two proxies on one spool (the second from a third of the turns)")
    if cfg.huge_policy_mb:
        parts.append(f"policy bodies padded to {cfg.huge_policy_mb:g} MB")
    if cfg.huge_judge_mb:
        parts.append(f"judge bodies padded to {cfg.huge_judge_mb:g} MB")
    if cfg.mismatch_text:
        parts.append("policy text differs from its output ids")
    if cfg.seconds:
        parts.append(f"bystander paced over {cfg.seconds:g} s")
    if cfg.sigkill:
        parts.append(f"{cfg.sigkill} random SIGKILLs, client retries x{cfg.attempts}")
    return "; ".join(parts) or "no attack (baseline)"


def run_attack(tokenizer_dir: str, cfg: AttackConfig, workdir: Path | None = None) -> dict[str, Any]:
    workdir = workdir or Path(tempfile.mkdtemp(prefix="attack-"))
    procs = Processes(tokenizer_dir, workdir, cfg)
    result: dict[str, Any] = {"attack": describe(cfg), "workdir": str(workdir)}
    stop = threading.Event()
    threads: list[threading.Thread] = []
    flood_out: dict[str, Any] = {}
    events: list[str] = []
    by = Bystander()
    try:
        procs.prepare_spool()
        procs.start_mocks()
        procs.start_proxy(0)  # a second one (--two-proxies) starts on the same spool after a third of the turns
        port = procs.proxy_ports[0]
        if cfg.slow_body or cfg.idle:
            threads.append(threading.Thread(target=flood, args=(port, cfg.slow_body or cfg.idle, cfg.addresses,
                                                                 bool(cfg.slow_body), stop, flood_out)))
        for t in threads:
            t.start()
        if threads:
            time.sleep(3)  # let the flood take its slots before the bystander starts
        urls = [f"http://{HOST}:{procs.proxy_ports[0]}"]
        load_before = Path("/proc/loadavg").read_text().strip()
        started = time.monotonic()
        asyncio.run(_drive(procs, cfg, urls, by, events))
        result["seconds"] = time.monotonic() - started
        result["loadavg"] = f"{load_before} -> {Path('/proc/loadavg').read_text().strip()}"
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        alive = [i for i, p in enumerate(procs.proxies) if p is not None and p.poll() is None]
        result["proxy_peak_rss_mb"] = [peak_rss_mb(procs.proxies[i].pid) for i in alive]  # type: ignore[union-attr]
        result["proxy_counters"] = proxy_counters([procs.proxy_ports[i] for i in alive])
        result["proxies_alive_at_end"] = f"{len(alive)} of {len(procs.proxies)}"
        procs.stop()
        result["proxy_exit_codes"] = [p.returncode if p is not None else None for p in procs.proxies]
        spool = read_spool(procs.spool)
        procs.unmount()
    keys = spool.pop("keys")
    acked_per = Counter(sid for sid, _ in by.acked)
    saved_per = Counter(sid for sid, _ in keys)
    drops = [d for d in logged_drops(workdir) if d[1] in acked_per]
    # a `not_durable` drop is a refused turn (503: never acknowledged), so it cannot account for an acknowledged one
    dropped_per = Counter(sid for reason, sid, _ in drops if reason != "not_durable")
    result.update(
        acknowledged=len(by.acked), saved=len(keys), saved_samples=spool["samples"], saved_pending=spool["pending"],
        acked_missing=sum(max(0, n - saved_per[sid]) for sid, n in acked_per.items()),
        dropped_logged=len(drops), dropped_reasons=dict(Counter(reason for reason, _, _ in drops)),
        acked_lost=sum(max(0, n - saved_per[sid] - dropped_per[sid]) for sid, n in acked_per.items()),
        unacked_saved=sum(max(0, n - acked_per[sid]) for sid, n in saved_per.items()),
        duplicates=len(keys) - len(set(keys)), spool_note=spool["note"], rewards=spool["rewards"],
        bystander_ok=by.ok, bystander_failed=sum(by.failed.values()), failures=dict(by.failed),
        p50_ms=1000 * by.percentile(0.5), max_ms=1000 * max(by.latencies, default=0.0),
        flood=flood_out, events=events, disk=procs.disk_how)
    return result


async def _drive(procs: Processes, cfg: AttackConfig, urls: list[str], by: Bystander, events: list[str]) -> None:
    total = cfg.sessions * cfg.turns
    third = asyncio.Event()
    load = asyncio.ensure_future(bystander(urls, cfg, by, third, max(1, total // 3)))
    side: list[asyncio.Future] = []
    if cfg.disk_full_kb:
        async def fill() -> None:
            await asyncio.wait({load, asyncio.ensure_future(third.wait())}, return_when=asyncio.FIRST_COMPLETED)
            events.append(f"{procs.fill_disk()} after {by.ok} acknowledged turns")
        side.append(asyncio.ensure_future(fill()))
    if cfg.two_proxies:
        async def second() -> None:
            await asyncio.wait({load, asyncio.ensure_future(third.wait())}, return_when=asyncio.FIRST_COMPLETED)
            try:
                await asyncio.to_thread(procs.start_proxy, 1)
            except RuntimeError:  # the spool's lock: the expected outcome since one spool has one writer
                said = (procs.workdir / "proxy-1.log").read_text(errors="replace").strip().splitlines()
                events.append(f"second proxy on the same spool refused after {by.ok} acknowledged turns: "
                              f"exit {procs.proxies[1].returncode if procs.proxies[1] else '?'}, "
                              f"{said[-1] if said else 'no output'}")
                return
            urls.append(f"http://{HOST}:{procs.proxy_ports[1]}")
            events.append(f"second proxy up on the same spool after {by.ok} acknowledged turns; odd sessions "
                          "move to it")
        side.append(asyncio.ensure_future(second()))
    if cfg.delete_spool:
        async def delete() -> None:
            await asyncio.wait({load, asyncio.ensure_future(third.wait())}, return_when=asyncio.FIRST_COMPLETED)
            gone = []
            for name in ("samples.sqlite3", "samples.sqlite3-wal", "samples.sqlite3-shm"):
                with contextlib.suppress(FileNotFoundError):
                    (procs.spool / name).unlink()
                    gone.append(name)
            events.append(f"deleted {', '.join(gone) or 'nothing'} after {by.ok} acknowledged turns")
        side.append(asyncio.ensure_future(delete()))
    if cfg.sigkill:
        async def kills() -> None:
            rng = random.Random(27)
            for k in range(cfg.sigkill):
                await asyncio.sleep(rng.uniform(0.5, 2.0))
                if load.done():
                    break
                i = rng.randrange(len(procs.proxies))
                procs.kill_proxy(i)
                events.append(f"SIGKILL {k + 1} (proxy {i}) after {by.ok} acknowledged turns")
                await asyncio.to_thread(procs.start_proxy, i)
        side.append(asyncio.ensure_future(kills()))
    await load
    for task in side:
        await asyncio.wait_for(task, 180)


def print_report(r: dict[str, Any]) -> None:
    print(f"attack                {r['attack']}")
    if r.get("disk"):
        print(f"  disk full via       {r['disk']}")
    for e in r.get("events", []):
        print(f"  event               {e}")
    if r.get("flood"):
        f = r["flood"]
        print(f"  flood sockets       opened {f.get('opened')}, closed by the proxy {f.get('closed_by_proxy')}, "
              f"connects failed {f.get('failed_connects')}, most open at once {f.get('max_open')}")
    print(f"  turns               acknowledged {r['acknowledged']}, saved {r['saved']} ({r['saved_samples']} samples + "
          f"{r['saved_pending']} pending); acknowledged but missing {r['acked_missing']} (dropped with a logged "
          f"reason {r['dropped_logged']} {r['dropped_reasons'] or ''}; lost {r['acked_lost']}); saved but never "
          f"acknowledged {r['unacked_saved']}; duplicate (session, turn) {r['duplicates']}{'; ' + r['spool_note'] if r['spool_note'] else ''}")
    print(f"  bystander           ok {r['bystander_ok']} / failed {r['bystander_failed']} {r['failures'] or ''}; "
          f"latency p50 {r['p50_ms']:.0f} ms, max {r['max_ms']:.0f} ms; {r.get('seconds', 0):.1f} s")
    print(f"  sample rewards      {r['rewards'] or '-'}")
    print(f"  proxy counters      {r.get('proxy_counters') or '-'}")
    print(f"  proxies             {r['proxies_alive_at_end']} alive at the end (peak RSS MB "
          f"{r['proxy_peak_rss_mb']}); exit codes {r['proxy_exit_codes']}")
    print(f"  loadavg             {r.get('loadavg')}")
    print(f"  logs                {r['workdir']}")
