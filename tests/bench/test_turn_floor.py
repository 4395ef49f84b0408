"""The floor proxy of ``scripts/bench_turn_cpu.py`` (``openclaw_rl/bench/turn_floor.py``) does the work it claims.

A two-turn session through it and the bench's policy and judge mocks (in-process, on loopback): both answers
are the mock's reply in OpenAI's shape, the prompt it sent is exactly the chat template's tokens, and the
spool holds the first turn's sample (judged with the second request as its next state: 3 votes of +1)
with its exact ids and log-probs, while the second turn, the session's last, is dropped (no next state).
"""

from __future__ import annotations

import asyncio
import sqlite3
from array import array
from pathlib import Path
from typing import Any

import orjson

from openclaw_rl.bench import mock
from openclaw_rl.bench.loadclient import LoadClient
from openclaw_rl.bench.turn_floor import Floor, serve
from openclaw_rl.servers import BackgroundServer


def test_floor_answers_a_two_turn_session_and_commits_the_turn_and_its_sample(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(mock.ensure_tokenizer()))
    seen: list[list[int]] = []
    committed: list[tuple[str, int, bytes]] = []
    policy_app = mock.build_mock_app(tokenizer, reply_tokens=16)
    judge_app = mock.build_mock_app(tokenizer, judge=True)
    first, second = [{"role": "system", "content": mock.SYSTEM}, {"role": "user", "content": "Read a.txt"}], None
    with BackgroundServer(policy_app) as policy, BackgroundServer(judge_app) as judge:
        core = policy_app.state.model
        responder = core.responder
        core.responder = lambda ids: seen.append(list(ids)) or responder(ids)
        floor = Floor(tokenizer, policy.url, judge.url, str(tmp_path / "floor.sqlite"), parts=True)

        async def session() -> list[dict[str, Any]]:
            ready: asyncio.Future = asyncio.get_running_loop().create_future()
            server = asyncio.create_task(serve(floor, 0, started=lambda s: ready.set_result(s)))
            port = (await ready).sockets[0].getsockname()[1]
            out = []
            async with LoadClient(30.0) as load:
                for messages, done in ((first, False), (second, True)):
                    case = mock.Case(messages, [], mock.TOOLS[:2])
                    headers = {**mock.JSON_HEADERS, "X-Session-Id": "s1", **({"X-Session-Done": "1"} if done else {})}
                    out.append(orjson.loads(await load.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                                            mock.chat_body(case, 16, False), headers)))
                    if not done:  # answered: its turn is committed (read by another connection), not yet judged
                        with sqlite3.connect(tmp_path / "floor.sqlite") as other:
                            committed.extend(other.execute("SELECT session, turn, prompt_ids FROM turns").fetchall())
            await asyncio.gather(*floor.tasks)  # the first turn's judgement
            floor.spool._commit()  # what is queued still (the last turn's drop)
            server.cancel()
            return out

        second = [*first, {"role": "assistant", "content": mock.reply_text(16)}, {"role": "user", "content": "Thanks."}]
        answers = asyncio.run(session())
    reply = mock.reply_text(16)
    assert [a["choices"][0]["message"]["content"] for a in answers] == [reply, reply]
    assert [a["object"] for a in answers] == ["chat.completion"] * 2
    expected = [tokenizer.encode(tokenizer.apply_chat_template(m, tools=mock.TOOLS[:2], tokenize=False,
                                                               add_generation_prompt=True), add_special_tokens=False)
                for m in (first, second)]
    assert seen == expected, "the floor sent other prompt ids than the chat template's"
    assert [(c[0], c[1], array("i", c[2]).tolist()) for c in committed] == [("s1", 1, expected[0])]
    db = sqlite3.connect(tmp_path / "floor.sqlite")
    rows = db.execute("SELECT session, turn, prompt_ids, response_ids, logprobs, score, votes FROM samples").fetchall()
    assert len(rows) == 1
    session_id, turn, prompt_ids, response_ids, logprobs, score, votes = rows[0]
    assert (session_id, turn, score, orjson.loads(votes)) == ("s1", 1, 1.0, [1, 1, 1])
    assert array("i", prompt_ids).tolist() == expected[0]
    assert tokenizer.decode(array("i", response_ids).tolist(), skip_special_tokens=True) == reply
    assert len(array("d", logprobs)) == len(array("i", response_ids))
    assert db.execute("SELECT COUNT(*) FROM turns").fetchone()[0] == 0  # both pending rows settled
    assert floor.counts == {"turns": 2, "samples": 1, "dropped_no_next_state": 1}
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
