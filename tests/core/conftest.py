"""Fixtures for proxy tests: a scripted SGLang-compatible policy, a scripted judge, and the proxy.

All servers are real HTTP servers on loopback ports, started and stopped by the fixtures.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

GOLDEN = Path(__file__).resolve().parents[2].parent / "shared" / "reference"


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def policy_reply(prompt: str) -> str:
    """The scripted policy: a tool call when asked to list files, thinking when asked to think."""
    last_user = prompt.rsplit("<|im_start|>user\n", 1)[-1]
    if "list the files" in last_user:
        return '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
    if "think first" in last_user:
        return "<think>\nLet me think. ðŁ caf\u00e9\n</think>\n\nThe answer is 42."
    if "tool_response" in last_user:
        return "The folder has 3 files."
    return "Sure \u2014 here is a reply with caf\u00e9 and an emoji \U0001f642 ok."


def judge_reply(prompt: str) -> str:
    """The scripted judge: +1 on thanks or a tool result, -1 on 'wrong' (with a hint for hint votes), else 0."""
    state = prompt.split("## Next state", 1)[-1]
    state = state.split("\n\nClassify")[0].split("\n\nGive your decision")[0].lower()
    hint_vote = "[HINT_START] and [HINT_END]" in prompt
    if "[role: tool]" in state or "thanks" in state:
        return "\\boxed{-1}" if hint_vote else "<think>maybe \\boxed{-1}?</think>The user is happy. \\boxed{1}"
    if "wrong" in state:
        if hint_vote:
            return "\\boxed{1} [HINT_START]Answer in French, the user asked for French.[HINT_END]"
        return "Correction requested. \\boxed{-1}"
    return "Unclear. \\boxed{0}"


@contextmanager
def scripted_server(tokenizer: Any, reply: Callable[[str], str], **model_kw: Any) -> Iterator[Any]:
    from openclaw_rl.engine.scripted import ScriptedModel
    from openclaw_rl.engine.server import make_engine_app
    from openclaw_rl.servers import BackgroundServer

    def responder(prompt_ids: list[int]) -> str:
        return reply(tokenizer.decode(prompt_ids, skip_special_tokens=False))

    model_kw.setdefault("context_length", 65536)  # OpenClaw's prompts are ~25K tiny-tokenizer tokens
    model = ScriptedModel(tokenizer, responder=responder, **model_kw)
    app = make_engine_app(model, tokenizer, served_model_name="tiny", model_path="tiny")
    with BackgroundServer(app) as server:
        server.model = model
        yield server


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
                                  "judge_max_new_tokens": 64, **values}, env={})
        proxy = Proxy.build(settings, tokenizer=tokenizer, gate_open=gate_open)
        server = BackgroundServer(proxy.app).start()
        started.append((proxy, server))
        return proxy, server.url

    yield start
    for _proxy, server in started:
        server.stop()


def wait_for_samples(proxy: Any, n: int, timeout: float = 20.0) -> list[Any]:
    proxy.writer.flush()
    count = proxy.spool.wait_ready(n, timeout)
    assert count >= n, f"only {count} of {n} samples arrived"
    proxy.writer.flush()
    return list(proxy.spool.iter_samples())


def load_conversation(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (GOLDEN / "openclaw-golden" / name).read_text().splitlines() if line]
