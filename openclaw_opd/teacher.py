"""The hinted teacher: score a turn's exact response ids under the prompt with the hint appended.

Stage: mode scorer → **teacher** (judge server's ``/generate``). Shared by OPD and Combine.
Differences from upstream (§5.2, §12):
1) the response is the turn's *sampled ids*, appended to the tokenised enhanced prompt, never
   re-tokenised text, so teacher entry j scores exactly response token j;
2) ``logprob_start_len = len(prompt) - 1`` and entry 0 dropped: every response token is scored
   (upstream lost the first one, or two on older SGLang, and zero-filled them);
3) positions the teacher could not score are masked out of the loss, never zero-filled;
4) SGLang's input log-probs are never temperature-scaled while the student's are (logits / T): when
   the turn was sampled at T != 1 the teacher log-probs are rescaled with the teacher's top-K,
   ``lp/T - log(sum_topK exp(lp_i/T) + tail^(1/T))``, exact at T = 1 and a tight bound otherwise.

``openclaw_opd_teacher_source: trainer`` (upstream PR #85's in-trainer teacher): no server call here; the
signal carries the enhanced prompt's ids (``prompt_ids``) and the trainer's frozen teacher scores
``prompt_ids + response_ids`` at train time (``openclaw_rl/embedded/frozen_teacher.py``), at the student's
temperature exactly and with the same numerics as the student's forward.
"""

from __future__ import annotations

import asyncio
import copy
import math
from array import array
from dataclasses import dataclass, field

from openclaw_rl.chat import ChatRenderer
from openclaw_rl.judge import JudgeClient
from openclaw_rl.turns import Turn

HINT_HEADER = "\n\n[user's hint / instruction]\n"
RESCALE_TOPK = 20  # top-K fetched to rescale teacher log-probs when the turn was sampled at T != 1


@dataclass(slots=True)
class TeacherSignal:
    log_probs: list[float]  # (R,) teacher log-probs at the student's temperature; rollout lp where unscored
    mask: list[int]  # (R,) 0 where the teacher gave no score
    topk_log_probs: list[list[float]] | None = None  # (R, K), -inf padded
    topk_indices: list[list[int]] | None = None  # (R, K)
    prompt_ids: list[int] | None = None  # teacher_source trainer: the hinted prompt's ids (log_probs then empty)
    # with them, a private copy of those ids and the bytes of the renderer's array of them: the spool stores
    # those bytes while the sample's list still equals the copy (TrainingSample.from_turn's ``packed``)
    prompt_packed: tuple[list[int], bytes] | None = field(default=None, repr=False, compare=False)


def enhanced_messages(messages: list[dict], hint: str) -> list[dict]:
    """Append the hint to the last user message (a new user message if there is none), as upstream."""
    out = copy.deepcopy(messages)
    target = next((m for m in reversed(out) if m.get("role") == "user"), None)
    if target is None:
        out.append({"role": "user", "content": hint.strip()})
        return out
    target["content"] = (str(target.get("content") or "") + HINT_HEADER + hint).strip()
    return out


def rescale(lp: float, topk: list[float], temperature: float) -> float:
    """log softmax(logits / T) at one token, from unscaled log-probs (the logits' offset cancels)."""
    tail = max(0.0, 1.0 - sum(math.exp(x) for x in topk))
    terms = [x / temperature for x in topk]
    if tail > 0:
        terms.append(math.log(tail) / temperature)
    top = max(terms)
    return lp / temperature - (top + math.log(sum(math.exp(t - top) for t in terms)))


def hinted_prompt_ids(turn: Turn, hint: str, renderer: ChatRenderer, messages: list[dict] | None = None) -> list[int]:
    """The teacher's prompt ids: the turn's messages with ``hint`` appended (or ``messages``), rendered with the
    turn's tools by the policy's renderer. The response is never part of it: its sampled ids are appended as ids."""
    return list(_render_hinted(turn, hint, renderer, messages)[0])


def _render_hinted(turn: Turn, hint: str, renderer: ChatRenderer, messages: list[dict] | None,
                   with_array: bool = False) -> tuple[list[int], array | None]:
    """``hinted_prompt_ids`` as the renderer gives them, with (``with_array``) the ``array("i")`` it builds."""
    assert turn.messages is not None
    from openclaw_rl.protocol import Tool

    tools = [Tool.model_validate(t) for t in turn.tools] if turn.tools else None
    chat = messages if messages is not None else enhanced_messages(turn.messages, hint)
    if not with_array:
        return renderer.render(chat, tools)[1], None
    _, ids, ids_array = renderer.render(chat, tools, with_array=True)
    return ids, ids_array


def trainer_signal(turn: Turn, hint: str, renderer: ChatRenderer, messages: list[dict] | None = None) -> TeacherSignal:
    """teacher_source trainer: the hinted prompt ids (or ``messages``' ids: OEL's experience-augmented prompt) for
    the trainer's frozen teacher; every token scored. The renderer's array of the ids (it builds one anyway) goes
    along as bytes with a private copy of the ids, so that the spool writer need not convert the sample's list
    again (~115 µs for 8K ids; ``scripts/bench_sample_rows.py``)."""
    assert turn.generation is not None
    ids, ids_array = _render_hinted(turn, hint, renderer, messages, with_array=True)
    assert ids_array is not None
    return TeacherSignal([], [1] * len(turn.generation.response_ids), prompt_ids=list(ids),
                         prompt_packed=(list(ids), ids_array.tobytes()))


async def trainer_signal_off_loop(turn: Turn, hint: str, renderer: ChatRenderer,
                                  messages: list[dict] | None = None) -> TeacherSignal:
    """``trainer_signal`` in a worker thread: its render (template and tokenising the whole hinted prompt, ~1.1 ms
    at ~8K history) must not hold the event loop, which serves every other request meanwhile."""
    return await asyncio.to_thread(trainer_signal, turn, hint, renderer, messages)


def teacher_packed(signal: TeacherSignal) -> dict[str, tuple[list[int], bytes]] | None:
    """``TrainingSample.from_turn``'s ``packed`` for a signal's prompt ids (None without them)."""
    return None if signal.prompt_packed is None else {"teacher_prompt_ids": signal.prompt_packed}


async def teacher_signal(turn: Turn, hint: str, judge: JudgeClient, renderer: ChatRenderer, top_k: int = 0,
                         *, messages: list[dict] | None = None) -> TeacherSignal:
    """``messages``: the teacher's whole prompt instead of the turn's with ``hint`` appended (OEL's
    experience-augmented prompt, ``openclaw_oel.experience``)."""
    assert turn.generation is not None and turn.messages is not None
    # rendered off the event loop, like a request's prompt (serving.py): ~1.1 ms of template and tokenising at
    # ~8K history with the bench's tokenizer, per scored hint, that every other request would otherwise wait for
    prompt_ids = await asyncio.to_thread(hinted_prompt_ids, turn, hint, renderer, messages)
    response_ids = turn.generation.response_ids.tolist()
    rollout = turn.generation.response_logprobs.tolist()
    temperature = turn.sampling_temperature or 1.0
    needs_rescale = abs(temperature - 1.0) > 1e-6 and temperature > 1e-6
    fetch_k = max(top_k, RESCALE_TOPK if needs_rescale else 0)
    scores = await judge.teacher_log_probs(prompt_ids, response_ids, fetch_k)
    log_probs, mask = [], []
    for j, lp in enumerate(scores.log_probs):
        if lp is None or not math.isfinite(lp):
            log_probs.append(rollout[j])
            mask.append(0)
            continue
        if needs_rescale and scores.topk_log_probs:
            lp = rescale(lp, scores.topk_log_probs[j], temperature)
        log_probs.append(lp)
        mask.append(1)
    signal = TeacherSignal(log_probs, mask)
    if top_k > 0 and scores.topk_log_probs is not None and scores.topk_indices is not None:
        rows_lp, rows_id = [], []
        for lps, ids in zip(scores.topk_log_probs, scores.topk_indices):
            lps, ids = lps[:top_k], ids[:top_k]
            if needs_rescale:
                lps = [rescale(x, lps, temperature) for x in lps]
            pad = top_k - len(lps)  # explicit -inf padding: zero teacher mass, never a fake probability of 1
            rows_lp.append(lps + [-math.inf] * pad)
            rows_id.append(ids + [0] * pad)
        signal.topk_log_probs, signal.topk_indices = rows_lp, rows_id
    return signal
