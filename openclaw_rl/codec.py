"""The JSON codec of the hot paths: orjson when installed (3-10× faster than ``json``), ``json`` otherwise.

Stage: shared by the routes (request bodies, replies), serving (SSE chunks) and the backend client
(``/generate`` replies and stream chunks). Both produce compact UTF-8 JSON with non-ASCII kept. orjson
is stricter than ``json`` on input (NaN, lone surrogates, ints beyond 64 bits are errors): such input is
parsed again with ``json``, so both codecs accept exactly the same documents and the value checks
downstream (400 for a request, ``backend_invalid_output`` for a backend answer) decide; on output, a value orjson refuses (a lone surrogate in a ``str``)
falls back to ``json`` rather than failing the request.
"""

from __future__ import annotations

import json
import os
from array import array
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is a declared dependency; the fallback keeps a bare env working
    orjson = None  # type: ignore[assignment]
if os.environ.get("OPENCLAW_RL_JSON") == "json":  # benchmarks measure what orjson buys by turning it off
    orjson = None  # type: ignore[assignment]

DecodeError: tuple[type[Exception], ...] = (ValueError,) if orjson is None else (ValueError, orjson.JSONDecodeError)
"""What ``loads`` raises on bad input (orjson's error is a ValueError subclass too)."""


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            # json also reads NaN/Infinity (Python servers write them): the caller's range checks then say
            # what is wrong with the value instead of calling the whole answer non-JSON. Only bad input
            # pays for the second parse.
            pass
    return json.loads(bytes(data) if isinstance(data, memoryview) else data)


def loads_unicode(data: bytes | bytearray | memoryview | str) -> tuple[Any, bool]:
    """``loads``, and whether every string in the value is known to be valid Unicode: True when orjson
    parsed it (it refuses invalid UTF-8 and lone-surrogate escapes), False when ``json`` did (it decodes
    ``\\ud800`` escapes and, from bytes, CESU-8 surrogates alike), so the caller must look."""
    if orjson is not None:
        try:
            return orjson.loads(data), True
        except orjson.JSONDecodeError:
            pass
    return json.loads(bytes(data) if isinstance(data, memoryview) else data), False


def _array_for_orjson(value: Any) -> Any:
    """An ``array.array`` of token ids (what the renderer and a ``Turn`` hold) written as a JSON list: numpy's
    view of its buffer, which orjson writes without an int object per id (``tolist`` costs ~95 µs for 8K
    ids; the view ~2 µs, and orjson writes the list faster from it)."""
    if isinstance(value, array) and value.typecode == "i":
        import numpy as np

        return np.frombuffer(value, dtype=np.intc)
    return array_as_list(value)


def array_as_list(value: Any) -> Any:
    """``json.dumps``'s ``default`` for the same arrays: their values as a list."""
    if isinstance(value, array):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON bytes. An ``array.array`` is written as the list of its values."""
    if orjson is not None:
        try:
            return orjson.dumps(obj, default=_array_for_orjson, option=orjson.OPT_SERIALIZE_NUMPY)
        except TypeError:  # lone surrogate, or a type orjson does not know: json has the final word
            pass
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False,
                      default=array_as_list).encode("utf-8", "surrogatepass")


def dumps_str(obj: Any) -> str:
    """Compact JSON text for storage (SQLite TEXT). On orjson's refusal (a lone surrogate) ``json`` escapes
    to ASCII, so the text stays valid UTF-8 for the database; either way ``json.loads`` reads it back."""
    if orjson is not None:
        try:
            return orjson.dumps(obj, default=_array_for_orjson, option=orjson.OPT_SERIALIZE_NUMPY).decode("utf-8")
        except TypeError:
            pass
    return json.dumps(obj, separators=(",", ":"), default=array_as_list)


def backend_name() -> str:
    return "orjson" if orjson is not None else "json"
