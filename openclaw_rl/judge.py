"""The judge client: PRM votes, hindsight-hint votes and teacher log-probs, all from one judge server.

Stage: sessions → **judge** → mode. A turn's m votes run concurrently over one pooled HTTP client and
a semaphore owned by the judge. A vote that fails or times out counts as failed (None); the majority
of the rest wins and a tie or no valid vote scores 0, as upstream. Unlike upstream, the ``\\boxed{}``
verdict is read only after the judge's thinking block, so a score merely considered while thinking (or a
generation cut off mid-thought) cannot vote, and ``\\boxed{ 1 }`` parses.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from . import chat_format, codec
from .backend import post_whole, probe_backend
from .chat_format import ChatFormat
from .chat_template import ChatTemplateText
from .config import JudgeSettings
from .errors import BackendTimeout, BackendUnavailable, BadRequest
from .judge_retry import (
    ContextRelearned,
    Hook,
    JudgeStatusError,
    Retrier,
    RetryPolicy,
    context_from_error,
    is_context_error,
)
from .rawstream import StreamClient

log = logging.getLogger(__name__)

PRM_SYSTEM = """You are a process reward model. You judge whether an AI assistant's output did what the \
user wanted, using what happened next (the "next state") as your evidence.

The next state is one of two kinds:
- role "user": the user's reply to the assistant;
- role "tool": the result of a tool call the assistant made. It exists because the assistant acted, so a \
successful, error-free tool result is evidence that the action was right.

Score the assistant output:
- \\boxed{1}: the next state shows progress or success: the user moves on, thanks the assistant or \
builds on the answer, or the tool succeeded.
- \\boxed{-1}: the next state shows failure: the user asks to redo or retry, corrects or asks to change \
the answer, rephrases the same request, or the tool reports an error the assistant caused. A request \
to change what the assistant produced is negative feedback.
- \\boxed{0}: the evidence is ambiguous or insufficient.

Reason step by step, then give exactly one final score in \\boxed{}."""

PRM_USER = """## Assistant output
{response}

## Next state [role: {role}]
{next_state}

Classify the next state as (a) progress, (b) correction / redo / change request, or (c) ambiguous, and \
answer with \\boxed{{1}}, \\boxed{{-1}} or \\boxed{{0}} respectively."""

HINT_SYSTEM = """You extract hindsight hints for training an AI assistant. You see the assistant's \
response at turn t and the next state at turn t+1, with its role:
- role "user": the user's reply;
- role "tool": the result of the assistant's own tool call. A successful tool output means the action \
was appropriate; it is not information the assistant should have known in advance.

Decide whether the next state reveals something the assistant should have done differently and could \
have acted on: a correction, a preference, a missing step, a better approach.

Output format, strictly:
- Finish with exactly one \\boxed{1} (useful hindsight exists) or \\boxed{-1} (none).
- If and only if you answer \\boxed{1}, also give a concise, concrete, actionable hint of one to three \
sentences between [HINT_START] and [HINT_END], written as an instruction to the assistant.
- No hint block for \\boxed{-1}."""

HINT_USER = """## Assistant response (turn t)
{response}

## Next state (turn t+1) [role: {role}]
{next_state}

Give your decision, and the hint if the decision is 1, in the required format."""

_BOXED = re.compile(r"\\boxed\{\s*([-+]?\d+)\s*\}")
_HINT = re.compile(r"\[HINT_START\](.*?)\[HINT_END\]", re.DOTALL)


def after_thinking(text: str, fmt: ChatFormat = chat_format.DEFAULT) -> str:
    """The part of a judge output after its thinking block ("" if it never left it); ``fmt``: the judge's family."""
    return fmt.after_reasoning(text)


def parse_boxed(text: str, allowed: Sequence[int] = (1, -1, 0), fmt: ChatFormat = chat_format.DEFAULT) -> int | None:
    matches = _BOXED.findall(after_thinking(text, fmt))
    if not matches:
        return None
    value = int(matches[-1])
    return value if value in allowed else None


def parse_hint(text: str, fmt: ChatFormat = chat_format.DEFAULT) -> str:
    matches = _HINT.findall(after_thinking(text, fmt))
    return matches[-1].strip() if matches else ""


def _chat_text(data: Any) -> str | None:
    try:
        return str(data["choices"][0]["message"].get("content") or "")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


def majority_vote(votes: Sequence[int | None]) -> float:
    valid = [v for v in votes if v is not None]
    if not valid:
        return 0.0
    ranked = Counter(valid).most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return 0.0
    return float(ranked[0][0])


@dataclass(slots=True)
class PRMJudgement:
    score: float
    votes: list[int | None]
    representative: str | None = None  # the first vote agreeing with a non-zero score
    source: str = "judge"  # "judge", or "feedback" for an explicit rating (POST /v1/feedback)
    failed_votes: int = 0  # votes whose request failed (unreachable, timeout, refused), not unparsable ones
    reasons: list[str | None] = field(default_factory=list)  # each vote's raw answer (its reasoning), for records

    @property
    def failed(self) -> bool:
        """No vote came back at all: the 0 score is the judge's failure, not its verdict (judge_failed)."""
        return self.source == "judge" and bool(self.votes) and self.failed_votes == len(self.votes)

    @classmethod
    def from_feedback(cls, rating: float) -> PRMJudgement:
        return cls(float(rating), [], None, "feedback")

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"score": self.score, "votes": [("fail" if v is None else v) for v in self.votes],
                               "source": self.source}
        if self.reasons:
            out["reasons"] = self.reasons
        return out


@dataclass(slots=True)
class HintVote:
    score: int | None
    hint: str
    raw: str


@dataclass(slots=True)
class HintJudgement:
    votes: list[HintVote] = field(default_factory=list)
    failed_votes: int = 0

    @property
    def failed(self) -> bool:
        """Every hint vote failed to come back: judge_failed, not no_hint."""
        return bool(self.votes) and self.failed_votes == len(self.votes)

    def best_hint(self, min_chars: int) -> str:
        """The longest hint of a +1 vote longer than ``min_chars`` characters ("" if none)."""
        hints = [v.hint for v in self.votes if v.score == 1 and len(v.hint) > min_chars]
        return max(hints, key=len) if hints else ""


@dataclass(slots=True)
class TeacherScores:
    log_probs: list[float | None]  # (R,) None where the teacher gave no value
    topk_log_probs: list[list[float]] | None = None  # (R, K)
    topk_indices: list[list[int]] | None = None  # (R, K)


class JudgeClient:
    """Talks to the judge/teacher server (SGLang ``/generate``, or OpenAI chat for votes only)."""

    def __init__(self, http: httpx.AsyncClient, settings: JudgeSettings, *, tokenizer: Any = None,
                 vocab_size: int | None = None, on_vote: Any = None, teacher_concurrency: int = 0,
                 raw_http: bool = False, on_retry: Hook | None = None):
        self.http, self.url = http, settings.url.rstrip("/")
        # raw_http: calls to a plain-http judge go through rawstream (the proxy's choice; a fraction of
        # httpx's CPU per call), otherwise through ``http`` (tests hand in mock transports there)
        self._raw = StreamClient(self.url, connect_timeout_s=min(10.0, settings.timeout_s)) \
            if raw_http and self.url.startswith("http://") else None
        self.on_vote = on_vote or (lambda outcome: None)  # metrics hook: "ok", "failed", "unparsable"
        self.tokenizer, self.m = tokenizer, settings.votes
        # the judge model's family (its think tags), which need not be the policy's
        self.format = chat_format.detect(tokenizer) or chat_format.DEFAULT
        self._template = ChatTemplateText(tokenizer) if getattr(tokenizer, "chat_template", None) else None
        self.temperature, self.max_new_tokens = settings.temperature, settings.max_new_tokens
        self.timeout_s, self.api, self.model = settings.timeout_s, settings.api, settings.model
        self.headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self.vocab_size = vocab_size
        self.max_response_bytes = settings.max_response_bytes  # votes and teacher calls alike (capped.py)
        self.context_length = settings.context_length or None  # tokens; set from the server by the proxy's probe when unknown
        self._slots = asyncio.Semaphore(max(1, settings.concurrency))
        # upstream's OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY: teacher scoring calls (long prompts, no
        # sampling) get their own, smaller limit so they cannot starve the votes; 0 = judge slots only
        self.teacher_concurrency = teacher_concurrency
        self._teacher_slots = asyncio.Semaphore(teacher_concurrency) if teacher_concurrency > 0 else None
        # calls that fail for a reason that can pass are retried (judge_retry.py); on_retry counts them
        self.retrier = Retrier(RetryPolicy(settings.retry_attempts, settings.retry_max_s, settings.retry_backoff_s),
                               on_retry)
        self._probed = False  # the server answered a context probe (it may not report a context)
        self._probe_lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    def render(self, system: str, user: str) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        if self._template is None:
            return f"{system}\n\n{user}\n"
        return self._template(messages)

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        async with self._slots:
            status, content = await post_whole(
                self._raw, self.http, self.url, path, codec.dumps(body),
                {**self.headers, "Content-Type": "application/json"}, self.timeout_s,
                timeout_message=f"judge {path} timed out after {self.timeout_s}s", unreachable=f"judge {path} unreachable",
                max_bytes=self.max_response_bytes, what=f"judge {path}", setting="openclaw_judge_max_response_bytes")
        if status != 200:
            raise JudgeStatusError(path, status, content[:2000].decode("utf-8", "replace"))
        try:
            return codec.loads(content)
        except codec.DecodeError as e:
            raise BackendUnavailable(f"judge {path} answered non-JSON") from e

    async def _call(self, path: str, build: Callable[[], Awaitable[dict[str, Any]]], call: str,
                    slots: asyncio.Semaphore | None = None) -> Any:
        """``_post`` of the body ``build()`` makes, retried by ``self.retrier`` while it fails for a reason
        that can pass. The judge's context is learned before the first attempt, and the body is built
        again for each attempt, so a context re-learned from a context-length 400 clamps the retry."""
        async def attempt() -> Any:
            await self.learn_context()
            used = self.context_length
            body = await build()
            try:
                if slots is None:
                    return await self._post(path, body)
                async with slots:
                    return await self._post(path, body)
            except JudgeStatusError as e:
                # votes are clamped to the context; a teacher call (no new tokens) that does not fit never will
                if call == "votes" and is_context_error(e) and await self._relearn_context(e, used):
                    raise ContextRelearned(f"judge context re-learned as {self.context_length} tokens after: "
                                           f"{e.message}") from e
                raise
        return await self.retrier.run(attempt, call)

    async def learn_context(self) -> None:
        """Before the first call, when the judge's context is unknown and can be used (a tokenizer counts
        the prompt): probe the server until it answers (an unreachable judge is retried like a failed
        call), and take the context it reports. A server that reports none is called unclamped."""
        if self.context_length or self._probed or self.tokenizer is None:
            return
        async with self._probe_lock:
            if self.context_length or self._probed:
                return
            info = await probe_backend(self.http, self.url, self.headers or None)
            if not info.reachable:
                raise BackendUnavailable(f"judge unreachable (context probe): {info.error}")
            if info.context_length and not self.context_length:
                self.context_length = info.context_length
                log.info("judge context: %d tokens (from the server)", info.context_length)
            self._probed = True

    async def _relearn_context(self, error: JudgeStatusError, used: int | None) -> bool:
        """After a context-length 400: read the context again (the message's figure, else the server's);
        True when it differs from the one the failed call was clamped to, so a retry may pass."""
        if self.tokenizer is None:
            return False
        learned = context_from_error(error.text)
        if learned is None:
            info = await probe_backend(self.http, self.url, self.headers or None)
            learned = info.context_length
        if learned is None or learned == used:
            return False
        log.warning("judge context re-learned: %d tokens (was %s)", learned, used or "unknown")
        self.context_length = learned
        return True

    def close(self) -> None:
        """Close the raw client's idle connections (the httpx client is its owner's)."""
        if self._raw is not None:
            self._raw.close()

    def max_new_tokens_for(self, prompt: str) -> int:
        """The configured budget clamped to the room the judge's context leaves after ``prompt`` (its
        rendered text, counted with the judge tokenizer); raises BadRequest when nothing is left."""
        if not self.context_length or self.tokenizer is None:
            return self.max_new_tokens
        prompt_tokens = len(self.tokenizer.encode(prompt, add_special_tokens=False))
        room = self.context_length - prompt_tokens
        if room < 1:
            raise BadRequest(f"judge prompt of {prompt_tokens} tokens does not fit the judge's context of "
                             f"{self.context_length} tokens")
        return min(self.max_new_tokens, room)

    async def max_new_tokens_async(self, prompt: str) -> int:
        """``max_new_tokens_for`` without tokenising on the event loop: a prompt of B UTF-8 bytes has at
        most B + 1 tokens (byte-level BPE: at most one per byte; SentencePiece: one per character plus a
        leading space), so when that bound leaves the whole budget, nothing is counted; otherwise the
        count runs on a worker thread."""
        if not self.context_length or self.tokenizer is None:
            return self.max_new_tokens
        if len(prompt.encode("utf-8", "surrogatepass")) + 1 + self.max_new_tokens <= self.context_length:
            return self.max_new_tokens
        return await asyncio.to_thread(self.max_new_tokens_for, prompt)

    async def _votes(self, system: str, user: str) -> list[str | None]:
        """m votes: one SGLang request with ``n = m`` (one prompt to render, one HTTP round trip), or m
        concurrent chat requests for an OpenAI-compatible judge. A failed request fails its votes."""
        try:
            prompt = self.render(system, user)
            if self.api == "openai":
                async def chat() -> dict[str, Any]:
                    return {"model": self.model, "temperature": self.temperature,
                            "max_tokens": await self.max_new_tokens_async(prompt),
                            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
                outs = await asyncio.gather(*(self._call("/v1/chat/completions", chat, "votes")
                                              for _ in range(self.m)), return_exceptions=True)
                for o in outs:
                    if isinstance(o, asyncio.CancelledError):  # shutting down: the turn is judged again later
                        raise o
                    if isinstance(o, BaseException):
                        log.warning("judge vote failed: %s", o)
                raws = [None if isinstance(o, BaseException) else _chat_text(o) for o in outs]
            else:
                async def generate() -> dict[str, Any]:
                    return {"text": prompt,
                            "sampling_params": {"temperature": self.temperature, "top_p": 1.0, "top_k": -1,
                                                "n": self.m, "max_new_tokens": await self.max_new_tokens_async(prompt),
                                                "skip_special_tokens": False, "no_stop_trim": True,
                                                "spaces_between_special_tokens": False},
                            "return_logprob": False}
                data = await self._call("/generate", generate, "votes")
                items = data if isinstance(data, list) else [data]
                raws = [str(item["text"]) if isinstance(item, dict) and "text" in item else None for item in items]
                raws = (raws + [None] * self.m)[: self.m]
        except (BackendUnavailable, BackendTimeout, BadRequest) as e:
            log.warning("judge votes failed: %s", e)
            raws = [None] * self.m
        for raw in raws:
            self.on_vote("failed" if raw is None else "ok" if _BOXED.search(after_thinking(raw, self.format))
                         else "unparsable")
        return raws

    async def prm(self, response_text: str, next_state: dict[str, str]) -> PRMJudgement:
        user = PRM_USER.format(response=response_text, role=next_state["role"], next_state=next_state["content"])
        raws = await self._votes(PRM_SYSTEM, user)
        votes = [None if raw is None else parse_boxed(raw, fmt=self.format) for raw in raws]
        score = majority_vote(votes)
        rep = next((raw for raw, v in zip(raws, votes) if v == score and score != 0), None)
        return PRMJudgement(score, votes, rep, failed_votes=raws.count(None), reasons=list(raws))

    async def hints(self, response_text: str, next_state: dict[str, str]) -> HintJudgement:
        user = HINT_USER.format(response=response_text, role=next_state["role"], next_state=next_state["content"])
        raws = await self._votes(HINT_SYSTEM, user)
        return HintJudgement([HintVote(None, "", "") if raw is None else
                              HintVote(parse_boxed(raw, (1, -1), self.format), parse_hint(raw, self.format), raw)
                              for raw in raws], failed_votes=raws.count(None))

    async def teacher_log_probs(self, prompt_ids: Sequence[int], response_ids: Sequence[int],
                                top_k: int = 0) -> TeacherScores:
        """Teacher log-probs of the exact response ids given ``prompt_ids`` (the hint-enhanced prompt).

        Real SGLang scores ``ids[k+j]`` at entry j and always leaves entry 0 null, so we send
        ``logprob_start_len = len(prompt) - 1`` and drop entry 0: the rest lines up 1:1 with the
        response. Input log-probs are never temperature-scaled by SGLang (see the OPD mode).
        """
        ids = list(prompt_ids) + list(response_ids)
        if not prompt_ids or not response_ids:
            raise BadRequest("teacher scoring needs a non-empty prompt and response")
        # min and max: a generator over 8K ids cost ~0.34 ms of the event loop per scored hint, these ~0.22
        if self.vocab_size is not None and (min(ids) < 0 or max(ids) >= self.vocab_size):
            raise BadRequest("token id outside the teacher's vocabulary: the teacher must share the policy tokenizer")
        body: dict[str, Any] = {"input_ids": ids, "return_logprob": True, "logprob_start_len": len(prompt_ids) - 1,
                                "sampling_params": {"temperature": 0.0, "max_new_tokens": 0,
                                                    "skip_special_tokens": False}}
        if top_k > 0:
            body["top_logprobs_num"] = top_k
        async def fixed() -> dict[str, Any]:
            return body
        data = await self._call("/generate", fixed, "teacher", self._teacher_slots)
        meta = (data[0] if isinstance(data, list) else data).get("meta_info", {})
        entries = meta.get("input_token_logprobs") or []
        r = len(response_ids)
        if len(entries) != r + 1:
            raise BackendUnavailable(f"teacher returned {len(entries)} input log-probs, expected {r + 1}")
        log_probs: list[float | None] = []
        for j, entry in enumerate(entries[1:]):
            if entry is None or entry[0] is None:
                log_probs.append(None)
                continue
            if int(entry[1]) != response_ids[j]:
                raise BackendUnavailable(f"teacher entry {j} scored token {entry[1]}, not {response_ids[j]}")
            log_probs.append(float(entry[0]))
        scores = TeacherScores(log_probs)
        if top_k > 0:
            rows = (meta.get("input_top_logprobs") or [])[1:]
            if len(rows) != r:
                raise BackendUnavailable(f"teacher returned {len(rows)} top-k rows, expected {r}")
            scores.topk_log_probs = [[float(e[0]) for e in row[:top_k]] if row else [] for row in rows]
            scores.topk_indices = [[int(e[1]) for e in row[:top_k]] if row else [] for row in rows]
        return scores
