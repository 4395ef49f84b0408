"""``openclaw-rl eval``: the suite is held out, the intervals are right, the scoring rules, and the
evaluation can fail: a target that did not learn the preference scores as such."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from support import metric

from openclaw_rl.embedded import task
from openclaw_rl.evaluation.people import EDIT_TOOL, edit_passed, homework_passed, last_number
from openclaw_rl.evaluation.report import EvalReport, TargetResult
from openclaw_rl.evaluation.runner import EvalOptions, evaluate_url, served_checkpoint
from openclaw_rl.evaluation.stats import verdict, wilson
from openclaw_rl.evaluation.suite import Homework, Suite, load_suite, training_requests
from openclaw_rl.servers import BackgroundServer


def test_default_suite_is_held_out_from_training() -> None:
    suite = load_suite()
    asked = [r.strip().lower() for r in suite.requests()]
    assert suite.people and suite.homework and suite.file_edits
    assert not set(asked) & training_requests()
    # not even a training task (verb + object) under another template
    objects = {r.obj.lower() for r in task.REQUESTS}
    assert not [r for r in asked if any(o in r for o in objects)]
    assert {p.preference for p in suite.people} >= {"formal"}  # the preference the simulated users train


def test_a_suite_with_a_training_request_is_refused(tmp_path: Path) -> None:
    raw = json.loads((Path(load_suite.__code__.co_filename).parent / "suites" / "default.json").read_text())
    raw["people"][0]["requests"].append(task.REQUESTS[5].text)
    path = tmp_path / "leaky.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="not held out"):
        load_suite(str(path))
    raw["people"][0]["requests"].pop()
    raw["people"][0]["preference"] = "rude"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="unknown style"):
        load_suite(str(path))
    with pytest.raises(FileNotFoundError, match="default"):
        load_suite("no-such-suite")


def test_wilson_interval_and_verdict() -> None:
    # reference values (Wilson 1927; e.g. statsmodels proportion_confint(method="wilson"))
    s = wilson(0, 10)
    assert (s.low, round(s.high, 4)) == (0.0, 0.2775)
    s = wilson(5, 10)
    assert (round(s.low, 4), round(s.high, 4)) == (0.2366, 0.7634)
    s = wilson(10, 10)
    assert (round(s.low, 4), s.high) == (0.7225, 1.0)
    assert wilson(0, 0).text() == "n/a"
    with pytest.raises(ValueError):
        wilson(3, 2)
    assert verdict(wilson(2, 20), wilson(19, 20)) == "better"
    assert verdict(wilson(19, 20), wilson(2, 20)) == "worse"
    assert verdict(wilson(4, 20), wilson(7, 20)) == "no clear change"  # 20% vs 35%: cannot tell


class _Call:
    def __init__(self, name: str, arguments: str):
        self.function = type("F", (), {"name": name, "arguments": arguments})()


def test_scoring_rules() -> None:
    item = Homework("What is 6 times 7?", "42")
    assert homework_passed("<think>6*7</think>It is 42.", item) and homework_passed("1,000 no: 42", item)
    assert not homework_passed("42 is wrong, it is 41", item) and not homework_passed("no idea", item)
    assert last_number("a 3.5 b") == "3.5"
    edit = load_suite().file_edits[0]
    good = json.dumps({"path": edit.path, "old_text": edit.old, "new_text": edit.new})
    message = type("M", (), {"tool_calls": [_Call("read_file", "{}"), _Call("edit_file", good)]})()
    assert edit_passed(message, edit)[0]
    wrong = type("M", (), {"tool_calls": [_Call("edit_file", good.replace(edit.new, edit.new + "!"))]})()
    assert not edit_passed(wrong, edit)[0]
    assert not edit_passed(type("M", (), {"tool_calls": None})(), edit)[0]
    assert EDIT_TOOL["function"]["name"] == "edit_file"


class FakeModel:
    """An OpenAI-compatible stand-in for a checkpoint: it follows a stated preference and, uninstructed,
    answers in `style`, or in a random style (a model that did not learn) when `style` is None."""

    def __init__(self, style: str | None, salt: str = ""):
        self.style, self.salt = style, salt
        self.headers: list[dict[str, str]] = []
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.chat)

    async def chat(self, request: Request) -> Any:
        body = await request.json()
        self.headers.append(dict(request.headers))
        rng = random.Random(self.salt + json.dumps(body["messages"]))  # the same reply to the same chat, in any order
        asked = task.instruction_style(body["messages"][-1]["content"])
        style = asked or self.style or rng.choice(task.STYLE_NAMES)
        content = task.answer(style, task.REQUESTS[0], rng)
        return {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


@pytest.fixture
def fakes() -> Iterator[dict[str, tuple[FakeModel, str]]]:
    models = {"untrained": FakeModel(None), "did-not-learn": FakeModel(None, salt="other draws"), "learned": FakeModel("formal")}
    servers = {k: BackgroundServer(m.app).start() for k, m in models.items()}
    try:
        yield {k: (models[k], servers[k].url) for k in models}
    finally:
        for server in servers.values():
            server.stop()


def test_evaluation_can_fail(fakes: dict[str, tuple[FakeModel, str]], tmp_path: Path) -> None:
    """Same held-out conversations for every target; a target that still picks its style at random is not
    called better than the baseline and its formal rate stays low, one that learned is called better."""
    suite = load_suite()
    suite = Suite(suite.name, tuple(p for p in suite.people if p.preference == "formal"), (), ())
    opts = EvalOptions(conversations=8, turns=2, concurrency=4)
    report = EvalReport(suite.name, [])
    for label, (_, url) in fakes.items():
        report.targets.append(TargetResult(label, url, asyncio.run(evaluate_url(url, suite, opts, label=label))))
    scores = {t.label: t.scores() for t in report.targets}
    verdicts = report.verdicts()
    assert verdicts["did-not-learn"]["first:formal"] == "no clear change"
    assert scores["did-not-learn"]["first:formal"].high < 0.8  # not even its interval reaches a learned rate
    assert verdicts["learned"]["first:formal"] == "better" and scores["learned"]["first:formal"].rate == 1.0
    # a reply after thanks is uninstructed too; one after a correction is scored apart (instruction-following)
    assert scores["learned"]["first:formal"].total == scores["learned"]["later:formal"].total == 16
    assert "instructed:formal" not in scores["learned"]
    followed = scores["did-not-learn"]["instructed:formal"]
    assert followed.rate == 1.0 and sum(s.total for s in scores["did-not-learn"].values()) == 32
    # every request is a side turn of its own session: a training proxy forwards it and trains nothing
    model = fakes["learned"][0]
    assert model.headers and all(h["x-turn-type"] == "side" for h in model.headers)
    assert len({h["x-session-id"] for h in model.headers}) == 16
    paths = report.write(tmp_path)
    table = Path(paths["markdown"]).read_text()
    assert "100% [" in table and "**better**" in table
    assert json.loads(Path(paths["json"]).read_text())["targets"][2]["verdict_vs_baseline"]["first:formal"] == "better"
    assert Path(paths["plot"]).read_bytes()[:4] == b"\x89PNG"
    assert len(Path(paths["transcripts"]).read_text().splitlines()) == sum(len(t.outcomes) for t in report.targets)


def test_tiny_model_through_the_proxy(tiny_model_dir: Path) -> None:
    """The real path, kept small: the checkpoint served by the CPU engine behind the proxy, every kind of
    conversation once or twice (the rates of the untrained model are measured in docs/evaluation.md)."""
    suite = load_suite()
    suite = Suite(suite.name, suite.people[:1], suite.homework[:1], suite.file_edits[:1])
    opts = EvalOptions(conversations=1, turns=2, concurrency=4, max_tokens=4)
    with served_checkpoint(str(tiny_model_dir)) as proxy:
        outcomes = asyncio.run(evaluate_url(proxy.url, suite, opts, label="untrained"))
        # every request was forwarded as a side turn: no turn was begun, nothing reached the spool
        assert metric(proxy, "openclaw_turns_total", type="side") == len(outcomes) == 4
        assert metric(proxy, "openclaw_turns_total", type="main") == 0 and proxy.spool.depth() == 0
    scores = TargetResult("untrained", str(tiny_model_dir), outcomes).scores()
    assert sum(s.total for k, s in scores.items() if k.endswith(":formal")) == 2
    assert scores["homework"].total == scores["file_edit"].total == 1
    assert all(o.prompt for o in outcomes) and {o.task for o in outcomes} >= {"first:formal", "homework", "file_edit"}


class PersonAndJudge:
    """One stand-in model that plays the people (its prompt has the persona as system message) and judges
    (yes only for a reply that opens formally), counting what it was asked."""

    def __init__(self) -> None:
        self.persona_calls = self.judge_calls = 0
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.chat)

    async def chat(self, request: Request) -> Any:
        body = await request.json()
        if body["messages"][0]["role"] == "system":
            self.persona_calls += 1
            assert "Answer formally and politely." in body["messages"][0]["content"]  # the hidden preference
            assert body["messages"][-1]["content"].startswith("The AI assistant replied:")
            content = "Thanks! How should I tune a guitar?"
        else:
            self.judge_calls += 1
            reply = body["messages"][0]["content"].split("The assistant replied:\n", 1)[1]
            content = "YES" if reply.startswith("Certainly") else "No."
        return {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def test_model_played_people_and_judge_votes(fakes: dict[str, tuple[FakeModel, str]]) -> None:
    from openai import AsyncOpenAI

    from openclaw_rl.evaluation.people import VoteJudge

    stand_in = PersonAndJudge()
    suite = load_suite()
    suite = Suite(suite.name, suite.people[:1], (), ())
    with BackgroundServer(stand_in.app) as server:
        async def run(url: str) -> Any:
            client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
            opts = EvalOptions(conversations=4, turns=2, user_client=client, judge=VoteJudge(client, "m", votes=3))
            try:
                return await evaluate_url(url, suite, opts)
            finally:
                await client.close()

        learned = asyncio.run(run(fakes["learned"][1]))
        random_ = asyncio.run(run(fakes["did-not-learn"][1]))
    assert stand_in.persona_calls == 8 and stand_in.judge_calls == 3 * 16  # 3 votes a reply
    assert all(o.passed and o.detail["votes"] == ["yes"] * 3 for o in learned)
    assert [o.prompt for o in learned if o.turn == 1] == ["Thanks! How should I tune a guitar?"] * 4
    assert all(o.passed == (o.reply.startswith("Certainly")) for o in random_)
    with pytest.raises(ValueError):
        VoteJudge(None, "m", votes=0)


def test_eval_command(fakes: dict[str, tuple[FakeModel, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from openclaw_rl.cli import main

    base = ["eval", "--conversations", "2", "--turns", "1", "--no-plot", "--out", str(tmp_path)]
    assert main([*base, "--target", f"before={fakes['untrained'][1]}/v1", "--target", fakes["learned"][1]]) == 0
    out = capsys.readouterr().out
    assert "| task | `before` | `http://127.0.0.1:" in out and "written:" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert [t["label"] for t in report["targets"]][0] == "before" and not (tmp_path / "report.png").exists()
    assert report["targets"][1]["scores"]["first:formal"]["rate"] == 1.0
    assert main(["eval", "--out", str(tmp_path)]) == 1  # no target: one line, no traceback
    assert "give at least one --target" in capsys.readouterr().err
    assert main([*base, "--target", f"x={fakes['learned'][1]}", "--target", f"x={fakes['learned'][1]}"]) == 2
    assert "share a label" in capsys.readouterr().err
    assert main([*base, "--target", str(tmp_path / "missing")]) == 2
    assert "neither a checkpoint directory" in capsys.readouterr().err
