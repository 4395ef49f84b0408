"""Two model families through one chat-format seam: ChatML/Qwen and Mistral-shaped markup, end to end.

The Mistral-shaped tokenizer is the tiny tokenizer with Mistral's control tokens added and a
Mistral-shaped template (tests/data/chat-formats/mistral.jinja). Golden-style checks: the exact rendered
prompt, the prefix cache agreeing with full encodes, replies with reasoning and tool calls parsed
identically whatever the chunking (split at every boundary), the judge reading its verdict after the
family's think block, and the proxy serving a Mistral-shaped policy through the OpenAI SDK.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from support import mistral_shaped_tokenizer, scripted_server

from openclaw_rl import chat_format
from openclaw_rl.chat import ChatRenderer, normalize_messages
from openclaw_rl.chat_format import MISTRAL, QWEN, strip_reasoning
from openclaw_rl.judge import JudgeClient, parse_boxed, parse_hint
from openclaw_rl.parsers import OutputParser
from openclaw_rl.protocol import ChatMessage, Tool

TOOLS = [{"type": "function", "function": {"name": "ls", "description": "list files",
                                            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def mistral_tokenizer(tiny_model_dir: Path) -> Any:
    return mistral_shaped_tokenizer(tiny_model_dir)


def conversation() -> list[dict[str, Any]]:
    msgs = [ChatMessage.model_validate(m) for m in [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt b.txt"},
        {"role": "user", "content": "thanks, and the biggest?"},
    ]]
    return normalize_messages(msgs)


# --- detection and rendering ------------------------------------------------------------------------------


def test_the_renderer_detects_each_family_from_its_tokenizer(tokenizer, mistral_tokenizer):
    assert chat_format.detect(tokenizer) is QWEN and chat_format.detect(mistral_tokenizer) is MISTRAL
    qwen, mistral = ChatRenderer(tokenizer), ChatRenderer(mistral_tokenizer)
    assert qwen.format is QWEN and qwen.turn_start_id == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert mistral.format is MISTRAL and mistral.turn_start_id == mistral_tokenizer.convert_tokens_to_ids("[INST]")
    assert OutputParser.named("auto", "auto", mistral.format).tools.start_tag == "[TOOL_CALLS]"
    assert OutputParser.named("qwen3", "qwen25", mistral.format).tools.start_tag == "<tool_call>"  # explicit wins


def test_mistral_conversation_renders_exactly(mistral_tokenizer):
    renderer = ChatRenderer(mistral_tokenizer)
    text, ids = renderer.render(conversation(), [Tool.model_validate(t) for t in TOOLS])
    tools_json = json.dumps(TOOLS, ensure_ascii=False)
    assert text == ("<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][AVAILABLE_TOOLS]" + tools_json + "[/AVAILABLE_TOOLS]"
                    "[INST]list the files[/INST][TOOL_CALLS]ls[ARGS]{\"path\": \".\"}</s>"
                    "[TOOL_RESULTS]a.txt b.txt[/TOOL_RESULTS][INST]thanks, and the biggest?[/INST]")
    assert ids == mistral_tokenizer.encode(text, add_special_tokens=False)
    assert ids.count(mistral_tokenizer.convert_tokens_to_ids("[INST]")) == 2  # control tokens stay single ids
    thinking = ChatRenderer(mistral_tokenizer, enable_thinking=True)
    prompt, _ = thinking.render(conversation())
    assert prompt.endswith("[/INST][THINK]") and thinking.opens_thinking(prompt)
    assert not renderer.opens_thinking(text)


@pytest.mark.parametrize("family", ["qwen", "mistral"])
def test_prefix_cache_gives_the_ids_of_a_full_encode(family, tokenizer, mistral_tokenizer):
    tok = tokenizer if family == "qwen" else mistral_tokenizer
    renderer = ChatRenderer(tok)
    msgs = conversation() + [{"role": "assistant", "content": "b.txt"}, {"role": "user", "content": "ok, open it"}]
    for n in range(2, len(msgs) + 1):  # the session grows one message at a time
        text, ids = renderer.render(msgs[:n], cache_key="s")
        assert ids == tok.encode(text, add_special_tokens=False)
    assert renderer.cache_hits >= 1


# --- output parsing: every chunk boundary -----------------------------------------------------------------

REPLIES = {  # family → (sampled text, reasoning, content, [(tool name, arguments)])
    "mistral": [
        ('[THINK]\nThe user wants files; a brace } in thought.\n[/THINK]Let me look.'
         '[TOOL_CALLS]ls[ARGS]{"path": "."}[TOOL_CALLS]cat[ARGS]{"file": "a }{.txt", "n": [1, 2]}',
         "The user wants files; a brace } in thought.", "Let me look.",
         [("ls", {"path": "."}), ("cat", {"file": "a }{.txt", "n": [1, 2]})]),
        ('[TOOL_CALLS][{"name": "ls", "arguments": {"path": "/"}}, {"name": "pwd", "arguments": {}}]',
         None, "", [("ls", {"path": "/"}), ("pwd", {})]),
        ("Plain [INST]-free text with [brackets] and a { brace.", None,
         "Plain [INST]-free text with [brackets] and a { brace.", []),
        ('[TOOL_CALLS]ls[ARGS]{"path": "unterminated', None, '[TOOL_CALLS]ls[ARGS]{"path": "unterminated', []),
        ('[TOOL_CALLS]two words[ARGS]{"x": 1} tail', None, '[TOOL_CALLS]two words[ARGS]{"x": 1} tail', []),
        ("[THINK]cut off while thinking", "cut off while thinking", "", []),
    ],
    "qwen": [
        ('<think>\nplan } here\n</think>\n\nLet me look.\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n'
         '</tool_call>', "plan } here", "Let me look.", [("ls", {"path": "."})]),
        ("<tool_call>not json</tool_call> after", None, "<tool_call>not json</tool_call> after", []),
    ],
}
CASES = [(family, *case) for family, cases in REPLIES.items() for case in cases]


def collect(deltas: list[dict[str, Any]]) -> tuple[str, str, list[tuple[str, Any]], list[int]]:
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content", "") for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    return reasoning, content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls], \
        [c["index"] for c in calls]


@pytest.mark.parametrize(("family", "text", "reasoning", "content", "calls"), CASES)
def test_reply_parses_the_same_split_at_every_boundary(family, text, reasoning, content, calls):
    parser = OutputParser.for_format(chat_format.get(family))
    parsed = parser.parse(text)
    assert (parsed.reasoning, parsed.content.strip()) == (reasoning, content)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == calls
    chunkings = [[text[:i], text] for i in range(len(text) + 1)]  # one split at each boundary
    chunkings.append([text[:i] for i in range(1, len(text) + 1)])  # every boundary at once
    for chunks in chunkings:
        sp = parser.streaming(True)
        deltas = [d for chunk in chunks for d in sp.feed(chunk)] + sp.finish(text)
        got_reasoning, got_content, got_calls, indices = collect(deltas)
        assert (got_reasoning.strip("\n") or None, got_content.strip(), got_calls) == (reasoning, content, calls), chunks
        assert indices == list(range(len(calls)))


def test_a_thinking_prompt_opens_the_mistral_block():
    parser = OutputParser.for_format(MISTRAL)
    text = 'plan[/THINK]ok[TOOL_CALLS]ls[ARGS]{"path": "."}'
    assert parser.parse(text, starts_in_reasoning=True).reasoning == "plan"
    assert parser.parse("still thinking", starts_in_reasoning=True).content == ""
    for i in range(len(text) + 1):
        sp = parser.streaming(True, starts_in_reasoning=True)
        reasoning, content, calls, _ = collect(sp.feed(text[:i]) + sp.finish(text))
        assert (reasoning, content, calls) == ("plan", "ok", [("ls", {"path": "."})])


def test_tools_disabled_leaves_the_markup_as_content():
    text = '[TOOL_CALLS]ls[ARGS]{"path": "."}'
    assert OutputParser.for_format(MISTRAL).parse(text, tools_enabled=False).content == text
    sp = OutputParser.for_format(MISTRAL).streaming(False)
    assert collect(sp.feed(text[:5]) + sp.finish(text))[1] == text


# --- the judge and the simulator read the family's think tags --------------------------------------------


def test_the_judge_reads_its_verdict_after_its_own_families_thinking(tokenizer, mistral_tokenizer):
    import httpx

    from openclaw_rl.config import JudgeSettings

    out = "[THINK]could be \\boxed{-1} [HINT_START]no[HINT_END][/THINK] \\boxed{1} [HINT_START]Use a list.[HINT_END]"
    assert parse_boxed(out, fmt=MISTRAL) == 1 and parse_hint(out, fmt=MISTRAL) == "Use a list."
    assert parse_boxed("[THINK]I think \\boxed{1} but it is cut", fmt=MISTRAL) is None
    assert parse_boxed("<think>x \\boxed{-1}</think> \\boxed{1}") == 1  # the default family stays Qwen
    assert JudgeClient(httpx.AsyncClient(), JudgeSettings(), tokenizer=mistral_tokenizer).format is MISTRAL
    assert JudgeClient(httpx.AsyncClient(), JudgeSettings(), tokenizer=tokenizer).format is QWEN


def test_reasoning_of_any_family_is_stripped():
    assert strip_reasoning("<think>\nplan\n</think>\n\nmake it simpler") == "make it simpler"
    assert strip_reasoning("[THINK]plan[/THINK]make it simpler") == "make it simpler"
    assert strip_reasoning("[THINK]cut off") == ""


# --- end to end: the proxy serving a Mistral-shaped policy ------------------------------------------------


def mistral_policy(prompt: str) -> str:
    if "list the files" in prompt.rsplit("[INST]", 1)[-1]:
        return '[THINK]I should call ls.[/THINK]Checking.[TOOL_CALLS]ls[ARGS]{"path": "."}'
    return "[THINK]easy[/THINK]Hello there."


@pytest.mark.parametrize("stream", [False, True])
def test_proxy_serves_a_mistral_family_policy(stream, mistral_tokenizer, tmp_path):
    from openclaw_rl.config import load_settings
    from openclaw_rl.server import Proxy
    from openclaw_rl.servers import BackgroundServer

    with scripted_server(mistral_tokenizer, mistral_policy) as policy:
        settings = load_settings({"proxy_policy_url": policy.url, "spool_dir": str(tmp_path / "spool")}, env={})
        proxy = Proxy.build(settings, tokenizer=mistral_tokenizer)
        with BackgroundServer(proxy.app) as server:
            c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
            msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "list the files"}]
            if not stream:
                out = c.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
                message = out.choices[0].message
                reasoning, content = message.model_extra["reasoning_content"], message.content
                calls = [(t.function.name, json.loads(t.function.arguments)) for t in message.tool_calls]
                finish = out.choices[0].finish_reason
            else:
                chunks = [ch for ch in c.chat.completions.create(model="m", messages=msgs, tools=TOOLS, stream=True)
                          if ch.choices]
                reasoning = "".join(ch.choices[0].delta.model_extra.get("reasoning_content") or "" for ch in chunks)
                content = "".join(ch.choices[0].delta.content or "" for ch in chunks)
                calls = [(t.function.name, json.loads(t.function.arguments))
                         for ch in chunks for t in ch.choices[0].delta.tool_calls or []]
                finish = chunks[-1].choices[0].finish_reason
            assert (reasoning, content, calls, finish) == ("I should call ls.", "Checking.", [("ls", {"path": "."})],
                                                           "tool_calls")


@pytest.mark.parametrize("path", ["tiktoken", "quick"])
def test_the_fast_encoder_gives_encode_ids(tokenizer, mistral_tokenizer, path, monkeypatch):
    """Each fast path (tiktoken's BPE; ``encode_batch_fast``, without offsets, where tiktoken is missing)
    gives ``encode``'s ids; checked here on random text over special tokens, combining marks and
    whitespace, for both chat families."""
    from openclaw_rl.chat import _KEPT_ENCODER, fast_encoder

    if path == "quick":
        monkeypatch.setitem(sys.modules, "tiktoken", None)
        for tok in (tokenizer, mistral_tokenizer):  # an encoder kept from an earlier test would be tiktoken's
            monkeypatch.delattr(tok, _KEPT_ENCODER, raising=False)
    rng = random.Random(1)
    pieces = ["hello", " world", "\n\n", "\t", "🙂", "caf\u00e9", "e\u0301", "<think>", "</think>", "<tool_call>",
              "<|im_start|>", "<|im_end|>", "[INST]", "[/INST]", "[THINK]", "  ", "1234", "'s", "?!", "\r\n", "\u00a0"]
    for tok in (tokenizer, mistral_tokenizer):
        encode = fast_encoder(tok)
        assert encode.__name__ == ("encode" if path == "tiktoken" else "quick")  # the path under test is taken
        for _ in range(200):
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
            assert encode(text) == tok.encode(text, add_special_tokens=False)


def test_a_reply_ends_with_the_eos_or_the_familys_turn_end(tokenizer, mistral_tokenizer):
    """What an aborted output may already end with (``backend.settle_abort``): the tokenizer's EOS and
    the family's end-of-turn token, where the tokenizer has it."""
    qwen = ChatRenderer(tokenizer).end_of_reply_ids
    assert qwen == {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert ChatRenderer(mistral_tokenizer).end_of_reply_ids == {mistral_tokenizer.eos_token_id}
