"""`openclaw-rl judge`: the rule judge served on its own, for `train` against a CPU SGLang."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import httpx

from openclaw_rl.config import JudgeSettings
from openclaw_rl.embedded import task
from openclaw_rl.judge import JudgeClient
from openclaw_rl.servers import BackgroundServer


def test_the_judge_command_serves_the_rule_judge_to_the_proxys_judge_client(tiny_model_dir: Path,
                                                                             tokenizer: Any) -> None:
    """The app `openclaw-rl judge --model M --teacher` runs, asked by the proxy's own JudgeClient: PRM votes
    by the rules, an OPD hint, and teacher log-probs from M's frozen weights."""
    from openclaw_rl.cli import build_parser
    from openclaw_rl.embedded.judge_command import build_judge_app

    ns = build_parser("judge").parse_args(["judge", "--model", str(tiny_model_dir), "--teacher"])
    assert (ns.port, ns.host, ns.fn.__name__) == (30020, "127.0.0.1", "cmd_judge")
    app = build_judge_app(ns.model, teacher=ns.teacher)

    async def main(url: str) -> None:
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{url}/model_info")).json()["weight_version"] == "default"
            client = JudgeClient(http, JudgeSettings(url=url, votes=3, max_new_tokens=64), tokenizer=tokenizer,
                                 vocab_size=len(tokenizer))
            reply = "Sure, here you go."
            thanks = {"role": "user", "content": "Thanks, perfect! Next: How do I water the garden?"}
            fix = {"role": "user", "content": task.correction("formal", task.REQUESTS[0].text)}
            assert (await client.prm(reply, thanks)).score == 1.0
            assert (await client.prm(reply, fix)).score == -1.0
            assert (await client.hints(reply, fix)).best_hint(10) == "Answer formally and politely."
            prompt = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
            scores = await client.teacher_log_probs(prompt, tokenizer.encode("Hello there"))
            assert len(scores.log_probs) == 2 and all(math.isfinite(x) and x < 0 for x in scores.log_probs)

    with BackgroundServer(app) as server:
        asyncio.run(main(server.url))
