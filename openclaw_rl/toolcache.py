"""A request's ``tools`` validated once per distinct list (the chat route's parse, on the event loop).

Stage: client → routes → **toolcache** → protocol. An agent sends the same tool list on every request
(OpenClaw: twelve tools, ~3.7 KB of JSON); validating it into ``Tool`` models is most of a request's schema
check (~16 of ~21 µs at an ~8K-token history, measured). The chat route owns one ``ToolsCache`` and passes
it to ``ChatCompletionRequest.model_validate`` as validation context (``protocol.TOOLS_CACHE``); the
``tools`` field's validator asks it.

Exact: the key is the parsed list's compact JSON (``codec.dumps``: key order, ``1`` vs ``1.0``, ``true``
vs ``1`` all distinct; where it holds ``null``, which orjson also writes for NaN and ±Infinity, ``json``'s
text, which tells them apart), and the validated value is a pure function of that value, so a hit returns
what validating would have. It is a key for parsed JSON, as the route has: a tuple in a list made in Python
would share its list's key. Only lists that validated are stored: a bad list is validated on every request
and fails with the same 4xx it always did. Shared safely: each request gets its own list of the stored
``Tool`` instances, which are frozen (``protocol.Tool``: no field can be set); the JSON-schema
``parameters`` dicts inside them are shared and only read (``model_dump`` copies them). A kept list's tools
keep their dump as JSON (``Tool.keep_dump``): ``model_dump(exclude_none=True)``, on the render thread every
turn, parses it, a fresh dict each call. Bounded: at most ``size`` lists, each at most
``max_key_bytes`` of JSON, least recently used evicted. Bodies above ``routes.INLINE_PARSE_BYTES`` parse
on a worker thread, so the map is locked.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from . import codec


class ToolsCache:
    def __init__(self, size: int = 32, max_key_bytes: int = 256 * 1024):
        self.size, self.max_key_bytes = size, max_key_bytes
        self._lists: OrderedDict[bytes, tuple[Any, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def validate(self, value: Any, validate: Callable[[Any], Any],
                 on_keep: Callable[[Any], None] | None = None) -> Any:
        """``validate(value)`` (pydantic's handler for the ``tools`` field), or the list it returned for
        the same JSON before: a new list of the same frozen ``Tool`` instances. ``on_keep(tools)`` runs
        once for a list about to be kept (``Tool.keep_dump``)."""
        if not isinstance(value, list) or not value:
            return validate(value)
        try:
            key = b"o" + codec.dumps(value)
            if b"null" in key:  # orjson writes NaN and ±Infinity as null too: then json's exact text is the key
                key = b"j" + json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError):  # not JSON data (a caller in Python): validated as it is
            return validate(value)
        with self._lock:
            kept = self._lists.get(key)
            if kept is not None:
                self._lists.move_to_end(key)
                self.hits += 1
                return list(kept)
        tools = validate(value)  # raises on a bad list, which is never stored
        if len(key) <= self.max_key_bytes:
            if on_keep is not None:
                on_keep(tools)
            with self._lock:
                self.misses += 1
                self._lists[key] = tuple(tools)
                while len(self._lists) > self.size:
                    self._lists.popitem(last=False)
        return tools

    def __len__(self) -> int:
        return len(self._lists)
