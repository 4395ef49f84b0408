"""The offline tiny model: loadable, deterministic, cached, and its tokenizer/chat template behave like Qwen3's."""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from openclaw_rl.embedded import pretrain, tiny_model
from openclaw_rl.embedded.corpus import generate_corpus
from openclaw_rl.embedded.tiny_model import (
    MARKER_FILE,
    MARKUP_TOKENS,
    PRESETS,
    build_tiny_model,
    ensure_tiny_model,
)

FULL = os.environ.get("OPENCLAW_TEST_FULL") == "1"  # full-size rebuilds (scripts/run_full_tests.sh)
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "Weather in Paris?"}


def _call(arguments: dict | str, call_id: str = "c1") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def render(tok, messages: list[dict], **kwargs) -> str:
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


# --- the directory -----------------------------------------------------------------------------------

def test_loads_offline_with_auto_classes(tiny_model_dir: Path, tok) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert isinstance(model, Qwen3ForCausalLM)
    assert model.config.vocab_size == len(tok) == 4105
    assert model.get_input_embeddings().weight.shape == (len(tok), 128)
    assert next(model.parameters()).dtype == torch.float32
    assert model.config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert model.config.pad_token_id == tok.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert model.generation_config.eos_token_id == [tok.eos_token_id, tok.pad_token_id]
    ids = tok("hello world", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))


def test_marker_and_tokenizer_class(tiny_model_dir: Path) -> None:
    marker = json.loads((tiny_model_dir / MARKER_FILE).read_text())
    assert marker == {"format_version": tiny_model.FORMAT_VERSION, "preset": "h128", "seed": 0, "vocab_size": 4105,
                      "openclaw_phase": False}
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    # Both are what transformers 4.57 needs to load a tokenizer saved by transformers 5.
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["additional_special_tokens"] == ["<|im_start|>", "<|im_end|>"]
    assert "extra_special_tokens" not in config


@pytest.fixture(scope="module")
def build(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``build_tiny_model`` as the session model was built (the full suite, OPENCLAW_TEST_FULL=1), or by default
    the same code path with 10 pre-training steps instead of 200, on the 160 chats those steps use instead of
    4800 (rendering and encoding the chats is most of a short build); ``build("ref")`` is the seed-0 reference."""
    def make(name: str, seed: int = 0) -> Path:
        if FULL:
            return build_tiny_model(tmp_path_factory.mktemp(name), "h128", seed=seed)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(pretrain, "pretrain_task_model",
                       functools.partial(pretrain.pretrain_task_model, steps=10, n_chats=160))
            return build_tiny_model(tmp_path_factory.mktemp(name), "h128", seed=seed)

    ref = tiny_model_dir if FULL else make("ref")
    return lambda name, seed=0: ref if name == "ref" else make(name, seed)


def test_rebuild_is_byte_identical(build: Callable[..., Path]) -> None:
    reference, again = build("ref"), build("again")  # build time: scripts/bench_engine.py
    names = sorted(p.name for p in reference.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert {"tokenizer.json", "model.safetensors"} <= set(names)
    for name in names:
        assert (reference / name).read_bytes() == (again / name).read_bytes(), name


def test_seed_changes_weights_not_tokenizer(build: Callable[..., Path]) -> None:
    reference, other = build("ref"), build("s1", seed=1)
    assert (other / "tokenizer.json").read_bytes() == (reference / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (reference / "model.safetensors").read_bytes()


def test_ensure_reuses_the_cached_build(tiny_model_dir: Path) -> None:
    stamp = (tiny_model_dir / MARKER_FILE).stat().st_mtime_ns
    assert ensure_tiny_model("h128", cache_dir=tiny_model_dir.parent) == tiny_model_dir
    assert (tiny_model_dir / MARKER_FILE).stat().st_mtime_ns == stamp
    # no leftovers of this model's build; the cache is shared: other workers may be building other models
    # in it right now (`local` in the learning tests), each in its own `.<name>.*.tmp` (and `<name>.lock`)
    ours = {f"{tiny_model_dir.name}.lock"}
    assert not [p.name for p in tiny_model_dir.parent.iterdir()
                if p.name in ours or p.name.startswith(f".{tiny_model_dir.name}.")]


def fake_build(builds: list[str], release: threading.Event | None = None) -> Callable[..., Path]:
    """A stand-in for ``build_tiny_model``: records the call, waits for ``release`` if given, writes the marker."""
    def build(out_dir: Path, preset: str, seed: int, **_: object) -> Path:
        builds.append(out_dir.name)
        if release is not None:
            assert release.wait(60), "never released"
        (out_dir / MARKER_FILE).write_text(json.dumps({"preset": preset, "seed": seed}))
        return out_dir
    return build


def test_a_second_caller_waits_for_the_running_build_and_uses_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `local`s (or test workers) at once: one builds; the other waits on its lock, then uses its model."""
    builds: list[str] = []
    release, second_waits_or_builds = threading.Event(), threading.Event()
    build = fake_build(builds, release)

    def counted(*args: object, **kwargs: object) -> Path:
        if builds:  # a second build started
            second_waits_or_builds.set()
        return build(*args, **kwargs)

    monkeypatch.setattr(tiny_model, "build_tiny_model", counted)
    results: dict[str, Path] = {}
    first = threading.Thread(target=lambda: results.update(first=ensure_tiny_model("h64", cache_dir=tmp_path)))
    first.start()
    while not builds:  # the first caller holds the lock and builds
        assert first.is_alive()
        time.sleep(0.005)
    second_log: list[str] = []

    def log(line: str) -> None:
        second_log.append(line)
        second_waits_or_builds.set()

    second = threading.Thread(target=lambda: results.update(
        second=ensure_tiny_model("h64", cache_dir=tmp_path, log=log)))
    second.start()
    assert second_waits_or_builds.wait(60)
    release.set()
    first.join(60)
    second.join(60)
    target = tiny_model.tiny_model_path("h64", tmp_path)
    assert len(builds) == 1, builds  # the second caller did not build a copy of its own
    assert second_log[0] == f"another process is building the tiny model {target.name}; waiting for it"
    assert results == {"first": target, "second": target}
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temp directory, no lock file left


def test_a_failed_build_leaves_nothing_and_the_next_caller_builds(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(out_dir: Path, *args: object, **kwargs: object) -> Path:
        (out_dir / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt  # Ctrl-C during a build

    monkeypatch.setattr(tiny_model, "build_tiny_model", broken)
    with pytest.raises(KeyboardInterrupt):
        ensure_tiny_model("h64", cache_dir=tmp_path)
    target = tiny_model.tiny_model_path("h64", tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.name != f"{target.name}.lock"] == []
    builds: list[str] = []
    monkeypatch.setattr(tiny_model, "build_tiny_model", fake_build(builds))
    assert ensure_tiny_model("h64", cache_dir=tmp_path) == target and len(builds) == 1
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_ensure_keeps_the_winner_when_it_loses_the_race(tiny_model_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / f"tiny-h64-s0-v{tiny_model.FORMAT_VERSION}"

    def slow_build(out_dir: Path, preset: str, seed: int, **_: object) -> Path:
        # While "we" build, another process finishes first and renames its copy into place.
        (out_dir / MARKER_FILE).write_text("loser")
        target.mkdir()
        for path in tiny_model_dir.iterdir():
            (target / path.name).write_bytes(path.read_bytes())
        return out_dir

    monkeypatch.setattr(tiny_model, "build_tiny_model", slow_build)
    assert ensure_tiny_model("h64", cache_dir=tmp_path) == target
    assert (target / MARKER_FILE).read_bytes() == (tiny_model_dir / MARKER_FILE).read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_unknown_preset_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="h128"):
        ensure_tiny_model("h100", cache_dir=tmp_path)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_are_valid_qwen3_configs(preset: str) -> None:
    kwargs = PRESETS[preset]
    assert kwargs["num_attention_heads"] * kwargs["head_dim"] == kwargs["hidden_size"]
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=4105, **kwargs))
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied
    assert PRESETS["h128"] == {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                               "max_position_embeddings": 32768, "tie_word_embeddings": True}


def test_corpus_is_seeded_and_sized() -> None:
    docs = generate_corpus(0)
    assert 1_000_000 <= sum(len(d.encode()) for d in docs) <= 2_500_000
    assert docs == generate_corpus(0)
    assert docs[:50] != generate_corpus(1)[:50]


# --- tokens ------------------------------------------------------------------------------------------

def test_special_token_layout(tok) -> None:
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", *MARKUP_TOKENS])
    assert ids == list(range(4096, 4105))
    assert set(tok.all_special_ids) == {4096, 4097, 4098}
    assert tok.encode("<|im_end|>", add_special_tokens=False) == [4098]
    assert tok.bos_token is None


def test_markup_tokens_are_single_and_survive_skip_special(tok) -> None:
    for token in MARKUP_TOKENS:
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] not in tok.all_special_ids, token
    text = '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == text.removesuffix("<|im_end|>")


def test_natural_text_round_trips(tok) -> None:
    text = "Hello, wörld! 🙂 def f(x):\n    return x * 2  # 你好"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


# --- chat template -----------------------------------------------------------------------------------

def test_full_conversation_renders_like_qwen3(tok) -> None:
    messages = [
        SYSTEM, USER,
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
         "tool_calls": [_call({"city": "Paris"}), _call('{"city": "Lyon"}', "c2")]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"t": 20}'},
        {"role": "tool", "tool_call_id": "c2", "content": '{"t": 21}'},
        {"role": "assistant", "content": "<think>\nCompare.\n</think>\n\nParis 20, Lyon 21."},
    ]
    assert render(tok, messages) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"t": 20}\n</tool_response>\n'
        '<tool_response>\n{"t": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n<think>\nCompare.\n</think>\n\nParis 20, Lyon 21.<|im_end|>\n"
    )


def test_tools_block_goes_into_the_system_message(tok) -> None:
    text = render(tok, [SYSTEM, USER], tools=TOOLS)
    head = "<|im_start|>system\nYou are terse.\n\n# Tools\n\n"
    assert text.startswith(head)
    assert f"\n<tools>\n{json.dumps(TOOLS[0], ensure_ascii=False)}\n</tools>\n" in text
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' in text
    assert text.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n")
    assert render(tok, [USER], tools=TOOLS).startswith("<|im_start|>system\n# Tools\n\n")


def test_string_and_dict_arguments_render_the_same(tok) -> None:
    as_dict = render(tok, [USER, {"role": "assistant", "content": "", "tool_calls": [_call({"city": "Paris"})]}])
    as_str = render(tok, [USER, {"role": "assistant", "content": "", "tool_calls": [_call('{"city": "Paris"}')]}])
    assert as_dict == as_str


def test_reasoning_before_the_last_user_query_is_dropped(tok) -> None:
    messages = [USER, {"role": "assistant", "content": "<think>\nold\n</think>\n\nSunny."},
                {"role": "user", "content": "And Lyon?"}, {"role": "assistant", "content": "Rainy."}]
    text = render(tok, messages)
    assert "old" not in text
    assert "<|im_start|>assistant\nSunny.<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nRainy.<|im_end|>\n")


def test_generation_prompt_and_enable_thinking(tok) -> None:
    assert render(tok, [SYSTEM, USER], add_generation_prompt=True).endswith("<|im_end|>\n<|im_start|>assistant\n")
    off = render(tok, [USER], add_generation_prompt=True, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not render(tok, [USER]).endswith("assistant\n")


def test_non_string_content_renders_empty(tok) -> None:
    parts = {"role": "user", "content": [{"type": "text", "text": "hidden"}]}
    assert render(tok, [parts]) == "<|im_start|>user\n<|im_end|>\n"


PLAIN = {"role": "assistant", "content": "It is sunny."}
REASONED = {"role": "assistant", "content": "<think>\nlook it up\n</think>\n\nIt is sunny."}
CALLING = {"role": "assistant", "content": "", "tool_calls": [_call({"city": "Paris"})]}


# With thinking disabled the model never writes reasoning, so (False, REASONED) is not a real pairing.
@pytest.mark.parametrize(("thinking", "reply"), [(None, PLAIN), (None, REASONED), (None, CALLING),
                                                 (False, PLAIN), (False, CALLING)])
@pytest.mark.parametrize("history", [[SYSTEM, USER], [USER, CALLING, {"role": "tool", "content": "sunny"}]])
def test_single_turn_prompt_is_a_prefix_of_the_full_text(tok, history, thinking, reply) -> None:
    extra = {} if thinking is None else {"enable_thinking": thinking}
    prompt = render(tok, history, tools=TOOLS, add_generation_prompt=True, **extra)
    full = render(tok, [*history, reply], tools=TOOLS, **extra)
    assert full.startswith(prompt)
    assert full.endswith("<|im_end|>\n")
