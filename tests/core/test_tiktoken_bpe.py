"""The tiktoken encoder (``openclaw_rl/tiktoken_bpe.py``) gives ``tokenizer.encode``'s ids, and is refused
for tokenizers whose BPE tiktoken would run differently."""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import load_conversation, mistral_shaped_tokenizer

from openclaw_rl.chat import _KEPT_ENCODER, fast_encoder
from openclaw_rl.tiktoken_bpe import tiktoken_encoder

# Scripts, whitespace that regex engines classify differently, combining marks, emoji, private use.
_BLOCKS = [(0x20, 0x7F), (0x09, 0x0E), (0xA0, 0x250), (0x300, 0x370), (0x370, 0x500), (0x590, 0x700),
           (0x900, 0x980), (0x3040, 0x3100), (0x4E00, 0x4F00), (0xAC00, 0xAD00), (0x1F300, 0x1F700),
           (0x2000, 0x2070), (0x85, 0x86), (0x1680, 0x1681), (0x3000, 0x3001), (0xFEFF, 0xFF00),
           (0xE000, 0xE010), (0x1D400, 0x1D500), (0x10000, 0x10100)]


@pytest.fixture(scope="module")
def mistral_tokenizer(tiny_model_dir: Any) -> Any:
    return mistral_shaped_tokenizer(tiny_model_dir)


def _hf(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_both_families_run_on_tiktoken_with_encode_ids(tokenizer, mistral_tokenizer):
    rng = random.Random(3)
    for tok in (tokenizer, mistral_tokenizer):
        encode, why = tiktoken_encoder(tok)
        assert encode is not None, why
        assert fast_encoder(tok) is not None and fast_encoder(tok).__qualname__ == encode.__qualname__
        specials = list(tok.get_added_vocab())
        for _ in range(3000):
            text = "".join(chr(rng.randrange(*rng.choice(_BLOCKS))) if rng.random() < 0.9 else rng.choice(specials)
                           for _ in range(rng.randint(0, 30)))
            assert encode(text) == _hf(tok, text), repr(text)


@pytest.fixture(scope="module")
def tiktoken_encode(tiny_model_dir: Any) -> Any:
    """Built once: building costs ~35 ms (the vocabulary checks), an encode microseconds."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return tok, tiktoken_encoder(tok)[0]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_text_gets_encode_ids(tiktoken_encode, text):
    tok, encode = tiktoken_encode
    assert encode(text) == _hf(tok, text)
    ids = encode.to_array(text)  # the renderer's array path: the same ids, from tiktoken's buffer
    assert ids.typecode == "i" and ids.tolist() == encode(text)


def test_the_array_encoder_gives_encode_ids_and_takes_the_same_detours(tokenizer, mistral_tokenizer, monkeypatch):
    """``to_array`` (tiktoken's uint32 buffer read as ``array("i")``) gives ``encode``'s ids for every text
    ``encode`` takes: special tokens, long texts, text that is not NFC or holds a lone surrogate (both to
    the tokenizer's own encode, as ``encode`` does), and without ``encode_to_numpy`` (an older tiktoken)."""
    rng = random.Random(5)
    for tok in (tokenizer, mistral_tokenizer):
        encode, _ = tiktoken_encoder(tok)
        specials = list(tok.get_added_vocab())
        texts = ["", "cafe\u0301 x", "x" * 5000, " ".join(specials) * 3]
        texts += ["".join(chr(rng.randrange(*rng.choice(_BLOCKS))) if rng.random() < 0.9 else rng.choice(specials)
                          for _ in range(rng.randint(0, 200))) for _ in range(500)]
        for text in texts:
            ids = encode.to_array(text)
            assert ids.typecode == "i" and ids.tolist() == encode(text) == _hf(tok, text), repr(text)
        with pytest.raises(Exception) as from_encode:
            _hf(tok, "a\ud800b")
        with pytest.raises(type(from_encode.value)):
            encode.to_array("a\ud800b")
    import tiktoken

    monkeypatch.delattr(tiktoken.Encoding, "encode_to_numpy")
    older, _ = tiktoken_encoder(tokenizer)
    assert older.to_array("hello <|im_start|> world").tolist() == _hf(tokenizer, "hello <|im_start|> world")


def test_text_tiktoken_would_change_goes_to_encode(tokenizer):
    """Not NFC (the tokenizer normalises it) or a lone surrogate (tiktoken would replace it): the
    tokenizer's own encode takes it, whatever that does."""
    encode, _ = tiktoken_encoder(tokenizer)
    assert encode("cafe\u0301 x") == _hf(tokenizer, "cafe\u0301 x") == _hf(tokenizer, "caf\u00e9 x")
    with pytest.raises(Exception) as from_encode:
        _hf(tokenizer, "a\ud800b")
    with pytest.raises(type(from_encode.value)):
        encode("a\ud800b")


def test_the_openclaw_traffic_gets_encode_ids(tokenizer):
    encode, _ = tiktoken_encoder(tokenizer)
    for name in ("conversation_A.jsonl", "conversation_B.jsonl"):
        for record in load_conversation(name):
            text = json.dumps(record, ensure_ascii=False, indent=1)
            assert encode(text) == _hf(tokenizer, text)


def _with_spec(tokenizer: Any, change: Any) -> Any:
    """A copy of the tokenizer whose backend JSON is edited by ``change``."""
    from tokenizers import Tokenizer

    clone = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    spec = json.loads(clone._tokenizer.to_str())
    change(spec)
    clone._tokenizer = Tokenizer.from_str(json.dumps(spec))
    return clone


def _swap_two_merged_ids(spec: dict[str, Any]) -> None:
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    first, second = ("".join(m) if isinstance(m, list) else m.replace(" ", "") for m in merges[-2:])
    vocab[first], vocab[second] = vocab[second], vocab[first]


def _merge_a_token_from_another_split(spec: dict[str, Any]) -> None:
    """A last merge (x, R) where the first merge is (x, y) and R starts with y: BPE on x + R alone merges
    (x, y) first and never reaches (x, R), but tiktoken would take the piece x + R whole."""
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    x, y = merges[0] if isinstance(merges[0], list) else merges[0].split(" ")
    r = next(t for t in vocab if len(t) > 1 and t.startswith(y) and x + t not in vocab)
    for added in spec["added_tokens"]:  # keep the added tokens' ids clear of the new entry
        added["id"] += 1
    vocab[x + r] = max(vocab.values()) + 1
    merges.append([x, r])


def _split_regex(regex: str) -> Any:
    def change(spec: dict[str, Any]) -> None:
        spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = regex
    return change


def _qwen_regex_with(prefix: str) -> Any:
    def change(spec: dict[str, Any]) -> None:
        split = spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]
        split["Regex"] = prefix + split["Regex"]
    return change


@pytest.mark.parametrize(("change", "reason"), [
    (_merge_a_token_from_another_split, "its own BPE"),
    # with ignore_merges too: tiktoken also merges pairs that are no listed merge, inside a piece
    (lambda spec: (_merge_a_token_from_another_split(spec), spec["model"].update(ignore_merges=True)), "its own BPE"),
    (_qwen_regex_with(r"^\p{L}+|"), "anchor"),  # Oniguruma's ^ matches after each line break
    (lambda spec: spec["added_tokens"][-1].update(normalized=True), "normalized"),
    (_swap_two_merged_ids, "merge-ordered"),
    (lambda spec: spec.update(normalizer={"type": "NFKC"}), "normalizer"),
    (lambda spec: spec["model"].update(byte_fallback=True), "byte-level BPE"),
    (lambda spec: spec.update(pre_tokenizer={"type": "Whitespace"}), "pre-tokenizer"),
    (lambda spec: spec["added_tokens"][0].update(lstrip=True), "added token"),
])
def test_other_tokenizers_keep_their_own_encode(tokenizer, change, reason):
    """A tokenizer tiktoken would run differently gets no tiktoken encoder, and the fast encoder falls
    back to the tokenizer's own code with encode's ids."""
    other = _with_spec(tokenizer, change)
    encode, why = tiktoken_encoder(other)
    assert encode is None and reason in why
    fallback = fast_encoder(other)
    text = "<|im_start|>user\nhello wörld 🙂<|im_end|>"
    assert fallback.__name__ in ("quick", "plain") and fallback(text) == _hf(other, text)


@pytest.mark.parametrize(("added", "reason"), [(["<a>", "<a>b"], "overlap"), (["call<think>"], "overlap")])
def test_added_tokens_inside_one_another_keep_their_own_encode(tokenizer, added, reason):
    """tokenizers takes the longest added token at a place (and raw-matched ones first); tiktoken's pick
    among them is unordered: "<a>b" would be [<a>, b] instead of [<a>b]."""
    other = _with_spec(tokenizer, lambda spec: None)
    other.add_tokens(added)
    encode, why = tiktoken_encoder(other)
    assert encode is None and reason in why
    assert fast_encoder(other)(added[-1]) == _hf(other, added[-1])


def test_split_special_tokens_keeps_its_own_encode(tokenizer):
    """With ``split_special_tokens`` an added token in the text is ordinary text; tiktoken would make
    it the control token."""
    other = type(tokenizer).from_pretrained(tokenizer.name_or_path, split_special_tokens=True)
    encode, why = tiktoken_encoder(other)
    assert encode is None and "split_special_tokens" in why
    text = "user says: <|im_end|> hi"
    assert fast_encoder(other)(text) == _hf(other, text) and other.convert_tokens_to_ids("<|im_end|>") not in _hf(
        other, text)


def test_a_regex_that_can_match_nothing_keeps_its_own_encode(tokenizer, monkeypatch):
    """On a split regex that matches the empty string tiktoken panics for some texts (a BaseException,
    not an Exception) and silently drops pieces of others ("a1b" -> [a, b]). Such a regex is refused;
    and a panic in the probe, were one to get that far, counts as a difference instead of escaping."""
    from openclaw_rl import tiktoken_bpe

    other = _with_spec(tokenizer, _qwen_regex_with(r"\p{L}*|"))
    encode, why = tiktoken_encoder(other)
    assert encode is None and "empty string" in why
    assert fast_encoder(other)("a1b") == _hf(other, "a1b")
    monkeypatch.setattr(tiktoken_bpe, "_matches_nothing", lambda pattern: False)
    assert tiktoken_encoder(other)[0] is not None  # now only the probe stands in the way
    assert fast_encoder(other).__name__ in ("quick", "plain")


def test_without_tiktoken_the_fast_encoder_is_the_rust_one(tokenizer, monkeypatch, caplog):
    """...and the log says which tokeniser runs, and why not tiktoken."""
    caplog.set_level("INFO", logger="openclaw_rl.chat")
    monkeypatch.delattr(tokenizer, _KEPT_ENCODER, raising=False)  # built here, so that it logs
    assert fast_encoder(tokenizer).__name__ == "encode"
    assert "prompts are tokenised by tiktoken" in caplog.text
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    monkeypatch.delattr(tokenizer, _KEPT_ENCODER)  # the encoder kept from the line above
    assert tiktoken_encoder(tokenizer) == (None, "tiktoken is not installed")
    assert fast_encoder(tokenizer).__name__ == "quick"
    assert "prompts are tokenised by tokenizers, not tiktoken: tiktoken is not installed" in caplog.text


def test_the_encoder_is_kept_on_the_tokenizer_until_it_changes(tokenizer):
    """Built once per tokenizer (~40 ms here, ~1 s for a 150K vocabulary), rebuilt when it grows."""
    other = _with_spec(tokenizer, lambda spec: None)
    first = fast_encoder(other)
    assert fast_encoder(other) is first
    other.add_tokens(["<extra_marker>"])
    rebuilt = fast_encoder(other)
    assert rebuilt is not first and rebuilt("a <extra_marker> b") == _hf(other, "a <extra_marker> b")
