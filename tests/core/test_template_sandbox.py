"""The memoised sandbox (``template_sandbox.py``) answers every attribute access and call as jinja2's
``ImmutableSandboxedEnvironment`` does: same values, same undefineds, same ``SecurityError``s, first and
later accesses alike."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import pytest
from jinja2 import Undefined
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from openclaw_rl.template_sandbox import FastImmutableSandbox, fast_sandbox_template, memoised_tojson


class DictSub(dict):
    role = "class attribute"


def func() -> None:
    pass


OBJECTS: list[Any] = [
    {"role": "user", "content": "hi", "keys": "shadowed", "items": 1, "__class__": "x", "_p": 2},
    "hello {0}", ["a", "b"], ("a",), 3, 2.5, True, None, DictSub(role="item"), OrderedDict(role="o"), func, str,
    b"bytes",
]
NAMES = ["role", "content", "missing", "keys", "items", "values", "get", "clear", "pop", "update", "setdefault",
         "append", "extend", "sort", "startswith", "strip", "split", "upper", "format", "format_map", "real",
         "__class__", "__globals__", "__code__", "_p", "mro", "__subclasses__", "count", "index", "decode"]


def outcome(env: Any, obj: Any, name: str) -> Any:
    value = env.getattr(obj, name)
    if isinstance(value, Undefined):
        try:
            str(value)
        except Exception as e:  # noqa: BLE001 - the kind of refusal is what is compared
            return ("undefined", type(value), type(e), str(e))
        return ("undefined", type(value), value._undefined_hint, value._undefined_name)
    if callable(value) and name in ("format", "format_map"):
        return ("wrapped", getattr(value, "__wrapped__", None) == getattr(obj, name))
    return ("value", value)


def test_every_access_gets_the_parents_answer_first_and_again():
    base, fast = ImmutableSandboxedEnvironment(), FastImmutableSandbox()
    for _ in range(2):  # the second round reads what the first remembered
        for obj in OBJECTS:
            for name in NAMES:
                assert outcome(fast, obj, name) == outcome(base, obj, name), (type(obj), name)
    assert fast._found_safe  # the memo was used


def test_a_plain_dicts_own_attributes_are_exactly_its_class_names():
    """The dict fast path's premise: getattr on a plain dict succeeds exactly for the names of dir(dict)."""
    d: dict[str, Any] = {}
    for name in [*dir(dict), "role", "content", "mro", "__dict__", "__weakref__", "x"]:
        assert hasattr(d, name) == (name in dir(dict)), name


@pytest.mark.parametrize("source", [
    "{{ ''.__class__ }}", "{{ m.clear() }}", "{{ xs.append(1) }}", "{{ m.pop('role') }}",
    "{{ '{0.__class__}'.format(m) }}", "{{ '{x.__class__}'.format_map({'x': m}) }}", "{{ f.__globals__ }}",
    "{{ xs.__class__.__mro__ }}", "{{ m.update({'a': 1}) }}",
])
def test_unsafe_templates_are_refused_alike(source: str):
    base = ImmutableSandboxedEnvironment().from_string(source)
    fast = fast_sandbox_template(base, source)
    assert type(fast.environment) is FastImmutableSandbox
    args = {"m": {"role": "user"}, "xs": [1], "f": func}
    results = []
    for template in (base, fast, fast):
        try:
            results.append(("ok", template.render(**args)))
        except SecurityError as e:
            results.append(("refused", str(e)))
    assert results[0] == results[1] == results[2]


def test_a_template_renders_the_same_and_keeps_filters_and_globals():
    source = ("{%- for m in messages %}{{ m.role | upper }}:{{ m.content.strip() }}|{{ m.missing is defined }}"
              "|{{ m.items }}|{{ m | tojson }}|{{ greet(m.role) }}|{{ ' x '.strip() }}{% endfor %}")
    env = ImmutableSandboxedEnvironment(trim_blocks=True)
    env.filters["tojson"] = lambda x: repr(sorted(x.items()))
    env.globals["greet"] = lambda r: f"hello {r}"
    base = env.from_string(source)
    fast = fast_sandbox_template(base, source)
    messages = [{"role": "user", "content": " a "}, {"role": "assistant", "content": "b", "items": 3}]
    assert base.render(messages=messages) == fast.render(messages=messages) == fast.render(messages=messages)


def test_another_environment_class_is_not_replaced():
    class Custom(ImmutableSandboxedEnvironment):
        pass

    assert fast_sandbox_template(Custom().from_string("x"), "x") is None


def transformers_tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
                        sort_keys: bool = False) -> str:
    """What transformers' chat-template ``tojson`` filter is: ``json.dumps`` with these options."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class StrSub(str):
    pass


TOOL = {"type": "function", "function": {"name": "read", "description": "Read a file – ünïcode",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                        "required": ["path"], "max": 1.5e300, "n": 3, "ok": True}}}
VALUES: list[Any] = [TOOL, [TOOL, TOOL], ("a", 1), {"b": 1, "a": 2}, "text", 7, 2.5, -0.0, 1e16, True, None,
                     {"x": None}, {"x": float("nan")}, {"x": float("inf")}, [float("-inf")], {1: "int key"},
                     {"big": 2 ** 70}, {"s": StrSub("sub")}, StrSub("sub"), {"t": (1, 2)}, [1, True, 1.0]]
CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}), ((), {"indent": 2}), ((), {"sort_keys": True}), ((), {"ensure_ascii": True}),
    ((), {"separators": [",", ":"]}), ((), {"separators": (",", ":")}), ((True, 4), {})]


def test_the_memoised_tojson_writes_what_json_dumps_writes_or_raises_alike():
    memo = memoised_tojson(transformers_tojson)  # one memo for all: a value must never get another's text
    for value in VALUES * 2:  # each twice: the second may come from the memo
        for args, kwargs in CALLS:
            try:
                expected: Any = transformers_tojson(value, *args, **kwargs)
            except (TypeError, ValueError) as e:
                expected = type(e)
            try:
                got: Any = memo(value, *args, **kwargs)
            except (TypeError, ValueError) as e:
                got = type(e)
            assert got == expected, (value, args, kwargs)


def test_an_equal_plain_value_is_dumped_once_and_nan_or_a_non_string_key_every_time():
    calls: list[Any] = []

    def counted(x: Any, *args: Any, **kwargs: Any) -> str:
        calls.append(x)
        return transformers_tojson(x, *args, **kwargs)

    memo = memoised_tojson(counted)
    tools = [json.loads(json.dumps(TOOL)) for _ in range(3)]  # equal, not the same object: as each request's are
    assert [memo(t) for t in tools] == [transformers_tojson(TOOL)] * 3
    assert len(calls) == 1
    assert memo(tools[0], indent=2) == transformers_tojson(TOOL, indent=2) and len(calls) == 2  # options are key
    for odd in ({"x": float("nan")}, {"x": None}, {1: "a"}):
        memo(odd), memo(odd)
    assert len(calls) == 2 + 6


def test_a_template_with_the_tools_renders_the_same_through_the_memo():
    source = "{%- for t in tools %}{{ t | tojson }}\n{{ t.function | tojson(indent=2) }}{% endfor %}"
    env = ImmutableSandboxedEnvironment()
    env.filters["tojson"] = transformers_tojson
    base = env.from_string(source)
    fast = fast_sandbox_template(base, source)
    assert env.filters["tojson"] is transformers_tojson  # the parent environment is left as it was
    for _ in range(2):
        odd = {"function": {"x": float("nan")}}
        assert fast.render(tools=[TOOL, odd]) == base.render(tools=[TOOL, odd])
