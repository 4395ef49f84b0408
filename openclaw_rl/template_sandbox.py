"""jinja2's immutable sandbox with its per-access checks memoised for plain builtin data, same verdicts.

Stage: used by the **chat template** renderer (``chat_template.py``: every turn's policy prompt and the
judge's vote prompts). A chat template is untrusted code from a model repository, so it runs in jinja2's
``ImmutableSandboxedEnvironment``; that stays. What costs is how the sandbox answers each ``message.role``
on a plain ``dict``: ``getattr(message, "role")`` raises ``AttributeError`` (an exception built and
caught per access) before it subscripts, and each method looked up on a string (``content.strip``,
``startswith``) runs ``is_internal_attribute`` and ``modifies_known_mutable``, a dozen ``isinstance``
checks against ABCs. The profile of a ~1K-token turn put ~40 such accesses and half of the template's CPU
there (the template was ~20% of the proxy's CPU).

Here the answers are the parent's, found faster where they cannot differ:

- an exact ``dict`` has no attributes but its class's (no instance ``__dict__``): for a name not in
  ``dir(dict)`` the parent's ``getattr`` fails and subscripts, so this subscripts at once;
- for exact builtin types (``str``, ``dict``, ``list``, ``tuple``, ``int``, ``float``, ``bool``, ``None``)
  whether an attribute exists and is safe depends on the type and the name alone (their attributes are
  the class's, fixed; the checks are ``isinstance`` tests of the type), so the parent's verdict
  "found and safe" is remembered per (type, name) and later accesses read the attribute directly.
  ``format`` and ``format_map`` are never remembered (the parent wraps them in a sandboxed formatter);
  an unsafe or missing attribute always goes through the parent (its undefined or ``SecurityError``);
- a builtin function or method (``builtin_function_or_method``, no instance attributes, none of the
  ``unsafe_callable``/``alters_data`` marks) is always safely callable, so ``call`` skips the check.

Anything else (other types, subclasses of the builtins, ``getitem``, operators) is the parent's code.

The template's ``tojson`` filter (transformers' ``json.dumps`` with the template's options) is memoised
too: OpenClaw sends the same dozen tools with every request and a template dumps each one, ~8 µs apiece
in ``json.dumps`` (~100 µs a render, ~45% of a ~8K turn's template) against ~0.4 µs for orjson. The memo's
key is orjson's bytes of the value plus the filter's options, and a value is memoised only where orjson's
bytes name one ``json.dumps`` output: plain JSON data (no ``null``, which orjson also writes for NaN and
infinities; nothing orjson refuses, such as non-string keys or integers past 64 bits; nothing it knows and
``json`` does not, which the passthrough options make it refuse). Everything else goes to the filter itself,
and what is memoised is always the filter's own output.
``ChatTemplateText`` still compares this path with ``apply_chat_template`` on its probe conversations
before using it, and ``tests/test_template_sandbox.py`` compares verdicts and renders with the parent's.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

try:
    import orjson
except ImportError:  # pragma: no cover - a declared dependency; without it tojson is not memoised
    orjson = None  # type: ignore[assignment]

_DICT_ATTRS = frozenset(dir(dict))
_MEMO_TYPES = frozenset({str, dict, list, tuple, int, float, bool, type(None)})
_WRAPPED = frozenset({"format", "format_map"})  # the parent returns a sandboxed wrapper for these
_BUILTIN_CALLABLE = types.BuiltinFunctionType  # == types.BuiltinMethodType


class FastImmutableSandbox(ImmutableSandboxedEnvironment):
    """An ``ImmutableSandboxedEnvironment`` whose attribute checks on plain builtin data are memoised."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._found_safe: dict[tuple[type, str], bool] = {}

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRS:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        memo = self._found_safe
        key = (kind, attribute)
        if key in memo:
            return getattr(obj, attribute)
        value = super().getattr(obj, attribute)
        if kind in _MEMO_TYPES and attribute not in _WRAPPED and type(attribute) is str:
            try:
                own = getattr(obj, attribute)
            except AttributeError:
                pass
            else:
                if value is own or value == own:  # the parent returned the attribute itself: found and safe
                    memo[key] = True
        return value

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805, B902
        if type(__obj) is _BUILTIN_CALLABLE:
            return __context.call(__obj, *args, **kwargs)
        return super().call(__context, __obj, *args, **kwargs)


_TOJSON_MEMO_MAX = 4096  # distinct dumped values kept; the memo starts again when full
# dataclasses, datetimes and str/int/dict/list subclasses: orjson refuses them here (json would dump a subclass
# by its base type or refuse the rest; either way the filter decides); numpy is refused without its option
_KEY_OPTIONS = 0 if orjson is None else (orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
                                         | orjson.OPT_PASSTHROUGH_SUBCLASS)


def memoised_tojson(tojson: Callable[..., str]) -> Callable[..., str]:
    """``tojson`` (the template's filter) with its output remembered per plain-JSON value and options."""
    if orjson is None:
        return tojson
    memo: dict[tuple[Any, ...], str] = {}

    def memo_tojson(x: Any, *args: Any, **kwargs: Any) -> str:
        if type(x) not in _MEMO_TYPES:  # enums and the like: the filter decides
            return tojson(x, *args, **kwargs)
        try:
            data = orjson.dumps(x, option=_KEY_OPTIONS)
        except TypeError:  # not plain JSON data as orjson sees it: the filter decides
            return tojson(x, *args, **kwargs)
        if b"null" in data:  # null may stand for NaN or an infinity
            return tojson(x, *args, **kwargs)
        try:
            key = (data, args, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:  # an unhashable option (a list of separators): not memoised
            return tojson(x, *args, **kwargs)
        text = memo.get(key)
        if text is None:
            text = tojson(x, *args, **kwargs)
            if len(memo) >= _TOJSON_MEMO_MAX:
                memo.clear()
            memo[key] = text
        return text

    return memo_tojson


def fast_sandbox_template(compiled: Any, source: str) -> Any:
    """``compiled`` (a template of transformers' immutable sandbox) compiled again in a copy of its
    environment whose class is ``FastImmutableSandbox``: the same filters, globals, extensions and options.
    None when its environment is not exactly an ``ImmutableSandboxedEnvironment``."""
    env = getattr(compiled, "environment", None)
    if type(env) is not ImmutableSandboxedEnvironment:
        return None
    fast = env.overlay()  # a copy: filters, globals, options, extensions bound to it
    fast.__class__ = FastImmutableSandbox
    fast._found_safe = {}
    if "tojson" in fast.filters:  # the overlay shares its parent's filter dict: change a copy
        fast.filters = {**fast.filters, "tojson": memoised_tojson(fast.filters["tojson"])}
    return fast.from_string(source)
