"""The per-event fast paths of issue #33 item 3: the reply-text check's decoder and the stream reader's waits."""

from __future__ import annotations

import asyncio
import copy
import random
from typing import Any

import pytest

from openclaw_rl.chat import ChatRenderer
from openclaw_rl.fast_decode import fast_decoder
from openclaw_rl.loopwait import await_within


def _id_lists(tokenizer: Any, n: int = 300) -> list[list[int]]:
    rng = random.Random(7)
    special = sorted(int(i) for i in tokenizer.added_tokens_decoder)
    pool = list(range(len(tokenizer))) + special * 20
    return [[rng.choice(pool) for _ in range(rng.randint(0, 12))] for _ in range(n)]


@pytest.mark.parametrize("skip", [True, False])
def test_fast_decoder_is_the_rust_decode_and_gives_decodes_text(tokenizer: Any, skip: bool) -> None:
    decode = fast_decoder(tokenizer, skip)
    assert getattr(decode, "func", None) == tokenizer._tokenizer.decode  # not transformers' decode
    for ids in _id_lists(tokenizer):
        assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_fast_decoder_keeps_transformers_decode_where_it_differs(tokenizer: Any) -> None:
    cleaning = copy.copy(tokenizer)
    cleaning.clean_up_tokenization_spaces = True  # decode may rewrite the text: never bypassed
    assert getattr(fast_decoder(cleaning, True), "func", None) == cleaning.decode

    class Custom(type(tokenizer)):  # type: ignore[misc]
        def _decode(self, token_ids: Any, **kw: Any) -> str:
            return "custom"

    custom = copy.copy(tokenizer)
    custom.__class__ = Custom
    decode = fast_decoder(custom, True)
    assert decode([1, 2]) == "custom"


def test_renderer_keeps_one_decoder_per_skip_setting(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    assert renderer.decoder(True) is renderer.decoder(True)
    assert renderer.decoder(False)([]) == ""


def test_await_within_returns_when_resolved_and_raises_timeout_otherwise() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_soon(fut.set_result, None)
        await await_within(fut, 60.0)
        late = loop.create_future()
        with pytest.raises(TimeoutError):
            await await_within(late, 0.001)
        assert late.done() and isinstance(late.exception(), TimeoutError)

    asyncio.run(scenario())


def test_gathering_ends_at_the_first_read_after_the_window_or_at_the_end() -> None:
    """``wait_gathered``: a read inside the window does not end it, the first read after it does (in that
    read's wake-up: no timer of its own), and so does the end of the response at any time."""
    from openclaw_rl.rawstream import StreamConnection

    async def scenario() -> None:
        for ending in ("read after the window", "end of the response"):
            conn = StreamConnection()
            waiting = asyncio.ensure_future(conn.wait_gathered(600.0))
            await asyncio.sleep(0)  # the wait has started: its window runs for 600 s
            conn.fresh = True
            conn._wake()  # a read inside the window
            await asyncio.sleep(0)
            assert not waiting.done()
            if ending == "read after the window":
                conn._gather_until = 0.0  # the window has passed (no clock in a test)
            else:
                conn.complete = True
            conn._wake()
            await asyncio.wait_for(waiting, 60.0)  # ends now; the 1,200 s backstop would fail the test
            assert conn._gather_until == float("inf")

    asyncio.run(scenario())
