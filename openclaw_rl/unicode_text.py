"""Whether text is Unicode at all: the lone-surrogate check shared by the request schemas and the parsers.

Stage: client → protocol / serving → parsers. Its own module, free of pydantic, because ``parsers`` (which
``config`` imports to check parser names) needs it: through ``protocol`` every process that only reads
the settings (the launch scripts' planner, each ``python -m openclaw_rl.launch plan`` of a dry run) also
built every wire schema, ~0.2 CPU-s per start.
"""

from __future__ import annotations

from typing import Any


def has_lone_surrogate(value: Any) -> bool:
    """Whether a string anywhere in ``value`` (dict keys too) holds a lone UTF-16 surrogate: not Unicode,
    so no tokenizer, JSON encoder or database takes it. UTF-8 encoding refuses exactly those, in C."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False
