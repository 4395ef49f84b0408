"""The teacher is never asked to score a token id outside its vocabulary (a 400 before any request)."""

from __future__ import annotations

import asyncio
import json
from array import array

import httpx
import pytest

from openclaw_rl.config import JudgeSettings
from openclaw_rl.errors import BadRequest
from openclaw_rl.judge import JudgeClient


def test_ids_outside_the_vocabulary_are_refused_before_the_teacher_is_called():
    sent = []

    def teacher(request):  # scores every id from logprob_start_len on, the first entry null (as SGLang does)
        body = json.loads(request.content)
        sent.append(body)
        ids = body["input_ids"][body["logprob_start_len"]:]
        entries = [[None, ids[0], None]] + [[-0.1 * k, t, None] for k, t in enumerate(ids[1:], 1)]
        return httpx.Response(200, json={"text": "", "meta_info": {"input_token_logprobs": entries}})

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(teacher)) as http:
            judge = JudgeClient(http, JudgeSettings(url="http://teacher"), vocab_size=100)
            for prompt, response in (([1, 2, 100], [4, 5]), ([1, -1, 3], [4, 5]), ([1, 2, 3], [4, 100]),
                                     (array("i", [1, 2, 3]), [99, 2**31 - 1])):
                with pytest.raises(BadRequest, match="outside the teacher's vocabulary"):
                    await judge.teacher_log_probs(prompt, response)
            assert not sent
            scores = await judge.teacher_log_probs(array("i", [1, 2, 3]), [4, 5])  # 0 and 99 are inside
            assert scores.log_probs == [-0.1, -0.2] and sent[-1]["input_ids"] == [1, 2, 3, 4, 5]
            assert len(sent) == 1
            await judge.teacher_log_probs([0, 2, 3], [4, 99])

    asyncio.run(main())
