"""Mode ``oel``: turns held until the session ends, one experience extraction per session, the
experience-augmented teacher, the per-user experience store, and the rule judge's extraction answer.

The tracker-level tests use a stub judge/teacher and renderer (no model); the proxy test at the end
runs the real proxy against scripted servers.
"""

from __future__ import annotations

import asyncio
import json
from array import array
from pathlib import Path

import pytest

from openclaw_oel.experience import (
    EXPERIENCE_HEADER,
    cap_rules,
    experience_messages,
    extraction_prompt,
    fit_conversation,
    merge_rules,
    parse_rules,
)
from openclaw_oel.scorer import OELScorer
from openclaw_oel.store import ExperienceStore
from openclaw_rl.config import Settings
from openclaw_rl.judge import TeacherScores
from openclaw_rl.metrics import ProxyMetrics
from openclaw_rl.scoring import Outcome
from openclaw_rl.sessions import SessionTracker
from openclaw_rl.turns import Generation, Turn

RULE = "Answer formally and politely."


class StubTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(range(len(text.split())))


class StubRenderer:
    """Renders messages to ids; remembers each prompt it rendered (what the teacher saw)."""

    def __init__(self) -> None:
        self.tokenizer, self.seen = StubTokenizer(), []

    def render(self, messages, tools=None):
        text = json.dumps(messages)
        self.seen.append(text)
        return text, [1, 2, 3]


class StubJudge:
    """Extraction answers ``reply`` (None: the call failed); the teacher scores -0.25 per token, top-K rows."""

    enabled = True
    max_new_tokens = 16

    def __init__(self, reply: str | None = f"[EXPERIENCE_START]\n- {RULE}\n[EXPERIENCE_END] \\boxed{{1}}",
                 context_length: int | None = None):
        self.reply, self.prompts, self.gate = reply, [], None
        self.context_length = context_length  # None: unknown, the conversation goes in whole
        self.tokenizer = StubTokenizer() if context_length else None

    async def learn_context(self) -> None:
        pass

    def render(self, system: str, user: str) -> str:
        return system + "\n" + user

    async def _votes(self, system: str, user: str) -> list[str | None]:
        self.prompts.append(user)
        if self.gate is not None:
            await self.gate.wait()
        return [self.reply]

    async def teacher_log_probs(self, prompt_ids, response_ids, top_k=0) -> TeacherScores:
        s = TeacherScores([-0.25] * len(response_ids))
        s.topk_log_probs = [[-0.25 - 0.1 * k for k in range(top_k)] for _ in response_ids]
        s.topk_indices = [list(range(top_k)) for _ in response_ids]
        return s


def make(judge: StubJudge | None = None, store: ExperienceStore | None = None, **oel):
    settings = Settings()
    settings.mode = "oel"
    settings.oel.topk = 4
    for k, v in oel.items():
        setattr(settings.oel, k, v)
    judge = judge or StubJudge()
    renderer = StubRenderer()
    scorer = OELScorer(settings, judge, renderer, store=store or ExperienceStore(":memory:"))
    emitted: list[tuple[Turn, Outcome]] = []
    persisted: list[int] = []
    metrics = ProxyMetrics()
    tracker = SessionTracker(scorer, lambda t, o: emitted.append((t, o)), metrics, ttl_s=60,
                             persist=lambda t: persisted.append(t.index))
    return tracker, emitted, scorer, judge, renderer, persisted, metrics


def turn(text: str, key: str = "ns\x1fs", history: list | None = None) -> Turn:
    messages = [*(history or []), {"role": "user", "content": text}]
    return Turn(session_key=key, session_id=key.split("\x1f")[-1], index=0,
                prompt_ids=array("i", [1, 2, hash(text) % 1000 + 3]), messages=messages, tools=None,
                sampling_temperature=1.0)


def gen(n: int = 3) -> Generation:
    return Generation.from_lists(list(range(10, 10 + n)), [-0.5] * n, "Hi there", "stop")


async def settle() -> None:
    me = asyncio.current_task()
    while pending := [t for t in asyncio.all_tasks() if t is not me and not t.done()]:
        _, late = await asyncio.wait(pending, timeout=30)
        assert not late


def dropped(metrics: ProxyMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("openclaw_turns_dropped_total", {"reason": reason})
    return value or 0.0


def test_turns_are_held_until_the_session_ends_then_all_distilled():
    async def run():
        tracker, emitted, scorer, judge, renderer, persisted, _ = make()
        t1 = tracker.begin(turn("hello"), None)
        tracker.complete(t1, gen())
        t2 = tracker.begin(turn("No, please answer formally and politely. Hello?"),
                           {"role": "user", "content": "No, please answer formally and politely. Hello?"})
        tracker.complete(t2, gen(4))
        await settle()
        # turn 1 has its next state, yet nothing is judged before the session ends; both are persisted
        assert (emitted, judge.prompts, tracker.judging) == ([], [], 0)
        assert persisted == [1, 1, 2] and tracker.pending_turns == 2  # turn 1 again with its next state
        tracker.end_session("ns\x1fs")
        await settle()
        assert scorer.extractions == 1 and len(judge.prompts) == 1  # one extraction for the whole session
        assert "formally and politely" in judge.prompts[0]
        assert [(t.index, o.samples[0].kind) for t, o in emitted] == [(1, "oel"), (2, "oel")]
        for _, o in emitted:
            s = o.samples[0]
            assert s.teacher_log_probs == [-0.25] * s.response_length
            assert len(s.teacher_topk_log_probs) == s.response_length and len(s.teacher_topk_log_probs[0]) == 4
            assert s.metadata["experience"] == f"- {RULE}"
        # the teacher saw the experience in the user's message; the student's prompt ids are untouched
        assert all(RULE in seen and EXPERIENCE_HEADER.strip()[:20] in seen for seen in renderer.seen)
        assert emitted[0][0].prompt_ids.tolist()[:2] == [1, 2]
        assert scorer._pending == {}
    asyncio.run(run())


def test_a_long_conversation_is_cut_from_its_oldest_messages_to_fit_the_judges_context():
    def fits_words(limit):
        return lambda msgs: len(extraction_prompt(msgs).split()) <= limit

    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "word " * 20}
            for i in range(10)]
    assert fit_conversation(msgs, fits_words(10_000)) == (msgs, 0)
    kept, dropped = fit_conversation(msgs, fits_words(80))
    assert kept == msgs[dropped:] and 0 < dropped < 10 and len(extraction_prompt(kept).split()) <= 80
    assert len(extraction_prompt(msgs[dropped - 1:]).split()) > 80  # as many recent ones as fit
    # even the last message alone is too long: the head of its text goes, its end stays
    kept, dropped = fit_conversation(msgs, fits_words(40))
    assert dropped == 9 and kept[0]["content"].startswith("…") and msgs[9]["content"].endswith(kept[0]["content"][1:])

    async def run():  # through the scorer: the judge's context (in its tokens) bounds the extraction prompt
        judge = StubJudge(context_length=220)
        tracker, emitted, scorer, *_ = make(judge)
        history = [{"role": "user", "content": "first question " + "filler " * 150},
                   {"role": "assistant", "content": "first answer"}]
        t1 = tracker.begin(turn("No, please answer formally and politely.", history=history), None)
        tracker.complete(t1, gen())
        tracker.end_session("ns\x1fs")
        await settle()
        assert scorer.trimmed_extractions == 1 and len(emitted) == 1
        prompt = judge.prompts[0]
        assert "formally and politely" in prompt and "first question" not in prompt
        assert len(judge.render("", prompt).split()) <= 220 - judge.max_new_tokens

    asyncio.run(run())


def test_idle_ttl_flushes_a_held_session():
    async def run():
        tracker, emitted, scorer, *_ = make()
        t1 = tracker.begin(turn("hello"), None)
        tracker.complete(t1, gen())
        await settle()
        assert tracker.sweep(now=10**12) == 1
        await settle()
        assert [o.samples[0].kind for _, o in emitted] == ["oel"]
    asyncio.run(run())


@pytest.mark.parametrize(("reply", "reason"), [(None, "judge_failed"), ("nothing to learn \\boxed{0}", "no_hint")])
def test_every_drop_is_counted_with_its_reason(reply, reason):
    async def run():
        tracker, emitted, _, _, _, _, metrics = make(StubJudge(reply))
        for text in ("hello", "thanks"):
            t = tracker.begin(turn(text), {"role": "user", "content": text})
            tracker.complete(t, gen())
        tracker.end_session("ns\x1fs")
        await settle()
        assert [o.drop.value for _, o in emitted] == [reason, reason]
        assert dropped(metrics, reason) == 2.0
    asyncio.run(run())


def test_a_teacher_failure_drops_the_turn_as_teacher_failed():
    from openclaw_rl.errors import BackendUnavailable

    class Failing(StubJudge):
        async def teacher_log_probs(self, *a, **k):
            raise BackendUnavailable("teacher down")

    async def run():
        tracker, emitted, _, _, _, _, metrics = make(Failing())
        t = tracker.begin(turn("hello"), None)
        tracker.complete(t, gen())
        tracker.end_session("ns\x1fs")
        await settle()
        assert emitted[0][1].drop.value == "teacher_failed" and dropped(metrics, "teacher_failed") == 1.0
    asyncio.run(run())


def test_restored_waiting_turns_are_held_again_and_distilled_at_session_end():
    """A restart restores the persisted turns (``restore``): they wait for the session's end again."""
    async def run():
        tracker, emitted, scorer, judge, *_ = make()
        t1, t2 = turn("hello"), turn("No, answer formally and politely.")
        for i, t in enumerate((t1, t2), start=1):
            t.index, t.epoch, t.generation = i, "e1", gen()
        t1.next_state = {"role": "user", "content": "No, answer formally and politely."}
        assert tracker.restore([t1, t2]) == 2
        await settle()
        assert emitted == [] and judge.prompts == []
        tracker.end_session("ns\x1fs")
        await settle()
        assert [o.samples[0].kind for _, o in emitted] == ["oel", "oel"] and scorer.extractions == 1
    asyncio.run(run())


def test_accumulate_merges_the_users_stored_experience_and_single_session_does_not(tmp_path: Path):
    async def run(accumulate: bool) -> list[str]:
        store = ExperienceStore(tmp_path / f"{accumulate}.sqlite")
        store.put("ns", ["Use metric units."])
        tracker, emitted, _, judge, *_ = make(store=store, accumulate=accumulate)
        t = tracker.begin(turn("hello"), None)
        tracker.complete(t, gen())
        tracker.end_session("ns\x1fs")
        await settle()
        assert ("Use metric units." in judge.prompts[0]) is accumulate
        return store.get("ns").rules
    assert asyncio.run(run(True)) == ["Use metric units.", RULE]
    assert asyncio.run(run(False)) == [RULE]


def test_one_users_experience_never_reaches_another_users_session():
    """Per API key namespace: with accumulation on, user a's stored rules go into a's next extraction,
    never into b's, and b's teacher does not see them."""
    async def run():
        tracker, emitted, scorer, judge, renderer, *_ = make(accumulate=True)
        for key in ("a\x1fs1", "b\x1fs1", "a\x1fs2"):
            if key.startswith("b"):
                judge.reply = "nothing to learn \\boxed{0}"
            else:
                judge.reply = StubJudge().reply
            t = tracker.begin(turn("hello", key=key), None)
            tracker.complete(t, gen())
            tracker.end_session(key)
            await settle()
        assert [RULE in p for p in judge.prompts] == [False, False, True]
        assert [(t.session_key[0], o.drop.value if o.drop else "oel") for t, o in emitted] == \
            [("a", "oel"), ("b", "no_hint"), ("a", "oel")]
        assert scorer.store.get("a").rules == [RULE] and scorer.store.get("b") is None
    asyncio.run(run())


# --- experience text ----------------------------------------------------------------------------------


def test_rules_are_parsed_deduplicated_and_capped_whole():
    raw = "x [EXPERIENCE_START]\n- Be brief.\n* be  brief\n- Use French.\n[EXPERIENCE_END] \\boxed{1}"
    assert merge_rules(parse_rules(raw)) == ["Be brief.", "Use French."]
    assert parse_rules("no block \\boxed{0}") == []
    words = lambda s: len(s.split())  # noqa: E731
    assert cap_rules(["a b", "c d", "e f"], words, 4) == (["a b"], 2)  # "- a b\n- c d" is 6 words
    msgs = experience_messages([{"role": "user", "content": "q"}], "- Be brief.")
    assert len(msgs) == 1 and msgs[0]["content"].startswith("q") and msgs[0]["content"].endswith("- Be brief.")
    prompt = extraction_prompt([{"role": "system", "content": "SYS"}, {"role": "user", "content": "q"}])
    assert "SYS" not in prompt and "### user\nq" in prompt


# --- the store ------------------------------------------------------------------------------------------


def test_store_persists_deletes_and_keeps_keys_apart(tmp_path: Path):
    path = tmp_path / "experience.sqlite"
    store = ExperienceStore(path)
    store.put("alice", ["Be brief."])
    store.put("alice", ["Be brief.", "Use French."])
    store.put("bob", ["Use tables."])
    store.close()
    again = ExperienceStore(path)  # a reopened store (a restarted proxy) has the same entries
    alice = again.get("alice")
    assert (alice.rules, alice.sessions) == (["Be brief.", "Use French."], 2)
    assert again.get("bob").rules == ["Use tables."]
    assert again.delete("alice") and not again.delete("alice")
    assert again.get("alice") is None and again.get("bob").rules == ["Use tables."]
    assert [e.key for e in again.entries()] == ["bob"]


def test_experience_command_lists_shows_and_deletes(tmp_path: Path, capsys):
    from openclaw_rl.cli import main

    store = ExperienceStore(tmp_path / "experience.sqlite")
    store.put("k1", ["Be brief."])
    store.put("k2", ["Use French."])
    store.close()
    assert main(["experience", "--spool-dir", str(tmp_path), "--list"]) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == ["k1", "k2"]
    assert main(["experience", "--spool-dir", str(tmp_path), "--show", "k2"]) == 0
    assert capsys.readouterr().out == "- Use French.\n"
    assert main(["experience", "--spool-dir", str(tmp_path), "--delete", "k1"]) == 0
    capsys.readouterr()
    assert main(["experience", "--spool-dir", str(tmp_path), "--show", "k1"]) == 2  # gone: a clear error
    assert main(["experience", "--spool-dir", str(tmp_path / "none")]) == 2


# --- the rule judge -------------------------------------------------------------------------------------


def test_rule_judge_answers_the_extraction_prompt_from_the_users_corrections():
    from openclaw_rl.embedded.rule_judge import judge_reply

    convo = [{"role": "user", "content": "How do I reset my password?"},
             {"role": "assistant", "content": "yo just click reset lol"},
             {"role": "user", "content": "No, please answer formally and politely. How do I reset it?"},
             {"role": "assistant", "content": "Certainly."},
             {"role": "user", "content": "Thanks!"}]
    full, short = judge_reply("system\n" + extraction_prompt(convo))
    assert parse_rules(full) == [RULE] and "\\boxed{1}" in short and parse_rules(short) == [RULE]
    full, _ = judge_reply(extraction_prompt(convo[:2] + convo[4:]))
    assert parse_rules(full) == [] and "\\boxed{0}" in full


# --- through the proxy ----------------------------------------------------------------------------------

PROXY_RULE = "Answer in French."


def _oel_judge_reply(prompt: str) -> str:
    """Extraction: the rule when the conversation has a "wrong"; anything else: the shared scripted judge."""
    from support import judge_reply

    if "[EXPERIENCE_START]" in prompt:
        if "wrong" in prompt.split("## Conversation", 1)[-1]:
            return f"Learned. [EXPERIENCE_START]\n- {PROXY_RULE}\n- {PROXY_RULE.lower()}\n[EXPERIENCE_END] \\boxed{{1}}"
        return "Nothing. \\boxed{0}"
    return judge_reply(prompt)


@pytest.fixture
def oel_judge(tokenizer):
    """Teacher log-probs that prove what the teacher saw: token t scores -(t % 7 + 1)/10 with the rule in
    its prompt, -5.0 without."""
    from support import scripted_server

    def score(prefix, token: int) -> float:
        seen = PROXY_RULE in tokenizer.decode(list(prefix), skip_special_tokens=False)
        return -((token % 7) + 1) / 10 if seen else -5.0

    calls: list[str] = []

    def reply(prompt: str) -> str:
        calls.append(prompt)
        return _oel_judge_reply(prompt)

    with scripted_server(tokenizer, reply, scorer=score) as server:
        server.calls = calls
        yield server


def test_oel_through_the_proxy_holds_extracts_once_and_distils_every_turn(policy_server, oel_judge, make_proxy):
    import httpx
    from support import on_loop, settle, wait_for_samples

    proxy, url = make_proxy(policy_server.url, oel_judge.url, mode="oel", judge_votes=1, oel_topk=3)
    convo: list[dict] = []
    for i, text in enumerate(["hello", "that is wrong", "thanks"]):
        convo.append({"role": "user", "content": text})
        headers = {"X-Session-Id": "o", **({"X-Session-Done": "1"} if i == 2 else {})}
        if i == 2:  # before the session ends: both earlier turns wait, none is judged, nothing is spooled
            proxy.writer.flush()
            assert on_loop(proxy, lambda: (proxy.tracker.pending_turns, proxy.tracker.judging)) == (2, 0)
            assert proxy.spool.depth() == 0 and oel_judge.calls == []
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": convo}, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        convo.append(r.json()["choices"][0]["message"])
    samples = sorted(wait_for_samples(proxy, 3), key=lambda s: s.turn)
    settle(proxy)
    assert [(s.kind, s.turn) for s in samples] == [("oel", 1), ("oel", 2), ("oel", 3)]
    for s in samples:  # the teacher saw the rule and scored the turn's own response ids, in order
        assert s.teacher_log_probs == [-((t % 7) + 1) / 10 for t in s.response_ids]
        assert len(s.teacher_topk_indices) == s.response_length and len(s.teacher_topk_log_probs[0]) == 3
        assert s.metadata["experience"] == f"- {PROXY_RULE}"  # the repeated rule deduplicated
    assert proxy.tracker.scorer.extractions == 1
    assert proxy.tracker.scorer.store.get("default").rules == [PROXY_RULE]


def test_oel_with_the_trainer_teacher_stores_the_experience_prompt_ids_and_calls_no_teacher(
        policy_server, oel_judge, make_proxy, tokenizer, monkeypatch):
    """openclaw_opd_teacher_source: trainer: the sample carries the exact ids of the experience-augmented prompt
    (the trainer's frozen teacher scores them); the judge extracts but is never asked for log-probs."""
    import httpx
    from support import settle, wait_for_samples

    from openclaw_oel.experience import experience_messages
    from openclaw_rl.chat import ChatRenderer
    from openclaw_rl.judge import JudgeClient

    asked: list[int] = []

    async def no_teacher_call(self, prompt_ids, *args, **kwargs):
        asked.append(len(prompt_ids))
        raise AssertionError("teacher_source trainer must not ask a server for teacher log-probs")
    monkeypatch.setattr(JudgeClient, "teacher_log_probs", no_teacher_call)
    proxy, url = make_proxy(policy_server.url, oel_judge.url, mode="oel", judge_votes=1, oel_topk=3,
                            opd_teacher_source="trainer")
    convo: list[dict] = []
    for i, text in enumerate(["hello", "that is wrong"]):
        convo.append({"role": "user", "content": text})
        headers = {"X-Session-Id": "t", **({"X-Session-Done": "1"} if i == 1 else {})}
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": convo}, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        convo.append(r.json()["choices"][0]["message"])
    first = sorted(wait_for_samples(proxy, 2), key=lambda s: s.turn)[0]
    settle(proxy)
    assert first.teacher_source == "trainer" and first.teacher_log_probs is None and first.teacher_topk_indices is None
    _, want = ChatRenderer(tokenizer).render(experience_messages(convo[:1], f"- {PROXY_RULE}"))
    assert first.teacher_prompt_ids == list(want) and first.loss_mask == [1] * first.response_length
    assert PROXY_RULE in tokenizer.decode(first.teacher_prompt_ids) and PROXY_RULE not in tokenizer.decode(first.prompt_ids)
    assert asked == [] and any("[EXPERIENCE_START]" in c for c in oel_judge.calls)  # extraction only
    assert proxy.tracker.scorer.extractions == 1


def test_held_turns_survive_a_restart_and_are_distilled_when_the_session_ends(policy_server, oel_judge, make_proxy,
                                                                            tmp_path):
    """Turns held for the session's end are waiting turns in the spool: a proxy stopped mid-session and
    started again on the same spool holds them again, and the session's end distils all of them."""
    import httpx
    from support import wait_for_samples

    spool = str(tmp_path / "shared-spool")
    convo: list[dict] = []

    def say(url: str, text: str, done: bool = False) -> None:
        convo.append({"role": "user", "content": text})
        headers = {"X-Session-Id": "r", **({"X-Session-Done": "1"} if done else {})}
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": convo}, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        convo.append(r.json()["choices"][0]["message"])

    proxy, url = make_proxy(policy_server.url, oel_judge.url, mode="oel", judge_votes=1, oel_topk=2, spool_dir=spool)
    say(url, "hello")
    say(url, "that is wrong")
    proxy.writer.flush()
    waiting = [json.loads(t) for t in proxy.spool.pending_turns()]
    assert [(t["index"], bool(t.get("next_state"))) for t in waiting] == [(1, True), (2, False)]
    proxy.server.stop()
    assert proxy.spool.depth() == 0 and oel_judge.calls == []
    restarted, url = make_proxy(policy_server.url, oel_judge.url, mode="oel", judge_votes=1, oel_topk=2,
                                spool_dir=spool)
    say(url, "thanks", done=True)
    samples = sorted(wait_for_samples(restarted, 3), key=lambda s: s.turn)
    assert [(s.session_id, s.turn, s.kind) for s in samples] == [("r", 1, "oel"), ("r", 2, "oel"), ("r", 3, "oel")]
    assert all(s.teacher_log_probs == [-((t % 7) + 1) / 10 for t in s.response_ids] for s in samples)
    assert restarted.tracker.scorer.extractions == 1
    assert restarted.tracker.scorer.store.get("default").rules == [PROXY_RULE]
