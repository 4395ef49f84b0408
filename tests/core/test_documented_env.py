"""Every environment variable the proxy documents (config.ENV_FALLBACKS, README, docs) changes a setting.

The launch scripts' own variables are checked by dry runs in tests/slime_plugins/test_launch_scripts.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from openclaw_rl.config import ENV_FALLBACKS, JudgeSettings, Settings, load_settings
from openclaw_rl.judge import JudgeClient
from openclaw_rl.launch import SCRIPT_ENV

REPO = Path(__file__).resolve().parents[2]


def _value(key: str) -> tuple[str, Any]:
    """An environment string for ``key`` that differs from its default, and the parsed value expected."""
    section, _, name = key.partition("_")
    default = getattr(getattr(Settings(), section), name)
    if key == "proxy_host":
        return "127.0.0.2", "127.0.0.2"
    if key == "proxy_tool_parser":  # a name the parsers know (others are refused)
        return "hermes", "hermes"
    if key == "opd_hint_selection":  # a rule the selection knows (others are refused)
        return "token_optimal", "token_optimal"
    if key == "opd_teacher_url":  # a URL (others are refused)
        return "http://teacher:30020", "http://teacher:30020"
    if key == "combine_loss":  # a loss combine knows (others are refused)
        return "topk_select", "topk_select"
    if key == "opd_distill_subset":  # a subset the top-K loss knows (others are refused)
        return "overlap", "overlap"
    if key == "opd_teacher_source":  # upstream's value for the in-trainer teacher (others are refused)
        return "megatron", "trainer"
    if isinstance(default, bool):
        return ("0", False) if default else ("yes", True)
    if isinstance(default, list):
        return "k1,k2", ["k1", "k2"]
    if isinstance(default, int):
        return str(default + 7), default + 7
    if isinstance(default, float):
        return str(default + 0.25), default + 0.25
    return "x-test", "x-test"


def _get(settings: Settings, key: str) -> Any:
    section, _, name = key.partition("_")
    return getattr(getattr(settings, section), name)


@pytest.mark.parametrize(("var", "key"), sorted(ENV_FALLBACKS.items()))
def test_each_proxy_environment_variable_changes_its_setting(var: str, key: str) -> None:
    raw, expected = _value(key)
    assert _get(load_settings(env={}), key) != expected
    assert _get(load_settings(env={var: raw}), key) == expected


def test_record_variables_set_the_record_dir(tmp_path: Path) -> None:
    env = {"OPENCLAW_RECORD_ENABLED": "1", "OPENCLAW_RECORD_FILE": str(tmp_path / "rec" / "a.jsonl")}
    assert load_settings(env=env).proxy.record_dir == str(tmp_path / "rec")
    assert load_settings(env={**env, "OPENCLAW_RECORD_ENABLED": "0"}).proxy.record_dir == ""


def test_every_upstream_variable_the_docs_name_is_mapped() -> None:
    """README's list of upstream variables and docs/differences.md name only variables that are mapped."""
    text = (REPO / "README.md").read_text()
    listed = text[text.index("environment variables (`HOST`"):].split("\n\n")[0]
    names = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", listed)) - {"OPENCLAW_RECORD_ENABLED", "OPENCLAW_RECORD_FILE"}
    assert names and names <= set(ENV_FALLBACKS), sorted(names - set(ENV_FALLBACKS))


def test_no_dead_settings_key() -> None:
    """Each key an environment variable sets is read somewhere in the package (not only declared)."""
    sources = "\n".join(p.read_text() for pkg in ("openclaw_rl", "openclaw_opd", "openclaw_combine")
                         for p in (REPO / pkg).rglob("*.py"))  # declarations have no dot: `name: type = ...`
    for key in set(ENV_FALLBACKS.values()) | set(SCRIPT_ENV.values()):
        name = key.partition("_")[2]
        assert re.search(rf"\.{name}\b", sources), f"{key} is set from the environment but never read"


def _teacher_reply(request: httpx.Request) -> dict[str, Any]:
    import json

    ids = json.loads(request.content)["input_ids"]
    start = json.loads(request.content)["logprob_start_len"]
    return {"meta_info": {"input_token_logprobs": [[None, ids[start], None]] +
                          [[-0.5, t, None] for t in ids[start + 1:]]}}


@pytest.mark.parametrize(("limit", "expected_peak"), [(1, 1), (2, 2), (0, 4)])
def test_teacher_concurrency_bounds_teacher_calls_in_flight(limit: int, expected_peak: int) -> None:
    """OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY → opd.teacher_concurrency → teacher calls in flight."""
    state = {"now": 0, "peak": 0}

    async def main() -> None:
        release = asyncio.Event()
        arrived = asyncio.Condition()

        async def handler(request: httpx.Request) -> httpx.Response:
            async with arrived:
                state["now"] += 1
                state["peak"] = max(state["peak"], state["now"])
                arrived.notify_all()
            await release.wait()
            state["now"] -= 1
            return httpx.Response(200, json=_teacher_reply(request))

        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            judge = JudgeClient(http, dataclasses.replace(JudgeSettings(), url="http://judge"),
                                teacher_concurrency=limit)
            calls = [asyncio.create_task(judge.teacher_log_probs([1, 2], [3, 4])) for _ in range(4)]
            async with arrived:  # every call that may be in flight has arrived
                await arrived.wait_for(lambda: state["now"] >= expected_peak)
            for _ in range(10):  # let any call the limit should hold back try to get through
                await asyncio.sleep(0)
            release.set()
            results = await asyncio.gather(*calls)
        assert all(r.log_probs == [-0.5, -0.5] for r in results)

    asyncio.run(main())
    assert state["peak"] == expected_peak
    settings = load_settings(env={"OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY": str(limit or 5)})
    assert settings.opd.teacher_concurrency == (limit or 5)
