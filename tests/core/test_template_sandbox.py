"""The memoised sandbox (``template_sandbox.py``) answers every attribute access and call as jinja2's
``ImmutableSandboxedEnvironment`` does: same values, same undefineds, same ``SecurityError``s, first and
later accesses alike."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
from jinja2 import Undefined
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from openclaw_rl.template_sandbox import FastImmutableSandbox, fast_sandbox_template


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
