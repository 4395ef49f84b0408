"""The per-session prefix tokenisation cache gives exactly the ids of a full encode."""

from __future__ import annotations

import random

from support import load_conversation

from openclaw_rl.chat import ChatRenderer, normalize_messages
from openclaw_rl.protocol import ChatCompletionRequest


def test_cached_encoding_equals_full_encoding_on_openclaw_traffic(tokenizer):
    cached, plain = ChatRenderer(tokenizer), ChatRenderer(tokenizer)
    for name in ("conversation_A.jsonl", "conversation_B.jsonl"):
        for row in load_conversation(name):
            req = ChatCompletionRequest.model_validate(row["body"])
            msgs = normalize_messages(req.messages)
            assert cached.render(msgs, req.tools, cache_key=name)[1] == plain.render(msgs, req.tools)[1]
    assert cached.cache_hits >= 4  # every later request of a conversation reuses the earlier prefix


def test_cached_encoding_on_random_conversations(tokenizer):
    rng = random.Random(0)
    pieces = ["hello", " world", "\n", "🙂", "café", "<think>", "</think>", "<tool_call>", "  ", "x" * 40,
              "<|im_start|>", "<|im_end|>", "\u00e9\u0301", "1234", "'s", "?!"]
    cached, plain = ChatRenderer(tokenizer), ChatRenderer(tokenizer)
    for session in range(20):
        history = [{"role": "system", "content": "".join(rng.choice(pieces) for _ in range(30))}]
        for _ in range(6):
            history.append({"role": "user", "content": "".join(rng.choice(pieces) for _ in range(rng.randint(1, 20)))})
            req = ChatCompletionRequest.model_validate({"messages": history})
            msgs = normalize_messages(req.messages)
            assert cached.render(msgs, cache_key=str(session))[1] == plain.render(msgs)[1]
            history.append({"role": "assistant", "content": "".join(rng.choice(pieces) for _ in range(10))})
            if rng.random() < 0.3:
                history[rng.randrange(len(history))]["content"] += "edit"  # a rewritten history misses the cache


def test_sessions_share_the_first_block_and_forget_frees_a_session(tokenizer):
    """A new session reuses the ids of another session's identical system block; still exact."""
    system = {"role": "system", "content": "You are OpenClaw. " * 50 + "caf\u00e9 🙂 <think>"}
    cached, plain = ChatRenderer(tokenizer), ChatRenderer(tokenizer)
    for session in range(3):
        msgs = [system, {"role": "user", "content": f"task {session}: hello\u00e9 🙂"}]
        assert cached.render(msgs, cache_key=str(session))[1] == plain.render(msgs)[1]
    assert len(cached._shared) == 1 and len(cached._cache) == 3
    cached.forget("1")
    assert set(cached._cache) == {"0", "2"}


def test_side_turns_keep_their_own_prefix_and_end_with_the_session(policy_server, make_proxy):
    """A side turn (another conversation on the same session id) must not replace the main line's
    cached prefix; both are freed when the session ends."""
    import httpx

    from openclaw_rl.chat import side_cache_key

    proxy, url = make_proxy(policy_server.url)
    cache = proxy.service.renderer._cache
    main = [{"role": "system", "content": "You are OpenClaw. " * 20}, {"role": "user", "content": "task one"}]
    side = [{"role": "system", "content": "Summarise the conversation."}, {"role": "user", "content": "x " * 40}]
    for messages, kind in ((main, "main"), (side, "side")):
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 4}, timeout=60,
                       headers={"X-Session-Id": "s1", "X-Turn-Type": kind})
        assert r.status_code == 200
    keys = [k for k in cache if k.split("\x1f")[1] == "s1"]
    main_key = min(keys, key=len)
    assert sorted(keys) == sorted([main_key, side_cache_key(main_key)])
    main.append({"role": "assistant", "content": "done"})
    main.append({"role": "user", "content": "and now?"})
    hits = proxy.service.renderer.cache_hits
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": main, "max_tokens": 4}, timeout=60,
                   headers={"X-Session-Id": "s1", "X-Turn-Type": "main", "X-Session-Done": "1"})
    assert r.status_code == 200 and proxy.service.renderer.cache_hits == hits + 1  # the main prefix survived
    assert not [k for k in cache if "s1" in k]  # the session ended: both freed


def test_a_next_turn_reuses_the_whole_previous_prompt(tokenizer):
    """A turn that only appends (the reply and a new user message) takes the previous prompt's ids up to its
    generation prompt from the cache and tokenises only what is new; still exact. A turn that drops the
    previous trailing message falls back to the shorter cut, and a rewritten history to a full encode."""
    cached, plain = ChatRenderer(tokenizer), ChatRenderer(tokenizer)
    calls: list[str] = []
    encode = cached.encode_array

    def counting(text):
        calls.append(text)
        return encode(text)

    system = {"role": "system", "content": "You are OpenClaw. caf\u00e9 🙂"}
    first = [system, {"role": "user", "content": "long first message " * 200}]
    assert cached.render(first, cache_key="s")[1] == plain.render(first)[1]
    cached.encode_array = counting
    try:
        second = [*first, {"role": "assistant", "content": "done \u00e9"}, {"role": "user", "content": "next"}]
        assert cached.render(second, cache_key="s")[1] == plain.render(second)[1]
        fresh = calls[0]
        assert "long first message" not in fresh and "done \u00e9" in fresh  # only the new messages
        calls.clear()
        dropped = [*second[:3], {"role": "user", "content": "instead"}]  # the trailing message replaced
        assert cached.render(dropped, cache_key="s")[1] == plain.render(dropped)[1]
        assert "long first message" not in calls[0] and "instead" in calls[0]
        rewritten = [system, {"role": "user", "content": "long first message " * 199}]
        assert cached.render(rewritten, cache_key="s")[1] == plain.render(rewritten)[1]
    finally:
        cached.encode_array = encode
    assert cached.cache_hits == 2



def test_a_prefix_stored_from_the_new_part_equals_one_stored_from_a_full_encode(tokenizer):
    """After a cache hit (or a shared first block) the next cuts are found in the new part only (counts,
    turn starts, the digest continued from the cut's): the stored prefix must be the one a full encode of
    the same text stores, and the ids array handed to the turn must be the ids."""
    rng = random.Random(3)
    pieces = ["hello", " world", "\n", "🙂", "café", "<think>", "</think>", "  ", "x" * 30, "\u00e9\u0301", "'s"]
    chained, fresh, plain = ChatRenderer(tokenizer), ChatRenderer(tokenizer), ChatRenderer(tokenizer)
    for session in ("a", "b"):  # b's first prompt starts with a's first block: the shared ids
        history = [{"role": "system", "content": "You are OpenClaw. " * 20}]
        for turn in range(6):
            history.append({"role": "user", "content": "".join(rng.choice(pieces) for _ in range(rng.randint(1, 15)))})
            if turn == 3:  # a tool round trip: several turn starts in the new part
                history += [{"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "done 🙂"}]
            msgs = normalize_messages(ChatCompletionRequest.model_validate({"messages": history}).messages)
            _, ids_array = chained.render_ids(msgs, cache_key=session)
            assert ids_array.typecode == "i" and ids_array.tolist() == plain.render(msgs)[1]
            fresh._cache.clear()
            fresh._shared.clear()
            fresh.render(msgs, cache_key=session)
            assert chained._cache[session] == fresh._cache[session], (session, turn)
            history.append({"role": "assistant", "content": "".join(rng.choice(pieces) for _ in range(8))})
    assert chained.cache_hits == 10 and fresh.cache_hits == 0 and len(chained._shared) == 1
