"""The benchmark's processes: a policy mock, a judge mock and the proxy under test (``Stack``), and their CPU and memory.

Stage: benchmark harness (``openclaw-rl bench``, ``scripts/bench_*.py``). Each runs as its own process so the
proxy's CPU and RSS can be read from ``/proc/<pid>`` without the backends' share; the mocks themselves are
``mock.py``'s ``openclaw-rl mock-sglang``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from openclaw_rl.bench.mock import HOST
from openclaw_rl.servers import free_port


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads, exited ones too), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds_fine(pid: int) -> float:
    """On-CPU ns of the live threads (/proc/<pid>/task/*/schedstat): a per-request bracket needs
    better than the 10 ms tick of /proc/<pid>/stat."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _port(url: str) -> str:
    return url.rsplit(":", 1)[1]


class Stack:
    """Policy mock, judge mock and the proxy (``serve --judge-url … --prm-m m``) as separate processes,
    so the proxy's CPU and RSS can be read from ``/proc/<pid>`` without the backends' share."""

    def __init__(self, tokenizer_dir: str, workdir: Path, *, reply_tokens: int, judge_votes: int = 3,
                 profile_proxy: str = "", incremental: bool = False, proxy_port: int | None = None,
                 proxy_env: dict[str, str] | None = None, proxy_args: list[str] | None = None, replay: bool = True):
        # absolute: the processes run in the work directory (``_spawn``), so a path relative to the caller's
        # (``--tokenizer ./tok``, ``--profile p.pstat``) would name a file inside it there
        self.workdir, self.reply_tokens = Path(workdir).absolute(), reply_tokens
        self.tokenizer_dir = os.path.abspath(tokenizer_dir) if os.path.exists(tokenizer_dir) else tokenizer_dir
        self.judge_votes, self.profile_proxy = judge_votes, profile_proxy and os.path.abspath(profile_proxy)
        self.incremental, self.proxy_env, self.proxy_args = incremental, proxy_env or {}, proxy_args or []
        self.procs: list[subprocess.Popen] = []
        self.code_root = ""  # the checkout whose package the processes import (default: this one)
        # the proxy's interpreter and its flags, if not this one's: e.g. [".../python3.12", "-X", "perf"] (perf
        # trampolines, so that `perf report` names each Python function; bench_stream_events.py --perf)
        self.proxy_python: list[str] = []
        self.proxy_pid = 0  # the proxy's process (under py-spy: py-spy's child)
        self.replay = replay  # start the direct floor's replay server (benches that send direct turns)
        self.direct: subprocess.Popen | None = None
        self.logs: list[Any] = []
        self.log_paths: dict[int, Path] = {}  # pid -> its log: a process that exits at start says why from there
        ports = [free_port(HOST) for _ in range(2)] + [proxy_port or free_port(HOST), free_port(HOST)]
        # direct_url: the policy mock's answers replayed by a lean server (replay.py), the bench's floor
        self.policy_url, self.judge_url, self.proxy_url, self.direct_url = (f"http://{HOST}:{p}" for p in ports)

    def _spawn(self, name: str, args: list[str], extra_env: dict[str, str] | None = None,
               code_root: str = "") -> subprocess.Popen:
        # importable from any working directory; ``code_root``: this process runs another checkout's package
        # absolute: the process starts in the work directory, where a relative entry would name nothing and the
        # installed (editable) package, this checkout, would be imported in its place
        root = os.path.abspath(code_root or self.code_root or str(Path(__file__).resolve().parents[2]))
        env = {**os.environ, **(extra_env or {}), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 (lives as long as the process)
        self.logs.append(log)
        # cwd: the work directory, never a checkout: ``python -m`` puts the working directory first on sys.path,
        # ahead of PYTHONPATH, so a bench started from this checkout would run this package even with
        # ``code_root`` naming another one (an A/B against itself)
        self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir,
                                           start_new_session=True))
        self.log_paths[self.procs[-1].pid] = Path(log.name)
        return self.procs[-1]

    async def start(self, http: httpx.AsyncClient, timeout_s: float = 120.0) -> None:
        """Start all three and wait until each answers its health route. The proxy may run under cProfile."""
        mocks = [("policy", self.policy_url, ["--incremental-streaming-output"] if self.incremental else [])]
        if self.judge_votes:  # 0: no judge (PRM off), e.g. to measure streaming alone
            mocks.append(("judge", self.judge_url, ["--judge"]))
        for name, url, extra in mocks:
            self._spawn(name, [*self._cli(), "mock-sglang", "--tokenizer", self.tokenizer_dir, "--port", _port(url),
                               "--reply-tokens", str(self.reply_tokens), *extra])
        self.proxy = self._spawn("proxy", self._proxy_args(), self.proxy_env)
        urls = [f"{url}/health" for _, url, _ in mocks] + [f"{self.proxy_url}/healthz"]
        if self.replay:
            self.direct = self._spawn("direct", [sys.executable, "-m", "openclaw_rl.bench.replay", "--port",
                                                 _port(self.direct_url), "--upstream", self.policy_url])
            urls.append(f"{self.direct_url}/health")
        await self._wait_healthy(http, list(zip(self.procs, urls)), timeout_s)
        self.proxy_pid = self.proxy.pid
        if self.profile_proxy.endswith(".folded"):  # measure the proxy, not py-spy around it
            children = Path(f"/proc/{self.proxy.pid}/task/{self.proxy.pid}/children").read_text().split()
            self.proxy_pid = int(children[0]) if children else self.proxy.pid

    async def restart_proxy(self, http: httpx.AsyncClient, timeout_s: float = 120.0) -> None:
        """Stop the proxy and start a fresh one (never profiled) on the same port and mocks: a measurement that
        needs a proxy with an untouched heap gets one without the mocks' start-up again. Its spool is new and
        empty too, so it recovers nothing from the first proxy's."""
        self._stop([self.proxy])
        self.procs.remove(self.proxy)
        self.profile_proxy = ""
        self.proxy = self._spawn("proxy-2", self._proxy_args("spool-2"), self.proxy_env)
        await self._wait_healthy(http, [(self.proxy, f"{self.proxy_url}/healthz")], timeout_s)
        self.proxy_pid = self.proxy.pid

    def _cli(self) -> list[str]:
        return [sys.executable, "-m", "openclaw_rl.cli", "--log-level", "WARNING"]

    def _proxy_args(self, spool: str = "spool") -> list[str]:
        """``serve`` as the benchmark runs it, under the profiler ``profile_proxy`` names (if any)."""
        cli = self._cli()
        self._check_profiler()
        if self.profile_proxy.endswith(".folded"):  # py-spy (sampling; C time shows): collapsed stacks
            spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
            cli = [spy, "record", "--nonblocking", "--rate", "250", "-f", "raw", "-o", self.profile_proxy, "--", *cli]
        elif self.profile_proxy.endswith(".pstat"):  # yappi, CPU clock, all threads (cpu_profile.py)
            cli = [sys.executable, "-m", "openclaw_rl.bench.cpu_profile", self.profile_proxy, *cli[1:]]
        elif self.profile_proxy:
            cli = [sys.executable, "-m", "cProfile", "-o", self.profile_proxy, *cli[1:]]
        judge = ["--judge-url", self.judge_url, "--prm-m", str(self.judge_votes)] if self.judge_votes else []
        if self.proxy_python:  # in place of this interpreter, under a profiler or not
            at = cli.index(sys.executable)
            cli = [*cli[:at], *self.proxy_python, *cli[at + 1:]]
        return [*cli, "serve", "--mode", "rl", "--policy-url", self.policy_url, *judge, "--tokenizer",
                self.tokenizer_dir, "--port", _port(self.proxy_url), "--spool-dir", str(self.workdir / spool),
                "--session-ttl", "3600", *self.proxy_args]

    def _check_profiler(self) -> None:
        """The profiler ``profile_proxy`` names is installed (both are benchmark-only dependencies): else one
        clear error before anything starts, instead of a proxy that exits at once."""
        import importlib.util

        if self.profile_proxy.endswith(".pstat") and importlib.util.find_spec("yappi") is None:
            raise RuntimeError(f"profiling the proxy into {self.profile_proxy} (.pstat) needs yappi: pip install yappi")
        if self.profile_proxy.endswith(".folded") and not (shutil.which("py-spy") or
                                                           Path(sys.executable).with_name("py-spy").exists()):
            raise RuntimeError(f"profiling the proxy into {self.profile_proxy} (.folded) needs py-spy: pip install py-spy")

    def _exited(self, proc: subprocess.Popen, url: str) -> str:
        """Why ``proc`` (answering at ``url``) did not come up: its exit status and its log's last lines (the
        benchmarks' work directories are temporary, gone by the time anyone reads the error)."""
        log = self.log_paths.get(proc.pid)
        tail = log.read_text(errors="replace").strip().splitlines()[-12:] if log and log.exists() else []
        return (f"{url} did not come up: {' '.join(map(str, proc.args))[:300]} exited with status {proc.returncode}"
                + ("; its last output:\n  " + "\n  ".join(tail) if tail else " and printed nothing"))

    async def _wait_healthy(self, http: httpx.AsyncClient, checks: list[tuple[subprocess.Popen, str]],
                            timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for proc, url in checks:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(self._exited(proc, url))
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} did not come up; see the logs in {self.workdir}")
                try:
                    if (await http.get(url)).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)

    async def settle(self, quiet_s: float = 0.3, timeout_s: float = 20.0, pid: int | None = None) -> None:
        """Wait until the proxy's CPU stops moving: judge votes and spool writes outlive the responses."""
        pid = self.proxy_pid if pid is None else pid
        start = time.monotonic()
        last, quiet_since = cpu_seconds_fine(pid), time.monotonic()
        while time.monotonic() - start < timeout_s and time.monotonic() - quiet_since < quiet_s:
            await asyncio.sleep(0.05)
            now = cpu_seconds_fine(pid)
            if now - last > 0.002:
                quiet_since = time.monotonic()
            last = now

    def profile_reset(self) -> None:
        """Under a yappi profile (``*.pstat``): forget the proxy's start-up and warm-up."""
        if self.profile_proxy.endswith(".pstat"):
            os.kill(self.proxy_pid, signal.SIGUSR1)

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process, and of this one (the load generator): is the box saturated?"""
        procs = {"policy_mock": self.procs[0], **({"judge_mock": self.procs[1]} if self.judge_votes else {}),
                 "proxy": self.proxy, **({"direct_replay": self.direct} if self.direct else {})}
        return {**{n: cpu_seconds(p.pid) for n, p in procs.items()}, "bench_client": time.process_time()}

    def stop(self) -> None:
        self._stop(self.procs)
        for log in self.logs:
            log.close()

    @staticmethod
    def _stop(procs: list[subprocess.Popen]) -> None:
        for proc in procs:  # SIGINT: uvicorn shuts down cleanly (and cProfile writes its file)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
