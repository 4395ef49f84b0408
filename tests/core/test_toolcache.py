"""A repeated tool list is validated once (``toolcache.ToolsCache``) and dumped from kept JSON
(``protocol.Tool.model_dump``): the same request, the same 4xx errors, the same dumps as without them, and
nothing one request holds can change what another gets."""

from __future__ import annotations

import copy
import json

import pytest
from pydantic import BaseModel, ValidationError

from openclaw_rl.bench.mock import TOOLS
from openclaw_rl.errors import BadRequest
from openclaw_rl.protocol import TOOLS_CACHE, ChatCompletionRequest, Tool
from openclaw_rl.routes import parse_chat_request
from openclaw_rl.toolcache import ToolsCache

HI = [{"role": "user", "content": "hi"}]


def body(tools: object, **extra: object) -> dict:
    return {"model": "m", "messages": HI, "tools": copy.deepcopy(tools), **extra}


def outcome(raw: dict, cache: ToolsCache | None) -> tuple[str, str | None] | str:
    """The request's dump, or its 400's message and param."""
    try:
        req = parse_chat_request(copy.deepcopy(raw), 100, cache)
    except BadRequest as e:
        return e.message, e.param
    return json.dumps(req.model_dump(), sort_keys=True)


ODD = [{"type": "function", "function": {"name": "odd", "description": "ünïcode ✓", "strict": True,
                                         "parameters": {"type": "object", "default": 1.0, "minimum": -0.0,
                                                        "maximum": 18446744073709551617, "enum": [None, 1, True],
                                                        "x": {"nested": [{"a": None}]}}},
        "x-extra": {"k": [1, 2]}}]


def test_a_repeated_tool_list_is_the_same_request_from_the_cache():
    cache = ToolsCache()
    first = parse_chat_request(body(TOOLS), 100, cache)
    second = parse_chat_request(body(TOOLS), 100, cache)
    fresh = parse_chat_request(body(TOOLS), 100)
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)
    assert second.tools is not first.tools and all(a is b for a, b in zip(second.tools, first.tools))
    assert second.model_dump() == fresh.model_dump() == first.model_dump()
    assert [t.model_dump(exclude_none=True) for t in second.tools] == [t.model_dump(exclude_none=True)
                                                                       for t in fresh.tools]


# Each bad list follows a good one with the same names (and, but for one value, the same JSON): a key
# that conflates them (names only; Python equality, where True == 1 == 1.0) would answer with the good list.
GOOD = [{"type": "function", "function": {"name": "ls", "strict": True, "parameters": {"type": "object"}}}]
BAD = [
    [{"type": "function", "function": {"name": "ls", "strict": 1, "parameters": {"type": "object"}}}],
    [{"type": "function", "function": {"name": "ls", "strict": True, "parameters": "object"}}],
    [{"type": "function", "function": {"name": "ls", "strict": True, "parameters": {"type": "object"}},
      "x": 1}, {"type": "other", "function": {"name": "ls"}}],
    [{"type": "function", "function": {"name": "", "strict": True}}],
    [{"type": "function", "function": {"name": "x" * 257}}],
    [{"type": "function"}],
    [1],
    "ls",
    {"ls": GOOD[0]},
]


@pytest.mark.parametrize("bad", BAD, ids=range(len(BAD)))
def test_a_bad_tool_list_gets_the_same_400_every_time(bad):
    cache = ToolsCache()
    assert isinstance(outcome(body(GOOD), cache), str)
    expected = outcome(body(bad), None)
    assert isinstance(expected, tuple) and "tools" in (expected[1] or "")
    assert outcome(body(bad), cache) == expected
    assert outcome(body(bad), cache) == expected  # a bad list is never kept
    assert len(cache) == 1


@pytest.mark.parametrize("extra", [
    {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
    {"tool_choice": {"type": "function", "function": {"name": "ls"}}},
    {"messages": []}, {"n": 2}, {"stop": ""}, {"tools": None}, {"tools": []},
], ids=str)
def test_other_fields_answer_the_same_beside_a_cached_tool_list(extra):
    cache = ToolsCache()
    parse_chat_request(body(GOOD), 100, cache)
    raw = {**body(GOOD), **extra}
    assert outcome(raw, cache) == outcome(raw, None)


def test_no_request_can_change_what_another_gets():
    cache = ToolsCache()
    first = parse_chat_request(body(TOOLS), 100, cache)
    first.tools.append(first.tools[0])  # its own list
    with pytest.raises(ValidationError):
        first.tools[0].function.name = "changed"  # shared instances are frozen
    with pytest.raises(ValidationError):
        first.tools[0].type = "function"
    dump = first.tools[0].model_dump(exclude_none=True)
    dump["function"]["parameters"]["changed"] = True  # a dump is the caller's own
    second = parse_chat_request(body(TOOLS), 100, cache)
    assert len(second.tools) == len(TOOLS)
    assert [t.model_dump(exclude_none=True) for t in second.tools] == [
        t.model_dump(exclude_none=True) for t in parse_chat_request(body(TOOLS), 100).tools]


@pytest.mark.parametrize("tools", [TOOLS, ODD], ids=["openclaw", "odd"])
def test_model_dump_exclude_none_is_pydantics_own_value(tools):
    for tool in Tool.model_validate(tools[0]), *parse_chat_request(body(tools), 100, ToolsCache()).tools:
        for _ in range(2):
            ours, theirs = tool.model_dump(exclude_none=True), BaseModel.model_dump(tool, exclude_none=True)
            assert ours == theirs
            assert repr(ours) == repr(theirs)  # 1.0 stays a float, True a bool, -0.0 its sign
        assert tool.model_dump(exclude_none=True) is not tool.model_dump(exclude_none=True)
        assert tool.model_dump() == BaseModel.model_dump(tool)  # other arguments: pydantic's own


def test_the_cache_is_bounded_and_keeps_the_recently_used():
    cache = ToolsCache(size=2, max_key_bytes=400)
    lists = [[{"type": "function", "function": {"name": f"t{i}"}}] for i in range(3)]
    for tools in lists[0], lists[1], lists[0], lists[2]:
        parse_chat_request(body(tools), 100, cache)
    assert len(cache) == 2
    parse_chat_request(body(lists[0]), 100, cache)
    assert cache.hits == 2  # t0 was used last before t2 came: t1 went
    parse_chat_request(body(TOOLS), 100, cache)  # over max_key_bytes: validated, not kept
    assert len(cache) == 2 and cache.misses == 3


def test_values_json_cannot_carry_are_dumped_by_pydantic():
    """NaN (JSON bodies may carry it: ``codec``), an int beyond 64 bits and a tuple (a request made in
    Python) do not read back from JSON as themselves: such a kept tool is dumped by pydantic every time."""
    cache = ToolsCache()
    for odd in float("nan"), 2 ** 64, (1, 2):
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"v": odd}}}]
        for _ in range(2):
            tool = ChatCompletionRequest.model_validate(
                {"messages": HI, "tools": tools}, context={TOOLS_CACHE: cache}).tools[0]
            assert repr(tool.model_dump(exclude_none=True)) == repr(BaseModel.model_dump(tool, exclude_none=True))
    assert cache.hits == 3


def test_null_nan_and_infinity_are_different_lists():
    """orjson writes NaN and ±Infinity as ``null``: a key made of its text alone would answer a list
    holding one of them with another's tools (a JSON body may carry NaN: ``codec``)."""
    cache = ToolsCache()
    for _ in range(2):
        for v in None, float("nan"), float("inf"), float("-inf"):
            tools = [{"type": "function", "function": {"name": "f", "parameters": {"v": v}}}]
            req = ChatCompletionRequest.model_validate({"messages": HI, "tools": tools}, context={TOOLS_CACHE: cache})
            assert repr(req.tools[0].function.parameters["v"]) == repr(v)
    assert (cache.hits, cache.misses) == (4, 4)


def test_a_kept_tool_is_an_ordinary_tool_to_compare_and_to_copy():
    """The kept JSON (``keep_dump``) is a cache of the tool's fields, not part of its value: a kept tool equals
    the same tool validated afresh (pydantic compares private attributes), and a copy with other fields
    (``model_copy(update=...)``) dumps those fields, not the kept JSON of the tool it was copied from."""
    first = parse_chat_request(body(TOOLS), 100, ToolsCache()).tools[0]
    fresh = parse_chat_request(body(TOOLS), 100).tools[0]
    assert first == fresh and fresh == first
    assert first != parse_chat_request(body(ODD), 100).tools[0]
    renamed = first.model_copy(update={"function": first.function.model_copy(update={"name": "renamed"})})
    assert renamed.model_dump(exclude_none=True)["function"]["name"] == "renamed"
    assert renamed.model_dump(exclude_none=True) == BaseModel.model_dump(renamed, exclude_none=True)
    assert first.model_copy().model_dump(exclude_none=True) == fresh.model_dump(exclude_none=True)
