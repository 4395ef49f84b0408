"""Run the held-out suite against one checkpoint (or a served model) through the proxy.

Stage: **evaluation** → proxy → engine. A target is either a URL (a running proxy, e.g. ``serve`` in
front of an SGLang server, or any OpenAI-compatible endpoint) or a Hugging Face checkpoint directory
(the tiny model, a ``step-NNNNNN`` checkpoint of ``local``/``train``, or a directory of them: its newest).
A checkpoint is served here as ``local`` serves it: the CPU engine behind a proxy of this project,
without a judge and with a throwaway spool. Every request is a side turn (``X-Turn-Type: side``), so
even a live training proxy forwards it and trains on none of it.

Each target sees the same conversation openings (person k's conversation c is seeded from the suite),
so the before/after comparison is paired on its first messages.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openclaw_rl.embedded import task

from .people import (
    EDIT_TOOL,
    ModelPlayer,
    Outcome,
    ScriptedPerson,
    VoteJudge,
    edit_passed,
    homework_passed,
    style_row,
)
from .suite import Suite

log = logging.getLogger(__name__)

UNTRAINED = "untrained"


@dataclass(frozen=True, slots=True)
class Target:
    label: str
    location: str
    """A URL, or a checkpoint directory."""

    @property
    def is_url(self) -> bool:
        return self.location.startswith(("http://", "https://"))


def parse_target(spec: str, *, preset: str = "h128", seed: int = 0, openclaw_model: bool = False) -> Target:
    """``LABEL=WHERE`` or ``WHERE``; WHERE is a URL, a checkpoint directory, a directory of ``step-*``
    checkpoints or a run directory with ``checkpoints/`` (their newest), or ``untrained`` (the tiny model;
    with `openclaw_model` its variant pre-trained on OpenClaw-shaped prompts, the one ``local`` serves)."""
    label, sep, where = spec.partition("=")
    if not sep or label.startswith(("http", "/", ".")):
        label, where = "", spec
    where = where.strip()
    if not where:
        raise ValueError(f"--target {spec!r}: nothing after '='")
    if where == UNTRAINED:
        from openclaw_rl.embedded.tiny_model import ensure_tiny_model

        return Target(label or UNTRAINED, str(ensure_tiny_model(preset, seed=seed, openclaw=openclaw_model)))
    if where.startswith(("http://", "https://")):
        return Target(label or where, where)
    return Target(label or Path(where).name, str(resolve_checkpoint(Path(where))))


def resolve_checkpoint(path: Path) -> Path:
    """A model directory as given, else the newest finished checkpoint under it (or its ``checkpoints/``)."""
    from openclaw_rl.embedded.trainer import latest_checkpoint

    if (path / "config.json").is_file():
        return path
    for root in (path, path / "checkpoints"):
        found = latest_checkpoint(root)
        if found is not None:
            return found
    raise FileNotFoundError(f"{path} is neither a checkpoint directory (config.json) nor holds step-* checkpoints")


@contextmanager
def served_checkpoint(path: str, *, seed: int = 0, max_new_tokens: int = 64) -> Iterator[Any]:
    """Serve `path` on loopback (CPU engine + proxy, no judge, a temporary spool); yields the proxy
    (``.url`` is where to send the conversations)."""
    from transformers import AutoTokenizer

    from openclaw_rl.config import load_settings
    from openclaw_rl.embedded.tiny_model import quiet_progress_bars
    from openclaw_rl.engine.app import make_engine_app
    from openclaw_rl.engine.torch_core import TorchModel
    from openclaw_rl.server import Proxy
    from openclaw_rl.servers import BackgroundServer

    tokenizer = AutoTokenizer.from_pretrained(path)
    with quiet_progress_bars():
        model = TorchModel.from_pretrained(path, seed=seed, tokenizer_vocab_size=len(tokenizer))
    servers: list[BackgroundServer] = []
    try:
        with tempfile.TemporaryDirectory(prefix="openclaw-eval-") as tmp:
            try:
                # streamed as `local` streams (OpenClaw streams its requests; --through-openclaw)
                engine = BackgroundServer(make_engine_app(model, tokenizer, served_model_name="eval", model_path=path,
                                                         incremental_streaming_output=True)).start()
                servers.append(engine)
                settings = load_settings({"proxy_tokenizer": path, "proxy_policy_url": engine.url, "mode": "rl",
                                          "spool_dir": f"{tmp}/spool", "proxy_max_new_tokens": max_new_tokens,
                                          "proxy_served_model_name": "eval"}, env={})
                with _without_judge_warning():  # no judge on purpose: nothing of an evaluation is trained
                    proxy = Proxy.build(settings, tokenizer=tokenizer)
                servers.append(BackgroundServer(proxy.app).start())
                proxy.url = servers[-1].url
                yield proxy
            finally:  # the proxy closes its spool before the directory goes
                for server in reversed(servers):
                    server.stop()
    finally:
        model.close()


class _NoJudgeNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("no judge URL")


@contextmanager
def _without_judge_warning() -> Iterator[None]:
    server_log = logging.getLogger("openclaw_rl.server")
    note = _NoJudgeNote()
    server_log.addFilter(note)
    try:
        yield
    finally:
        server_log.removeFilter(note)


@dataclass
class EvalOptions:
    conversations: int = 10
    """Per person, and for the homework and the file edits each."""
    turns: int = 3
    """Replies per conversation with a person (homework and edits: one)."""
    concurrency: int = 4
    max_tokens: int = 48
    temperature: float = 1.0
    """The policy's own sampling (``local`` samples rollouts at 1.0): the rate a person meets."""
    timeout_s: float = 300.0
    user_client: Any = None
    """Model-played people: an AsyncOpenAI client for the person's model (None: scripted people)."""
    user_model: str = "default"
    judge: VoteJudge | None = None
    """Style verdicts by a majority of judge votes instead of the opener rule."""


async def evaluate_url(base_url: str, suite: Suite, opts: EvalOptions, *, label: str = "target",
                       api_key: str = "x", on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Every conversation of the suite against the proxy at `base_url`; the scored replies."""
    from openai import AsyncOpenAI

    from openclaw_rl.embedded.simulate import chat_with_retry, proxy_base_url

    client = AsyncOpenAI(base_url=f"{proxy_base_url(base_url)}/v1", api_key=api_key, max_retries=0,
                         timeout=opts.timeout_s)
    slots = asyncio.Semaphore(max(1, opts.concurrency))
    outcomes: list[Outcome] = []

    def record(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    async def ask(sid: str, messages: list[dict[str, Any]], done: bool, **extra: Any) -> Any:
        headers = {"X-Session-Id": sid, "X-Turn-Type": "side", **({"X-Session-Done": "true"} if done else {})}
        completion = await chat_with_retry(client, retry_timeout_s=opts.timeout_s, model="default", messages=messages,
                                           max_tokens=opts.max_tokens, temperature=opts.temperature,
                                           extra_headers=headers, **extra)
        return completion.choices[0].message

    async def person_chat(index: int, c: int) -> None:
        person = suite.people[index]
        player = (ModelPlayer(person, c, opts.user_client, opts.user_model) if opts.user_client is not None
                  else ScriptedPerson(person, c))
        sid = f"eval-{label}-{person.name}-{c}"
        messages: list[dict[str, Any]] = [{"role": "user", "content": player.open()}]
        for turn in range(opts.turns):
            prompt = messages[-1]["content"]
            message = await ask(sid, messages, turn == opts.turns - 1)
            reply = message.content or ""
            instructed = task.instruction_style(prompt) is not None
            detail: dict[str, Any] = {"style": task.detect_style(reply)}
            passed = detail["style"] == person.preference
            if opts.judge is not None:
                passed, detail["votes"] = await opts.judge.passed(person.preference, prompt, reply)
            record(Outcome(style_row(person.preference, turn, instructed), person.name, c, turn, prompt, reply,
                           passed, detail))
            if turn < opts.turns - 1:
                messages += [{"role": "assistant", "content": reply},
                             {"role": "user", "content": await player.react(reply, passed)}]

    async def homework(c: int) -> None:
        item = suite.homework[c % len(suite.homework)]
        message = await ask(f"eval-{label}-homework-{c}", [{"role": "user", "content": item.question}], True)
        reply = message.content or ""
        record(Outcome("homework", item.question, c, 0, item.question, reply, homework_passed(reply, item),
                       {"answer": item.answer}))

    async def file_edit(c: int) -> None:
        item = suite.file_edits[c % len(suite.file_edits)]
        message = await ask(f"eval-{label}-edit-{c}", [{"role": "user", "content": item.request}], True,
                            tools=[EDIT_TOOL])
        passed, detail = edit_passed(message, item)
        record(Outcome("file_edit", item.path, c, 0, item.request, message.content or "", passed, detail))

    async def limited(job: Any) -> None:
        async with slots:
            await job

    jobs = [person_chat(i, c) for i in range(len(suite.people)) for c in range(opts.conversations)]
    if suite.homework:
        jobs += [homework(c) for c in range(opts.conversations)]
    if suite.file_edits:
        jobs += [file_edit(c) for c in range(opts.conversations)]
    try:
        await asyncio.gather(*(limited(job) for job in jobs))
    finally:
        await client.close()
    return outcomes


def evaluate_target(target: Target, suite: Suite, opts: EvalOptions, *, api_key: str = "x", seed: int = 0,
                    on_outcome: Callable[[Outcome], None] | None = None, openclaw: Any = None) -> list[Outcome]:
    """`evaluate_url` on a URL target, or on a checkpoint served here for the duration; with `openclaw`
    (an ``OpenClawInstall``) through stock OpenClaw instead (``through_openclaw.py``)."""

    def run(url: str, key: str) -> list[Outcome]:
        if openclaw is not None:
            from .through_openclaw import evaluate_through_openclaw

            return asyncio.run(evaluate_through_openclaw(url, suite, opts, openclaw, label=target.label,
                                                         api_key=key, on_outcome=on_outcome))
        return asyncio.run(evaluate_url(url, suite, opts, label=target.label, api_key=key, on_outcome=on_outcome))

    if target.is_url:
        return run(target.location, api_key)
    with served_checkpoint(target.location, seed=seed, max_new_tokens=opts.max_tokens) as proxy:
        return run(proxy.url, "x")
