"""The embedded tiny model: an offline byte-level BPE tokenizer and a small random Qwen3, built on demand.

Tests and the CPU stack need a real `transformers` checkpoint directory without any download; this
package builds one deterministically from a generated corpus and caches it (see `tiny_model`).
"""
