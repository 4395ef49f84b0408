"""How a setting's value, often a string (an environment variable, a flag, a comma list), becomes its field's type.

Stage: configuration (``config.py`` loads the settings; this reads one value). Kept apart because the same
words decide every switch in the project (``is_truthy``: headers, environment variables, launch scripts).
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any

TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
NULL_WORDS = ("none", "null")  # how a string (flag, environment variable) unsets an optional field


def is_truthy(value: str) -> bool:
    """How every switch in this project reads a string (environment variables, headers, settings)."""
    return value.strip().lower() in TRUE_WORDS


def coerce(value: Any, current: Any, key: str) -> Any:
    """``value`` as the type of ``current`` (the field's value, or an example of its declared type);
    raises TypeError naming the expected type. Strings are parsed (environment variables and comma
    lists); other types must already fit."""
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
            return is_truthy(value)
        raise TypeError("expected a boolean (true/false)")
    if isinstance(current, list):
        if isinstance(value, str):  # a comma list; an empty item is a mistake (an unset $KEY in "$A,$B")
            items = [v.strip() for v in value.split(",")]
            if not all(items):
                raise ValueError(f"item #{items.index('') + 1} of the comma-separated list is empty (an unset "
                                 "$VARIABLE expands to nothing); write [] in YAML, or leave the variable unset, for none")
            return items
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        raise TypeError("expected a list of strings")
    if isinstance(current, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        raise TypeError("expected an integer")
    if isinstance(current, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise TypeError("expected a number")
    if isinstance(current, str):
        if isinstance(value, (dict, list, tuple, bool)):
            raise TypeError("expected a string")
        return str(value)
    return value


@functools.cache
def declared_optional(section: type, name: str) -> type | None:
    hint = typing.get_type_hints(section)[name]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None))
    return None


def is_null(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in NULL_WORDS)
