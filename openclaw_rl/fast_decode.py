"""Decoding sampled ids to text without ``transformers``' per-call Python: the check of a reply's text.

Stage: backend → **ids text** (``idstext.py``) → serving. Every reply's text is checked against the text of
its output ids, decoded in windows of a few tokens, two decodes per stream event. ``tokenizer.decode`` first
converts its argument with ``to_py_obj``, a generator that calls ``isinstance`` on every id, then reads the
clean-up settings: ~25 µs a call, against ~3 µs for the Rust tokenizer's own ``decode`` (yappi, a paced
512-token stream: ``IdsText.update`` was 27% of the proxy's CPU). Where the tokenizer's ``decode`` is
exactly the Rust ``decode`` (a fast tokenizer whose ``_decode`` is the library's, with no clean-up of
tokenization spaces), that is called directly; a probe over the vocabulary's first ids and the added tokens
must give ``decode``'s text, or ``decode`` itself is used. The text is what SGLang's detokenizer (which
calls ``decode``) sends, so the check is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

Decode = Callable[[list[int]], str]
_LIBRARY_DECODES = ("TokenizersBackend._decode", "PreTrainedTokenizerFast._decode")


def fast_decoder(tokenizer: Any, skip_special_tokens: bool) -> Decode:
    """``ids -> tokenizer.decode(ids, skip_special_tokens=…)``, by the Rust tokenizer where that is the same."""
    slow: Decode = partial(tokenizer.decode, skip_special_tokens=skip_special_tokens)
    backend = getattr(tokenizer, "_tokenizer", None)
    method = getattr(type(tokenizer), "_decode", None)
    if (backend is None or not callable(getattr(backend, "decode", None))
            or getattr(method, "__qualname__", "") not in _LIBRARY_DECODES
            or getattr(tokenizer, "clean_up_tokenization_spaces", True)):
        return slow
    fast: Decode = partial(backend.decode, skip_special_tokens=skip_special_tokens)
    try:
        vocab = len(tokenizer)
        added = sorted(int(i) for i in getattr(tokenizer, "added_tokens_decoder", {}))
        base = list(range(min(vocab, 512)))
        probes = [base[i:i + 7] for i in range(0, len(base), 7)] + [added, added[:1] + base[32:40] + added[-1:], []]
        if any(fast(p) != slow(p) for p in probes):
            return slow
    except Exception:  # noqa: BLE001 - any doubt: the library's decode
        return slow
    return fast
