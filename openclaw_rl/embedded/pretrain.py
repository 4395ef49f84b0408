"""A short, seeded supervised pre-training of the tiny model on the synthetic preference task.

A random tiny Qwen3 emits noise, and noise has no "style" a user could prefer, so the embedded stack
could not show learning. `build_tiny_model` therefore runs this for a few seconds: afterwards the model
answers requests in a uniformly random style, and in the instructed style when asked (see `task.py`).
Only the final assistant message of each chat is trained, tokenised exactly as the proxy would see it:
the prompt is the chat template's generation prompt, the target is what follows it, so the model learns
the empty ``<think>`` block that the template expects and the ``<|im_end|>`` that stops sampling.

Deterministic: one `torch.Generator` and one `random.Random` per call, no data-loader workers, fixed
batch order; CPU kernels at a fixed thread count give the same bytes twice.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

IGNORE = -100


@dataclass(frozen=True, slots=True)
class FreeChoice:
    """A choice the data leaves to chance: for chats where `applies(chat)` holds, the first answer
    token that is a key of `target` is trained towards the distribution `target` (token → probability)
    instead of the one token the chat happens to have.

    Sampled one-hot targets make the fitted choice distribution as noisy as the last few batches; a
    soft target gives the exact, prompt-independent distribution (here: uniform over styles).
    """

    target: dict[int, float]
    applies: Callable[[list[dict[str, Any]]], bool]


@dataclass(frozen=True, slots=True)
class PretrainStats:
    steps: int
    seconds: float
    first_loss: float
    last_loss: float


def encode_chat(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], int]:
    """(ids, prompt_len): the generation prompt of all but the last message, then that message's tokens.

    The two parts are encoded separately, as the proxy encodes the prompt and the engine samples the
    reply; the trailing newline after ``<|im_end|>`` is not part of any reply and is dropped. For many
    chats use ``encode_chats``, which sets the renderer up once.
    """
    return encode_chats(tokenizer, [messages])[0]


def encode_chats(tokenizer: Any, chats: list[list[dict[str, Any]]]) -> list[tuple[list[int], int]]:
    """``encode_chat`` of each chat, rendered and encoded as the proxy does it (``ChatTemplateText``,
    ``fast_encoder``, built once for all the chats: their start-up probe costs a few renders). The same
    ids as ``apply_chat_template`` plus ``encode``, a fifth less CPU (2,400 chats: 2.43 -> 1.94 s)."""
    from openclaw_rl.chat import fast_encoder
    from openclaw_rl.chat_template import ChatTemplateText

    render, encode = ChatTemplateText(tokenizer), fast_encoder(tokenizer)
    out = []
    for messages in chats:
        prompt = render(messages[:-1], add_generation_prompt=True)
        full = render(messages, add_generation_prompt=False)
        if not full.startswith(prompt):
            raise ValueError("the chat template's generation prompt is not a prefix of the rendered chat")
        prompt_ids = encode(prompt)
        out.append((prompt_ids + encode(full[len(prompt):].removesuffix("\n")), len(prompt_ids)))
    return out


def _free_position(ids: list[int], prompt_len: int, chat: list[dict[str, Any]], free: FreeChoice | None) -> int:
    """Index of the token trained towards `free.target` in this chat, or -1."""
    if free is None or not free.applies(chat):
        return -1
    return next((j for j in range(prompt_len, len(ids)) if ids[j] in free.target), -1)


def _batches(encoded: list[tuple[list[int], int]], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Index batches of similar length (less padding, so fewer wasted FLOPs), in a seeded order."""
    order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i][0]), i))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def _target_loss(model: Any, input_ids: Any, mask: Any, labels: Any, weights: Any, free: Any,
                 soft: tuple[Any, Any] | None) -> Any:
    """Weighted mean next-token cross-entropy over the target positions only.

    The tied 4105-row output head dominates a tiny model's cost, and targets are a third of the tokens,
    so the head runs on the gathered target positions instead of on every position (HF's ``labels=``).
    Positions flagged in `free` use the soft target `soft = (token ids, probabilities)` instead.
    """
    import torch

    hidden = model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    wanted = labels[:, 1:] != IGNORE
    logp = torch.log_softmax(model.lm_head(hidden[:, :-1][wanted]).float(), dim=-1)
    losses = -logp.gather(1, labels[:, 1:][wanted].unsqueeze(1)).squeeze(1)
    if soft is not None:
        ids, probs = soft
        losses = torch.where(free[:, 1:][wanted], -(logp[:, ids] * probs).sum(-1), losses)
    w = weights[:, 1:][wanted]
    return (losses * w).sum() / w.sum()


def pretrain(model: Any, tokenizer: Any, chats: list[list[dict[str, Any]]], *, steps: int, seed: int,
             batch_size: int = 32, lr: float = 3e-3, warmup: int = 20, head_tokens: int = 6,
             head_weight: float = 4.0, free_choice: FreeChoice | None = None, log_every: int = 0) -> PretrainStats:
    """Train `model` in place on the final assistant message of each chat (AdamW, warmup + cosine).

    It runs on one thread: the ops of a 1M-parameter model are too small to gain much from more, a
    busy machine makes multi-threaded small ops collapse (OpenMP barriers wait for descheduled
    threads: 3x slower than one thread with four busy processes on two cores), and one thread makes
    the result independent of the machine's core count.

    The first `head_tokens` target tokens (the empty think block and the style opener) weigh
    `head_weight` times more: the style decision is one token among ~35 of copied request text, and
    it is the behaviour that has to be right within the few seconds of training.

    The chats are cycled in length-bucketed batches for `steps` optimizer steps; the model is left in
    eval mode. Returns timing and the first / last batch loss so callers can log the fit.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _pretrain(model, tokenizer, chats, steps=steps, seed=seed, batch_size=batch_size, lr=lr,
                         warmup=warmup, head_tokens=head_tokens, head_weight=head_weight,
                         free_choice=free_choice, log_every=log_every)
    finally:
        torch.set_num_threads(threads)


def _pretrain(model: Any, tokenizer: Any, chats: list[list[dict[str, Any]]], *, steps: int, seed: int,
              batch_size: int, lr: float, warmup: int, head_tokens: int, head_weight: float,
              free_choice: FreeChoice | None, log_every: int) -> PretrainStats:
    import torch

    started = time.perf_counter()
    rng = random.Random(seed)
    encoded = encode_chats(tokenizer, chats)
    free_at = [_free_position(ids, prompt_len, chat, free_choice) for (ids, prompt_len), chat in zip(encoded, chats)]
    soft = None
    if free_choice is not None:
        soft = (torch.tensor(list(free_choice.target)), torch.tensor(list(free_choice.target.values())))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.02 + 0.49 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    batches: list[list[int]] = []
    first = last = float("nan")
    for step in range(steps):
        if not batches:
            batches = _batches(encoded, batch_size, rng)
        batch = batches.pop()
        loss = _padded_loss(model, tokenizer, [encoded[i] for i in batch], [free_at[i] for i in batch], soft,
                            head_tokens, head_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        last = float(loss.detach())
        if step == 0:
            first = last
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"pretrain step {step:4d} loss {last:.4f} ({time.perf_counter() - started:.1f}s)")
    model.eval()
    return PretrainStats(steps, time.perf_counter() - started, first, last)


DEFAULT_CHATS = 4800
DEFAULT_STEPS = 200


def pretrain_task_model(model: Any, tokenizer: Any, *, seed: int, steps: int = DEFAULT_STEPS,
                        n_chats: int = DEFAULT_CHATS, batch_size: int = 16, lr: float | None = None,
                        log_every: int = 0) -> PretrainStats:
    """Pre-train on `task.pretraining_chats`: uniformly random style unless instructed, else the instructed one.

    The uninstructed opener is trained towards the exact uniform mixture over styles (each style's
    possible first tokens share its 1/K), so the untrained preferred rate is 1/K by construction.
    The default learning rate is 5e-3 up to hidden size 128 and shrinks with width beyond (h256
    diverged from instruction-following at 5e-3 and learned it at 2.5e-3).
    """
    if lr is None:
        lr = 5e-3 * min(1.0, 128 / model.config.hidden_size)
    from openclaw_rl.embedded import task

    openers = task.opener_token_ids(tokenizer)
    target = {tok: 1.0 / len(openers) / len(ids) for ids in openers.values() for tok in ids}
    if len(target) != sum(len(ids) for ids in openers.values()):
        raise ValueError("two styles share an opening token; the styles would be indistinguishable")
    free = FreeChoice(target, lambda chat: not task.is_instructed(chat))
    return pretrain(model, tokenizer, task.pretraining_chats(n_chats, seed), steps=steps, seed=seed,
                    batch_size=batch_size, lr=lr, free_choice=free, log_every=log_every)


@dataclass(frozen=True, slots=True)
class OpenClawPhase:
    """Budget of the second pre-training phase on OpenClaw-shaped chats (``pretrain_openclaw_phase``).

    Rounds cycle through `prefixes` synthetic system prompts + tool lists whose size grows from
    `min_sections` to `max_sections` policy sections (a length curriculum: the last rounds are as long as
    OpenClaw's real ~15K-token prompt). Each round prefills its prefix once and then trains
    `steps_per_round` optimizer steps of `tails_per_step` conversation tails on top of it.
    """

    rounds: int = 24
    steps_per_round: int = 6
    tails_per_step: int = 6
    prefixes: int = 6
    min_sections: int = 8
    max_sections: int = 150
    lr: float = 1.5e-3
    short_weight: float = 0.5  # the short task chats of phase one keep being trained, so nothing is forgotten
    short_batch: int = 16


def _split_prefix(tokenizer: Any, system: str, tool_list: list[dict[str, Any]]) -> tuple[str, list[int]]:
    """(text, ids) of the rendered system turn (system prompt + tools): everything before the first user
    turn, which every conversation on this prefix shares. The chat markers are special tokens, so the
    prefix ids followed by the tail's ids are the ids of the whole prompt (checked per tail)."""
    probe = tokenizer.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": "x"}],
                                          tools=tool_list, tokenize=False)
    text = probe[:probe.index("<|im_start|>user")]
    return text, tokenizer.encode(text, add_special_tokens=False)


def _encode_tail(tokenizer: Any, prefix_text: str, system: str, tool_list: list[dict[str, Any]],
                 chat: list[dict[str, Any]]) -> tuple[list[int], int]:
    """(tail ids, prompt length within the tail) of `chat` after the shared prefix, rendered as the
    proxy renders an OpenClaw request (content parts flattened, tools in the system turn)."""
    from openclaw_rl.embedded.openclaw_golden import flatten_messages

    messages = flatten_messages([{"role": "system", "content": system}, *chat])
    prompt = tokenizer.apply_chat_template(messages[:-1], tools=tool_list, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages, tools=tool_list, tokenize=False)
    if not (prompt.startswith(prefix_text) and full.startswith(prompt)):
        raise ValueError("an OpenClaw-shaped chat does not render on top of its shared prefix")
    prompt_ids = tokenizer.encode(prompt[len(prefix_text):], add_special_tokens=False)
    target = tokenizer.encode(full[len(prompt):].removesuffix("\n"), add_special_tokens=False)
    return prompt_ids + target, len(prompt_ids)


def _tail_loss(model: Any, cache: Any, cache_kw: str, prefix_len: int, ids: list[int], prompt_len: int,
               free_at: int, soft: tuple[Any, Any], head_tokens: int, head_weight: float) -> Any:
    """Weighted cross-entropy of one tail's reply tokens, its forward attending to the cached prefix.

    The prefix's keys and values come from a no-grad prefill: the gradient flows through every tail
    position (queries, the tail's own keys/values, MLPs, head) but not back into the prefix tokens. That
    is what makes a 15K-token context affordable on a CPU (a full backward costs ~40x more), and it
    trains exactly what fails on OpenClaw's prompts: the reply's attention over a long, distracting context.
    """
    import torch

    tail = torch.tensor([ids])
    positions = torch.arange(prefix_len, prefix_len + len(ids)).unsqueeze(0)
    hidden = model.model(input_ids=tail, position_ids=positions, use_cache=True, **{cache_kw: cache}).last_hidden_state
    cache.crop(-len(ids))  # drop the tail again (a negative count means the same in transformers 4.5x and 5)
    for layer in cache.layers:  # the cropped prefix must not keep this tail's graph alive
        layer.keys, layer.values = layer.keys.detach(), layer.values.detach()
    rows = torch.arange(prompt_len - 1, len(ids) - 1)
    logp = torch.log_softmax(model.lm_head(hidden[0, rows]).float(), dim=-1)
    labels = tail[0, rows + 1]
    losses = -logp.gather(1, labels.unsqueeze(1)).squeeze(1)
    if free_at >= 0:
        ids_t, probs = soft
        losses[free_at - prompt_len] = -(logp[free_at - prompt_len, ids_t] * probs).sum()
    weights = torch.ones(len(rows))
    weights[:head_tokens] = head_weight
    return (losses * weights).sum() / weights.sum()


def pretrain_openclaw_phase(model: Any, tokenizer: Any, *, seed: int, phase: OpenClawPhase = OpenClawPhase(),
                            short_chats: list[list[dict[str, Any]]] | None = None, head_tokens: int = 6,
                            head_weight: float = 4.0, log: Callable[[str], None] | None = None) -> PretrainStats:
    """Phase two: the task's chats in OpenClaw's request shape, after OpenClaw-like system prompts and tools.

    Phase one teaches the task on ~100-token chats; on OpenClaw's 15K-token prompt the model then loses
    the thread (it loops in ``<think>`` blocks). Here the same task (uniform style unless instructed,
    instructions, corrections, OPD hints; plus off-task questions and tool round trips answered in a
    drawn style) is trained after synthetic prefixes of growing length (``openclaw_like``; the recorded
    OpenClaw prompts stay held out). Seeded and single-threaded like phase one.
    """
    import torch
    from transformers import DynamicCache

    from openclaw_rl.embedded import openclaw_like, task
    from openclaw_rl.engine.torch_core import forward_kwargs

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started = time.perf_counter()
    rng = random.Random(seed + 7919)
    cache_kw, _ = forward_kwargs(model.model)  # the inner Qwen3Model: the head runs on reply rows only
    openers = task.opener_token_ids(tokenizer)
    target = {tok: 1.0 / len(openers) / len(ids) for ids in openers.values() for tok in ids}
    soft = (torch.tensor(list(target)), torch.tensor(list(target.values())))
    rounds_of_styles: list[str] = []

    def draw_style() -> str:
        if not rounds_of_styles:
            rounds_of_styles.extend(task.STYLE_NAMES)
            rng.shuffle(rounds_of_styles)
        return rounds_of_styles.pop()

    short = encode_chats(tokenizer, short_chats or [])
    free_short = FreeChoice(target, lambda chat: not task.is_instructed(chat))
    short_free = [_free_position(ids, n, c, free_short) for (ids, n), c in zip(short, short_chats or [])]
    total = phase.rounds * phase.steps_per_round
    optimizer = torch.optim.AdamW(model.parameters(), lr=phase.lr, betas=(0.9, 0.98), weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 5) * (0.1 + 0.45 * (1 + math.cos(math.pi * s / max(1, total)))))
    model.train()
    first = last = float("nan")
    step = 0
    try:
        for r in range(phase.rounds):
            p_rng = random.Random(seed * 1000 + r % phase.prefixes)
            grow = r / max(1, phase.rounds - 1)
            sections = int(phase.min_sections + grow * (phase.max_sections - phase.min_sections))
            system = openclaw_like.system_prompt(p_rng, sections=sections)
            tool_list = openclaw_like.tools(p_rng, 12)
            tool_names = [t["function"]["name"] for t in tool_list]
            prefix_text, prefix_ids = _split_prefix(tokenizer, system, tool_list)
            cache = DynamicCache()
            with torch.no_grad():
                model.model(input_ids=torch.tensor([prefix_ids]), use_cache=True, **{cache_kw: cache})
            for _ in range(phase.steps_per_round):
                optimizer.zero_grad(set_to_none=True)
                value = 0.0
                for _ in range(phase.tails_per_step):
                    chat = openclaw_like.openclaw_chat(rng, draw_style, tool_names)
                    ids, prompt_len = _encode_tail(tokenizer, prefix_text, system, tool_list, chat)
                    free_at = _free_position(ids, prompt_len, chat, free_short)
                    loss = _tail_loss(model, cache, cache_kw, len(prefix_ids), ids, prompt_len, free_at, soft,
                                      head_tokens, head_weight) / phase.tails_per_step
                    loss.backward()
                    value += float(loss.detach())
                if short:
                    picked = rng.sample(range(len(short)), min(phase.short_batch, len(short)))
                    loss = phase.short_weight * _padded_loss(model, tokenizer, [short[i] for i in picked],
                                                             [short_free[i] for i in picked], soft, head_tokens,
                                                             head_weight)
                    loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                last = value
                if step == 0:
                    first = value
                step += 1
            if log is not None:
                log(f"OpenClaw pre-training round {r + 1}/{phase.rounds}: {len(prefix_ids)}-token prefix, "
                    f"loss {last:.3f} ({time.perf_counter() - started:.0f}s)")
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return PretrainStats(step, time.perf_counter() - started, first, last)


def _padded_loss(model: Any, tokenizer: Any, rows: list[tuple[list[int], int]], free_at: list[int],
                 soft: tuple[Any, Any] | None, head_tokens: int, head_weight: float) -> Any:
    """Phase one's loss on a right-padded batch of short chats."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    weights = torch.ones((len(rows), width))
    free = torch.zeros((len(rows), width), dtype=torch.bool)
    for r, ((ids, prompt_len), f) in enumerate(zip(rows, free_at)):
        input_ids[r, :len(ids)] = torch.tensor(ids)
        labels[r, prompt_len:len(ids)] = torch.tensor(ids[prompt_len:])
        mask[r, :len(ids)] = 1
        weights[r, prompt_len:prompt_len + head_tokens] = head_weight
        if f >= 0:
            free[r, f] = True
    return _target_loss(model, input_ids, mask, labels, weights, free, soft)


# --- checks (used by the tests and for reporting) -------------------------------------------------------


def _prompt_batch(tokenizer: Any, prompts: list[list[dict[str, Any]]], suffix: str = "") -> Any:
    """Left-padded ids of the generation prompts (plus `suffix`), as one batch."""
    import torch

    rows = [tokenizer.encode(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) + suffix,
                             add_special_tokens=False) for p in prompts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask


def style_probabilities(model: Any, tokenizer: Any, prompts: list[list[dict[str, Any]]]) -> dict[str, float]:
    """The mean probability, over `prompts`, that the reply opens in each style: exact, no sampling noise.

    Read at the first token after the empty think block (``task.THINK_PREFIX``), where the style is decided.
    """
    import torch

    from openclaw_rl.embedded import task

    ids, mask = _prompt_batch(tokenizer, prompts, task.THINK_PREFIX)
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids, attention_mask=mask).logits[:, -1].float(), dim=-1)
    return {style: float(probs[:, list(tokens)].sum(-1).mean())
            for style, tokens in task.opener_token_ids(tokenizer).items()}


def opener_probabilities(model: Any, tokenizer: Any, prompts_ids: list[list[int]]) -> dict[str, float]:
    """`style_probabilities` for prompts given as generation-prompt ids (e.g. OpenClaw requests rendered
    with their tools by ``openclaw_golden.golden_prompt_ids``): one unpadded forward per prompt, the head on
    the last row only, so a 15K-token prompt costs no [T, vocab] logits."""
    import torch

    from openclaw_rl.embedded import task

    think = tokenizer.encode(task.THINK_PREFIX, add_special_tokens=False)
    openers = task.opener_token_ids(tokenizer)
    totals = dict.fromkeys(openers, 0.0)
    with torch.no_grad():
        for ids in prompts_ids:
            logits = model(input_ids=torch.tensor([ids + think]), logits_to_keep=1, use_cache=False).logits[0, -1]
            probs = torch.softmax(logits.float(), dim=-1)
            for style, tokens in openers.items():
                totals[style] += float(probs[list(tokens)].sum()) / len(prompts_ids)
    return totals


def sample_replies(model: Any, tokenizer: Any, prompts: list[list[dict[str, Any]]], *, seed: int,
                   temperature: float = 1.0, max_new_tokens: int = 48) -> list[str]:
    """One pure-sampled reply per prompt (no top-k/top-p), decoded without special tokens."""
    import torch

    ids, mask = _prompt_batch(tokenizer, prompts)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature, top_k=0,
                             top_p=1.0, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    return [tokenizer.decode(row[ids.shape[1]:], skip_special_tokens=True) for row in out]


def sample_continuations(model: Any, prompt_ids: list[int], n: int, *, seed: int, max_new_tokens: int = 48,
                         stop_ids: tuple[int, ...] = ()) -> list[list[int]]:
    """`n` pure-sampled continuations of ONE long prompt, prefilled once (an OpenClaw prompt is ~15K
    tokens: prefilling it n times would cost n times the attention). Each stops at a `stop_ids` token."""
    import torch
    from transformers import DynamicCache

    from openclaw_rl.engine.torch_core import forward_kwargs

    cache_kw, _ = forward_kwargs(model)  # transformers 5 calls it `cache`, 4.5x `past_key_values`
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        cache = DynamicCache()
        out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True, logits_to_keep=1, **{cache_kw: cache})
        cache.batch_repeat_interleave(n)
        logits = out.logits[:, -1].expand(n, -1)
        rows: list[list[int]] = [[] for _ in range(n)]
        done = [False] * n
        for step in range(max_new_tokens):
            tokens = torch.multinomial(torch.softmax(logits.float(), dim=-1), 1)
            for i, t in enumerate(tokens.squeeze(1).tolist()):
                if not done[i]:
                    rows[i].append(t)
                    done[i] = t in stop_ids
            if all(done):
                break
            position = torch.full((n, 1), len(prompt_ids) + step)
            out = model(input_ids=tokens, use_cache=True, position_ids=position, **{cache_kw: cache})
            logits = out.logits[:, -1]
    return rows
