"""The policy tokenizer's byte-level BPE run by tiktoken: the same ids, at about a quarter of the CPU.

Stage: under the **chat renderer** (``chat.fast_encoder``). Tokenising the new messages of a turn is the
proxy's main per-token CPU cost, and a session's first turn tokenises its whole history (~8K tokens for
an agent). The ``tokenizers`` pipeline tracks character alignments through normalisation, splitting
and byte mapping even when nobody reads them; tiktoken runs the same regex split and BPE without them.

tiktoken merges the adjacent pair whose *concatenation* has the lowest id, where ``tokenizers`` merges
the pair that comes first in its merge list. The two agree when the vocabulary is merge-ordered: every
multi-byte token is made by exactly the merge at its place in the list, in id order (true of Qwen's
tokenizers, which began as tiktoken vocabularies, and of ``tokenizers``' own BPE trainer, which numbers
tokens as it learns merges). ``tiktoken_encoder`` builds an encoder only for a tokenizer of that
shape, and ``chat.fast_encoder`` still uses it only if it gives ``encode``'s ids on a probe. Whatever
it returns, exactness of training data does not depend on it: the proxy sends the ids it computed to
the policy, so the policy consumes exactly the ids that are stored.
"""

from __future__ import annotations

import json
import unicodedata
from array import array
from collections.abc import Callable
from typing import Any

# GPT-2's split, which a ByteLevel pre-tokenizer with ``use_regex`` applies itself.
_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_of_char() -> dict[str, int]:
    """ByteLevel's printable stand-in for each byte, inverted (the table every byte-level BPE uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def _split_pattern(pre: dict[str, Any] | None) -> str | None:
    """The regex a Qwen-shaped (Split + ByteLevel) or GPT-2-shaped (ByteLevel) pre-tokenizer applies."""
    if not pre:
        return None
    steps = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
    *splits, last = steps
    if last.get("type") != "ByteLevel" or last.get("add_prefix_space"):
        return None
    if not splits:
        return _GPT2_SPLIT if last.get("use_regex", True) else None
    if len(splits) != 1 or last.get("use_regex", True):
        return None
    split = splits[0]
    regex = (split.get("pattern") or {}).get("Regex")
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert") or not regex:
        return None
    return regex


def _merge_ordered(vocab: dict[str, int], merges: list[Any], single: set[str]) -> bool:
    """Every token but the single bytes is made by one merge, ids rising with the merge list."""
    made: set[str] = set()
    last_id = -1
    for merge in merges:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        token = left + right
        token_id = vocab.get(token)
        if token_id is None or token in made or token_id <= last_id:
            return False
        if vocab.get(left, token_id) >= token_id or vocab.get(right, token_id) >= token_id:
            return False
        made.add(token)
        last_id = token_id
    return all(token in made or token in single for token in vocab)


def is_panic(exc: BaseException) -> bool:
    """A Rust panic surfaced by pyo3 (``pyo3_runtime.PanicException``, which is not an ``Exception``)."""
    return type(exc).__name__ == "PanicException"


def _has_anchor(pattern: str) -> bool:
    """A ``^`` or ``$`` outside a negated class and not escaped."""
    rest = pattern.replace("\\\\", "").replace("\\^", "").replace("\\$", "").replace("[^", "[")
    return "^" in rest or "$" in rest


_EMPTY_MATCH_SAMPLE = "ab 12 a1b\tx\n\n  y.,!? 'S 'll 日本 é 🙂\r\n z  "


def _matches_nothing(pattern: str) -> bool:
    """Whether the split regex matches the empty string (``regex``, a transformers dependency, reads the
    same syntax): on the empty text, or anywhere in a sample of letters, digits, marks and whitespace."""
    try:
        import regex
    except ImportError:  # pragma: no cover - transformers requires it; without it, refuse rather than guess
        return True
    try:
        compiled = regex.compile(pattern)
    except regex.error:
        return True
    return compiled.fullmatch("") is not None or any(not m.group() for m in compiled.finditer(_EMPTY_MATCH_SAMPLE))


def _each_token_is_its_own_bpe(backend: Any, vocab: dict[str, int]) -> bool:
    """tiktoken takes a split piece that is a vocabulary entry whole, and merges any adjacent pair that
    makes an entry; ``tokenizers`` merges only listed pairs (and takes a piece whole only with
    ``ignore_merges``). On a merge-ordered vocabulary the two agree if every entry's own merges give the
    entry itself (~2 µs per entry: ~0.3 s at start-up for a 150K vocabulary)."""
    tokenize = backend.model.tokenize
    return all(len(pieces := tokenize(token)) == 1 and pieces[0].id == token_id for token, token_id in vocab.items())


def tiktoken_encoder(tokenizer: Any) -> tuple[Callable[[str], list[int]] | None, str]:
    """``(text -> ids, "")`` running the tokenizer's BPE on tiktoken, or ``(None, why not)``.

    Text that is not NFC (where the tokenizer normalises) or holds a lone surrogate goes to
    ``tokenizer.encode``, so those inputs behave exactly as before (tiktoken would replace a surrogate)."""
    try:
        import tiktoken
    except ImportError:
        return None, "tiktoken is not installed"
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or getattr(backend, "truncation", None) or getattr(backend, "padding", None):
        return None, "not a fast tokenizer without truncation or padding"
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if (model.get("type") != "BPE" or model.get("dropout") or model.get("byte_fallback")
            or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix")):
        return None, "the model is not plain byte-level BPE"
    normalizer = spec.get("normalizer")
    if normalizer not in (None, {"type": "NFC"}):
        return None, f"normalizer {normalizer.get('type')!r}"
    pattern = _split_pattern(spec.get("pre_tokenizer"))
    if pattern is None:
        return None, "the pre-tokenizer is not a regex split followed by ByteLevel"
    if _has_anchor(pattern):  # Oniguruma's ^ and $ match at line breaks, tiktoken's only at the text's ends
        return None, "the split regex has a ^ or $ anchor"
    if _matches_nothing(pattern):  # tiktoken then panics on some texts and drops pieces of others
        return None, "the split regex can match the empty string"
    if getattr(backend, "encode_special_tokens", False) or getattr(tokenizer, "split_special_tokens", False):
        return None, "added tokens in the text are split as text (split_special_tokens)"

    byte_of = byte_of_char()
    vocab: dict[str, int] = model["vocab"]
    try:
        ranks = {bytes(byte_of[c] for c in token): token_id for token, token_id in vocab.items()}
    except KeyError:
        return None, "a vocabulary entry is not byte-level"
    single = {chr_ for chr_ in byte_of if chr_ in vocab}
    if len(ranks) != len(vocab) or len(single) != 256 or not _merge_ordered(vocab, model.get("merges", []), single):
        return None, "the vocabulary is not merge-ordered"
    merges_only = backend
    if model.get("ignore_merges"):  # check the merges themselves: tiktoken applies them inside every piece
        from tokenizers import Tokenizer

        merges_only = Tokenizer.from_str(json.dumps({**spec, "model": {**model, "ignore_merges": False}}))
    if not _each_token_is_its_own_bpe(merges_only, vocab):
        return None, "a vocabulary entry is not its own BPE"
    added = spec.get("added_tokens") or []
    ids = set(ranks.values())
    if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") or t["id"] in ids
           or unicodedata.normalize("NFC", t["content"]) != t["content"] for t in added):
        return None, "an added token strips, matches whole words only, or shares an id"
    # tokenizers matches non-normalized added tokens before normalized ones, and the longest of several at
    # one place; tiktoken the leftmost, in no set order: alike only when no added token holds another and
    # all are matched in one pass.
    contents = [t["content"] for t in added]
    if len({bool(t.get("normalized")) for t in added}) > 1 or any(
            a != b and a in b for a in contents for b in contents):
        return None, "added tokens overlap, or mix normalized and raw matching"

    encoding = tiktoken.Encoding(
        name="policy", pat_str=pattern, mergeable_ranks=ranks,
        special_tokens={t["content"]: t["id"] for t in added})
    fast = encoding.encode
    allowed = encoding.special_tokens_set  # added tokens split the text wherever they appear, as in encode
    nfc = normalizer is not None

    def plain(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def tiktoken_safe(text: str) -> bool:
        """Whether tiktoken gives ``tokenizer.encode``'s ids for ``text``: UTF-8 encodable, NFC where it normalises."""
        if text.isascii():
            return True
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return not nfc or unicodedata.is_normalized("NFC", text)

    def encode(text: str) -> list[int]:
        if not tiktoken_safe(text):
            return plain(text)
        return fast(text, allowed_special=allowed, disallowed_special=())

    to_numpy = getattr(encoding, "encode_to_numpy", None)

    def to_array(text: str) -> array:
        """``encode``'s ids as an ``array("i")``, straight from tiktoken's buffer: no Python int per id (the
        list costs ~0.7 ms more than this for an 8K-token prompt, its conversion to an array ~0.14 ms)."""
        if to_numpy is None or not tiktoken_safe(text):
            return array("i", encode(text))
        ids = array("i")
        ids.frombytes(to_numpy(text, allowed_special=allowed, disallowed_special=()).tobytes())  # uint32 → int32: ids < 2**31
        return ids

    encode.to_array = to_array  # type: ignore[attr-defined]  (ChatRenderer.encode_array reads it)
    return encode, ""
