"""Shared fixtures. The suite never touches the network: the tiny model is built locally."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import build_session_model, judge_reply, policy_reply, private_model_build, scripted_server

# huggingface_hub reads these at import time, so set them before any test imports transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def share_the_cores() -> None:
    """With N pytest-xdist workers on C cores, torch in each worker (and in the servers its tests start,
    which inherit the environment) gets C // N threads instead of C. N workers of C OpenMP threads each
    oversubscribe the cores, and small ops then spin in barriers waiting for descheduled threads: the
    tail-forward test cost 38 CPU-s with 2 threads against 18 with 1 on a busy 2-core machine. Set before
    any test imports torch; an ``OMP_NUM_THREADS`` the user chose is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 1:
        threads = str(max(1, len(os.sched_getaffinity(0)) // workers))
        os.environ.setdefault("OMP_NUM_THREADS", threads)
        os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])


share_the_cores()


def share_tls_contexts() -> None:
    """Every httpx client builds a TLS context, and with it loads certifi's CA bundle: ~55 ms of CPU each.
    The tests create several hundred clients (one-shot ``httpx.get``/``post``, OpenAI SDK clients, judge
    clients) to talk plain HTTP to loopback servers: 364 contexts, ~20 CPU-s, in the core, durability and
    engine tests alone. Here the clients of one test process share one context per setting (a default
    ``verify``/``trust_env`` pair; a CA path, an SSLContext or a client certificate gets its own, as
    before). The tests' clients all speak HTTP/1.1 (httpcore sets the context's ALPN list on each TLS
    connect) and none changes ``SSL_CERT_FILE``/``SSL_CERT_DIR`` mid-run (read when a context is built); the
    proxy shares one the same way (``server.tls_context``). A httpx without this function is left alone."""
    try:
        import httpx._transports.default as transports
    except ImportError:  # pragma: no cover - another httpx layout: every client builds its own
        return
    build = getattr(transports, "create_ssl_context", None)
    if build is None:  # pragma: no cover
        return
    shared: dict[tuple[Any, ...], Any] = {}

    def shared_context(verify: Any = True, cert: Any = None, trust_env: bool = True, **options: Any) -> Any:
        if not isinstance(verify, bool) or cert is not None:
            return build(verify=verify, cert=cert, trust_env=trust_env, **options)
        key = (verify, trust_env, *sorted(options.items()))
        if key not in shared:
            shared[key] = build(verify=verify, cert=cert, trust_env=trust_env, **options)
        return shared[key]

    transports.create_ssl_context = shared_context


share_tls_contexts()


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """The cycle collector off while the test modules are imported, and what they imported frozen after.

    Collection imports torch, transformers, hypothesis, openai and ~250 test modules whose asserts pytest
    rewrites (an AST per module; this machine sets ``PYTHONDONTWRITEBYTECODE=1``, so nothing is cached), and
    the heap grows from nothing to ~500K tracked objects: the collector ran ~3,300 times, 20 of them full
    collections that each walk the whole heap. Measured with ``gc.callbacks`` (one ``pytest --collect-only``,
    load ~3): 4.8 of its 13.8 CPU-s were garbage collection; with it off, 7.7 user CPU-s instead of 15.5
    and 10 MB more peak memory (imports make little cyclic garbage). Every pytest-xdist worker collects the
    whole suite, so each saves this. Afterwards the start-up objects are frozen (as ``Proxy.start`` does in
    the proxy), so a test's full collections walk only what the tests made, and collection is back on."""
    import gc

    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


REPO = Path(__file__).resolve().parents[1]


def tiny_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's tiny model lives. Building it (tokenizer + pre-training) is the suite's largest
    fixed cost, so it is kept in the repository's ignored ``.cache/`` under a key of its sources (every file
    of ``openclaw_rl/embedded``), library versions and thread count: any change rebuilds it. A private,
    fresh build with ``OPENCLAW_TEST_FRESH_MODEL=1`` (``scripts/run_full_tests.sh`` sets it; see
    ``support.private_model_build``), shared by the workers of one ``pytest -n`` run."""
    import hashlib

    import tokenizers
    import torch
    import transformers

    import openclaw_rl.embedded as embedded

    if private_model_build(os.environ):
        base = tmp_path_factory.getbasetemp()
        return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tiny-cache"
    key = hashlib.sha256()
    package = Path(embedded.__file__).parent
    for path in sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        key.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    key.update(f"{torch.__version__} {transformers.__version__} {tokenizers.__version__} "
               f"{torch.get_num_threads()}".encode())
    return REPO / ".cache" / "test-tiny-models" / key.hexdigest()[:16]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default (h128, seed 0) tiny model, built once (see ``tiny_model_cache``)."""
    return build_session_model(tiny_model_cache(tmp_path_factory))


@pytest.fixture(scope="session", autouse=True)
def tiny_model_in_background(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                             ) -> Iterator[None]:
    """Start building a missing tiny model in a background process before the first test, when the session
    has tests that need it: ``pytest_collection_modifyitems`` runs the tests that do not first, so they use
    the cores meanwhile instead of every process waiting for the build (a minute of CPU in a fresh clone).
    One process of a ``pytest -n`` run starts it; ``tiny_model_dir`` waits for it on the build lock."""
    import fcntl
    import subprocess
    import sys

    from openclaw_rl.embedded.tiny_model import MARKER_FILE, tiny_model_path

    if not any(needs_model(item) for item in request.session.items):
        yield
        return
    cache = tiny_model_cache(tmp_path_factory)
    done = tiny_model_path("h128", cache) / MARKER_FILE
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_name(cache.name + ".start"), "w") as starter:
        try:  # held for the session: the other workers of this run leave the build to this one
            fcntl.flock(starter, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            starter.close()
        if starter.closed or done.is_file():
            yield
            return
        builder = subprocess.Popen([sys.executable, str(Path(__file__).with_name("support.py")), str(cache)],
                                   stdout=subprocess.PIPE, text=True)
        assert builder.stdout is not None
        builder.stdout.readline()  # "locked" (or EOF if it failed: tiny_model_dir then builds and says why)
        try:
            yield
        finally:
            if builder.poll() is None and not done.is_file():
                builder.send_signal(signal.SIGINT)  # the session ended early (-x, -k, Ctrl-C): no half build left
            builder.communicate(timeout=600)


class SigtermNotHandled(Exception):
    """SIGTERM reached a test's fallback handler: the command under test installed none of its own."""


@pytest.fixture
def sigterm_at_the_second_step(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], int]]:
    """SIGTERM raised on this (the main) thread as the embedded trainer starts its second step, so a
    command run in this process meets it with its own handler installed; yields how many steps began.

    Meanwhile the test process's SIGTERM handler is a fallback that fails the test instead of ending the
    process, should the command not install its own (else a regression would kill the pytest worker);
    after the test, the handler it replaced. ``signal.getsignal`` after the command must be the fallback."""
    from openclaw_rl.embedded.trainer import EmbeddedTrainer

    def not_handled(signum: int, frame: Any) -> None:
        raise SigtermNotHandled("SIGTERM reached the test's fallback handler: the command installed none")

    began: list[int] = []
    train = EmbeddedTrainer.train

    def terminated_at_the_second_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        began.append(1)
        if len(began) == 2:
            signal.raise_signal(signal.SIGTERM)
        return train(self, *args, **kwargs)

    monkeypatch.setattr(EmbeddedTrainer, "train", terminated_at_the_second_step)
    previous = signal.signal(signal.SIGTERM, not_handled)
    try:
        yield lambda: len(began)
        assert signal.getsignal(signal.SIGTERM) is not_handled, "the command did not put back the handler it found"
    finally:
        signal.signal(signal.SIGTERM, previous)


def needs_model(item: pytest.Item) -> bool:
    return "tiny_model_dir" in getattr(item, "fixturenames", ())


# Files whose tests take longest (CPU-seconds, measured), longest first: they start first in their group, so
# the pytest-xdist workers do not end with one of them running alone.
LONGEST_FIRST = ("tests/bench/test_bench_smoke.py", "tests/slime_plugins/test_no_shadowing.py",
                 "tests/embedded/test_tail_forward.py", "tests/durability/test_restart_recovery.py",
                 "tests/learning/test_learning.py", "tests/learning/test_local_shutdown.py", "tests/core/test_cli.py",
                 "tests/embedded/test_pretrain.py", "tests/embedded/test_tiny_model.py",
                 "tests/durability/test_slow_clients.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run order: the modules that need no tiny model first (they run while it is built, see
    ``tiny_model_in_background``), then the others; the longest modules first within each group. A module
    stays in one piece and in its own order, so its module fixtures are set up once per process."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def rank(path: str) -> tuple[bool, int]:
        first = [i for i, prefix in enumerate(LONGEST_FIRST) if path.startswith(prefix)]
        return any(needs_model(item) for item in modules[path]), first[0] if first else len(LONGEST_FIRST)

    items[:] = [item for path in sorted(modules, key=rank) for item in modules[path]]


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def policy_server(tokenizer: Any) -> Iterator[Any]:
    with scripted_server(tokenizer, policy_reply) as server:
        yield server


@pytest.fixture
def judge_server(tokenizer: Any) -> Iterator[Any]:
    with scripted_server(tokenizer, judge_reply) as server:
        yield server


@pytest.fixture
def make_proxy(tmp_path: Path, tiny_model_dir: Path, tokenizer: Any) -> Iterator[Callable[..., Any]]:
    """Start a proxy on loopback: make_proxy(policy_url, judge_url="", **settings) → (proxy, base_url)."""
    from openclaw_rl.config import load_settings
    from openclaw_rl.server import Proxy
    from openclaw_rl.servers import BackgroundServer

    started: list[tuple[Any, Any]] = []

    def start(policy_url: str, judge_url: str = "", gate_open: bool = True, **values: Any) -> tuple[Any, str]:
        settings = load_settings({"proxy_tokenizer": str(tiny_model_dir), "proxy_policy_url": policy_url,
                                  "judge_url": judge_url, "spool_dir": str(tmp_path / f"spool{len(started)}"),
                                  "judge_max_new_tokens": 256, **values}, env={})
        proxy = Proxy.build(settings, tokenizer=tokenizer, gate_open=gate_open)
        server = BackgroundServer(proxy.app).start()
        proxy.server = server  # tests reach the proxy's event loop through it (support.on_loop)
        started.append((proxy, server))
        return proxy, server.url

    yield start
    for proxy, server in started:
        server.stop()
        proxy.writer.close()  # its thread and record files end with the test, not at interpreter exit


@pytest.fixture
def teacher_server(tokenizer: Any) -> Iterator[Any]:
    """A judge whose teacher log-probs reveal whether the hint was in the prompt (see support.hint_aware_scorer)."""
    from support import hint_aware_scorer

    with scripted_server(tokenizer, judge_reply, scorer=hint_aware_scorer(tokenizer)) as server:
        yield server


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cost-log", default="", metavar="PATH",
                     help="append one JSON line per test to PATH: its CPU seconds (the test process's own and those of "
                          "the child processes it reaped), wall seconds, start time and xdist worker; "
                          "scripts/suite_cost.py sums them by module and draws the two workers' timeline")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """What each test costs, for ``--cost-log`` (pytest's ``--durations`` reports wall time only, and on a
    shared 2-core machine the suite is bound by CPU, much of it in the servers and CLIs the tests start)."""
    import json
    import resource
    import time

    path = item.config.getoption("--cost-log")
    if not path:
        yield
        return

    def cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    start, cpu0, wall0 = time.time(), cpu(), time.monotonic()
    yield
    line = json.dumps({"test": item.nodeid, "cpu_s": round(cpu() - cpu0, 3), "wall_s": round(time.monotonic() - wall0, 3),
                       "start": round(start, 3), "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")})
    with open(path, "a", encoding="utf-8") as log:  # one short append per line: the workers' lines do not interleave
        log.write(line + "\n")
