"""Benchmark stub of ``slime.utils.processing_utils``: the tokenizer loader upstream's proxy calls."""

from __future__ import annotations

from typing import Any


def load_tokenizer(path: str, trust_remote_code: bool = False, **kwargs: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **kwargs)
