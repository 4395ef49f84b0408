"""Build (once) and cache a tiny random Qwen3 checkpoint with its own offline BPE tokenizer.

The embedded CPU stack and the test suite need a real `transformers` model directory, loadable with
`AutoTokenizer` / `AutoModelForCausalLM`, on machines that cannot download anything. Everything here
is generated from seeds, so two builds are byte-identical and the result can be cached per
(preset, seed, format version) instead of being committed.

Torch and transformers are imported inside the build functions: a cache hit in `ensure_tiny_model`
costs no heavy imports.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from openclaw_rl.embedded.corpus import generate_corpus

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# Bump when the files a build writes change (corpus, template, init, pre-training), so that cached
# directories from an older version are not reused.
FORMAT_VERSION = 6
# Bump when only the OpenClaw variant's second pre-training phase changes (its data or budget): the plain
# model and the tokenizer stay cached. 2: instructed OpenClaw-shaped chats train the instructed opener
# (1 trained every one of them towards the uniform mix) and OPD hints sit after the internal-context block;
# 3: more of those hinted chats and twice the rounds (24 x 6 steps of 6 tails).
OPENCLAW_PHASE_VERSION = 3
MARKER_FILE = "openclaw_tiny.json"
CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")

BPE_VOCAB_SIZE = 4096
# Qwen's layout: specials right after the BPE vocabulary, <|im_end|> is eos, <|endoftext|> pads.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Non-special, as in Qwen3, so decode(skip_special_tokens=True) keeps them and parsers can see them.
MARKUP_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
EOS_TOKEN, PAD_TOKEN = "<|im_end|>", "<|endoftext|>"
# Qwen2/3 pre-tokenisation: contractions, letter runs, single digits, punctuation runs, whitespace.
_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# The tokenizer does not depend on the model seed, so every checkpoint shares one vocabulary.
_CORPUS_SEED = 0

MAX_POSITIONS = 32768  # OpenClaw's prompt alone is ~15K tokens (51K characters); room for a long session
_SHARED = {"num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": MAX_POSITIONS,
           "tie_word_embeddings": True}
# Qwen3Config keyword arguments per preset. Most parameters sit in the tied 4105 x hidden embedding.
PRESETS: dict[str, dict] = {
    "h64": {"hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2, "head_dim": 16, **_SHARED},
    "h128": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "head_dim": 32, **_SHARED},
    "h256": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "head_dim": 64, **_SHARED},
}
DEFAULT_PRESET = "h128"


def build_tokenizer(out_dir: Path) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on the synthetic corpus, attach the chat template and save it to `out_dir`.

    The saved config is made loadable by transformers 4.57 as well (`make_tokenizer_config_portable`).
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    docs = generate_corpus(_CORPUS_SEED)
    tok.train_from_iterator(docs, trainer, length=len(docs))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])

    # Listing the chat markers as additional specials puts them in `all_special_ids`, as in Qwen's tokenizer.
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                        bos_token=None, unk_token=None, model_max_length=MAX_POSITIONS,
                                        additional_special_tokens=["<|im_start|>", EOS_TOKEN])
    tokenizer.chat_template = CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")
    out_dir = Path(out_dir)
    tokenizer.save_pretrained(out_dir)
    make_tokenizer_config_portable(out_dir)
    return tokenizer


def make_tokenizer_config_portable(model_dir: Path) -> None:
    """Rewrite a transformers-5 `tokenizer_config.json` in place so transformers 4.57 loads it too.

    transformers 5 saves `tokenizer_class: TokenizersBackend` (unknown to 4.x) and writes the extra
    special tokens as an `extra_special_tokens` list (4.x expects a dict there and crashes); both
    versions read `PreTrainedTokenizerFast` and an `additional_special_tokens` list. Call this after
    every `tokenizer.save_pretrained` made with transformers 5.
    """
    path = Path(model_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = config.get("extra_special_tokens")
    if isinstance(extra, list):
        del config["extra_special_tokens"]
        config["additional_special_tokens"] = extra
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build_tiny_model(out_dir: Path, preset: str = DEFAULT_PRESET, seed: int = 0, *, openclaw: bool = False,
                     log: Callable[[str], None] | None = None) -> Path:
    """Write tokenizer + a briefly pre-trained fp32 `Qwen3ForCausalLM` to `out_dir`; same seed, same bytes.

    `openclaw=True` adds the second pre-training phase on OpenClaw-shaped long chats
    (``pretrain.pretrain_openclaw_phase``, minutes instead of seconds; `log` gets its progress lines):
    the variant ``openclaw-rl local`` serves to OpenClaw. The test fixtures use the cheap plain build.
    The marker file is written last, so its presence means the directory is complete.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from openclaw_rl.embedded.pretrain import pretrain_task_model

    if preset not in PRESETS:
        raise ValueError(f"unknown tiny-model preset {preset!r}; choose one of {sorted(PRESETS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    eos_id, pad_id = tokenizer.convert_tokens_to_ids([EOS_TOKEN, PAD_TOKEN])
    config = Qwen3Config(vocab_size=len(tokenizer), eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None,
                         dtype="float32", **PRESETS[preset])
    # Seed a forked RNG so building a model never perturbs the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32)
        # --- Pre-training --------------------------------------------------------------------------
        # Seconds of seeded supervised training on the synthetic preference task (`task.py`): the
        # model learns the chat format, answers in a uniformly random style, and follows style
        # instructions (which the OPD teacher's hints rely on). Same seed and thread count: same bytes.
        pretrain_task_model(model, tokenizer, seed=seed)
        if openclaw:
            from openclaw_rl.embedded.pretrain import DEFAULT_CHATS, pretrain_openclaw_phase
            from openclaw_rl.embedded.task import pretraining_chats

            pretrain_openclaw_phase(model, tokenizer, seed=seed, short_chats=pretraining_chats(DEFAULT_CHATS, seed),
                                    log=log)

    model.generation_config.eos_token_id = [eos_id, pad_id]
    model.generation_config.pad_token_id = pad_id
    with quiet_progress_bars():
        model.save_pretrained(out_dir)
    marker = {"format_version": FORMAT_VERSION, "preset": preset, "seed": seed, "vocab_size": len(tokenizer),
              "openclaw_phase": OPENCLAW_PHASE_VERSION if openclaw else False}
    (out_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return out_dir


@contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """Silence transformers' progress bars, then restore them: the one-shard "Writing model shards" bar of
    save_pretrained, and the "Loading weights" bar of from_pretrained (a tiny model loads in milliseconds,
    so the bar is only noise: three ``\r`` redraws in every log of ``openclaw-rl local``)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def default_cache_dir() -> Path:
    """`$OPENCLAW_RL_CACHE`, else `~/.cache/openclaw-rl`."""
    env = os.environ.get("OPENCLAW_RL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "openclaw-rl"


def tiny_model_path(preset: str = DEFAULT_PRESET, cache_dir: Path | None = None, seed: int = 0, *,
                    openclaw: bool = False) -> Path:
    """Where `ensure_tiny_model` keeps (preset, seed, variant); complete once it holds `MARKER_FILE`."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / f"tiny-{preset}{f'-openclaw{OPENCLAW_PHASE_VERSION}' if openclaw else ''}-s{seed}-v{FORMAT_VERSION}"


def ensure_tiny_model(preset: str = DEFAULT_PRESET, cache_dir: Path | None = None, seed: int = 0, *,
                      openclaw: bool = False, log: Callable[[str], None] | None = None) -> Path:
    """Return the cached tiny-model directory for (preset, seed, variant), building it on first use.

    `openclaw=True` is the variant pre-trained on OpenClaw-shaped prompts too (see `build_tiny_model`);
    its build takes minutes, so `log` (if given) is told when a build starts and how it goes.

    One build per directory at a time: a builder holds ``<name>.lock`` beside it (``_build_lock``), so a
    second caller (two ``openclaw-rl local`` runs, two test workers) waits for the first and then uses its
    model instead of building its own copy (``_build_if_missing`` finds it). The lock file is removed
    after a build.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny-model preset {preset!r}; choose one of {sorted(PRESETS)}")
    target = tiny_model_path(preset, cache_dir, seed, openclaw=openclaw)
    if (target / MARKER_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(target, log) as lock:
        _build_if_missing(preset, cache_dir, seed, openclaw=openclaw, log=log)
        # Safe while held: whoever opens a new lock file after this, or waits on this one, finds the marker.
        lock.unlink(missing_ok=True)
    return target


@contextmanager
def _build_lock(target: Path, log: Callable[[str], None] | None) -> Iterator[Path]:
    """Hold ``<target>.lock`` exclusively (``flock``; released when the holder exits or dies), telling
    `log` when another process holds it and this one waits."""
    path = target.with_name(target.name + ".lock")
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if log is not None:
                log(f"another process is building the tiny model {target.name}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield path


def _build_if_missing(preset: str = DEFAULT_PRESET, cache_dir: Path | None = None, seed: int = 0, *,
                      openclaw: bool = False, log: Callable[[str], None] | None = None) -> Path:
    """``ensure_tiny_model`` under its lock: the directory, built if it is not there (yet).

    `openclaw=True` is the variant pre-trained on OpenClaw-shaped prompts too (see `build_tiny_model`);
    its build takes minutes, so `log` (if given) is told when a build starts and how it goes.

    The build goes into a private temp directory, atomically renamed into place (a killed build leaves no
    half model); should a caller that holds no lock (an older version) win the rename, its copy is kept
    and ours discarded (the builds are identical).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny-model preset {preset!r}; choose one of {sorted(PRESETS)}")
    target = tiny_model_path(preset, cache_dir, seed, openclaw=openclaw)
    root = target.parent
    if (target / MARKER_FILE).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=root))
    try:
        from openclaw_rl.embedded.shipped_model import copy_shipped, shipped_copy

        shipped = shipped_copy(target.name)
        if shipped is not None:  # the package carries this build (the OpenClaw variant): no minutes of training
            copy_shipped(shipped, tmp)
        else:
            if log is not None:
                log(f"building the tiny model {target.name} (once; cached in {root})")
            build_tiny_model(tmp, preset, seed, openclaw=openclaw, log=log)
        # mkdtemp (and the safetensors writer) make things private; a cache should be readable as usual.
        tmp.chmod(0o755)
        for path in tmp.iterdir():
            path.chmod(0o644)
        try:
            os.rename(tmp, target)
        except OSError as err:  # the target already exists and is not empty
            if not (target / MARKER_FILE).is_file():
                raise RuntimeError(f"{target} exists but is incomplete (no {MARKER_FILE}); delete it") from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
