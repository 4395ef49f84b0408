"""The records that flow between stages: a sampled generation, a main-line turn, and why a turn is dropped.

Token ids and their log-probs travel together (``Generation``) and are checked once, on construction:
every later stage can rely on ``len(response_ids) == len(response_logprobs)``. Token ids are stored as
``array('i')`` because parked turns are the proxy's main memory cost.
"""

from __future__ import annotations

import base64
import time
from array import array
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class DropReason(str, Enum):
    """Every way a turn can fail to become a training sample. Each is counted and logged."""

    GENERATION_FAILED = "generation_failed"
    """The policy backend failed or timed out; the client got a 502/504."""
    CLIENT_DISCONNECTED = "client_disconnected"
    """The client hung up mid-stream, or the server stopped before answering (the client got a 503 or a
    cut stream): the response it never saw is not trained."""
    ABORTED = "aborted"
    """The backend aborted the generation (e.g. a weight sync); upstream trained these as complete."""
    EMPTY_RESPONSE = "empty_response"
    """The policy sampled no tokens."""
    NO_NEXT_STATE = "no_next_state"
    """The session ended (done or idle TTL) before the turn got a next state, and the mode needs one."""
    NO_JUDGE = "no_judge"
    """RL with the PRM off (no judge URL) and no explicit feedback: the next state came, but nothing
    scores it, so the turn would train at reward 0 (upstream's PRM-disabled behaviour)."""
    ZERO_SCORE = "zero_score"
    """RL: the judge scored 0 (ambiguous) and the at-least-one rule did not apply."""
    NO_HINT = "no_hint"
    """OPD: no judge vote produced an accepted hint."""
    TEACHER_FAILED = "teacher_failed"
    """OPD: a hint was accepted but the teacher could not score the response."""
    JUDGE_FAILED = "judge_failed"
    """Every judge vote failed (unreachable, timeout, refused), or the judgement raised: not a real 0."""
    SPOOL_FULL = "spool_full"
    """The spool reached its disk cap; the sample is kept in memory until space frees up."""
    TOKENS_INVALID = "tokens_invalid"
    """Token ids out of the model's vocabulary; never sent to a backend."""
    BACKEND_INVALID = "backend_invalid_output"
    """The policy answered values that cannot be trained on (ids outside the vocabulary, non-finite
    log-probs); the client got a 502."""
    SUPERSEDED_BY_RETRY = "superseded_by_retry"
    """The client sent the same prompt again before the turn got a next state: it never used this reply
    (a timeout retry, a resend, a regenerate), so the new request replaces the turn."""
    NOT_DURABLE = "not_durable"
    """The spool could not commit the turn within ``DURABLE_WAIT_S`` (a full disk, an I/O error, the spool
    file deleted or replaced): its reply was refused with 503 (an error event in a stream), so the client
    never used it."""
    USER_DELETED = "user_deleted"
    """The turn's user was deleted (``DELETE /v1/users/{user}``, docs/users.md) while it waited for its next
    state or judgement, or while it was being generated: nothing of it is kept."""
    SETTLE_FAILED = "settle_failed"
    """Recording the turn raised unexpectedly (a bug); the turn is dropped, the session goes on."""


class TurnStatus(str, Enum):
    COMPLETED = "completed"
    TRUNCATED = "truncated"  # finish_reason length
    ABORTED = "aborted"


@dataclass(slots=True)
class Generation:
    """What the policy sampled for one request: exact ids, aligned log-probs, and the decoded text."""

    response_ids: array  # (R,) int token ids exactly as sampled, stop token included
    response_logprobs: array  # (R,) float log p_rollout(token) at the sampling temperature
    text: str  # the engine's decoded text (stop string trimmed); used for parsing and the judge
    finish_reason: str  # "stop", "length" or "abort"
    weight_version: str | None = None

    def __post_init__(self) -> None:
        if len(self.response_ids) != len(self.response_logprobs):
            raise ValueError(f"{len(self.response_ids)} response ids but {len(self.response_logprobs)} "
                             "log-probs: the backend's output is misaligned")

    @classmethod
    def from_lists(cls, ids: list[int], logprobs: list[float], text: str, finish_reason: str,
                   weight_version: str | None = None) -> Generation:
        return cls(array("i", ids), array("d", logprobs), text, finish_reason, weight_version)

    @property
    def status(self) -> TurnStatus:
        return {"length": TurnStatus.TRUNCATED, "abort": TurnStatus.ABORTED}.get(self.finish_reason,
                                                                               TurnStatus.COMPLETED)


@dataclass(slots=True)
class Turn:
    """One main-line request of a session, from arrival until its sample is emitted."""

    session_key: str  # namespace-qualified session key
    session_id: str  # the client's session id (for records and metadata)
    index: int  # 1-based turn number within the session, in arrival order
    prompt_ids: array  # (P,) the exact ids the policy consumed
    messages: list[dict[str, Any]] | None  # normalised request messages (kept only when a stage needs them)
    tools: list[dict[str, Any]] | None
    sampling_temperature: float | None
    created: float = field(default_factory=time.time)
    generation: Generation | None = None
    next_state: dict[str, str] | None = None
    prompt_text: str | None = None  # rendered prompt, kept only for records
    traceparent: str | None = None
    feedback: float | None = None  # explicit rating from POST /v1/feedback; overrides the judge's score
    epoch: str = ""  # which incarnation of the session id (ids can be reused after a session ends)

    @property
    def response_length(self) -> int:
        return len(self.generation.response_ids) if self.generation else 0

    def to_record(self, arrays: bool = True) -> dict[str, Any]:
        """JSON-able form, persisted while the turn waits (restart recovery). Token arrays travel as
        base64 of their bytes: encoding 8K ids this way costs microseconds instead of milliseconds. With
        ``arrays=False`` they are left out (None): the spool keeps their bytes apart (``array_bytes``, blob
        columns), and ``with_array_bytes`` puts them back in the record."""
        gen = self.generation
        return {"session_key": self.session_key, "session_id": self.session_id, "index": self.index,
                "prompt_ids": _b64(self.prompt_ids) if arrays else None, "messages": self.messages,
                "tools": self.tools, "sampling_temperature": self.sampling_temperature, "created": self.created,
                "next_state": self.next_state, "prompt_text": self.prompt_text, "traceparent": self.traceparent,
                "feedback": self.feedback, "epoch": self.epoch,
                "generation": None if gen is None else {
                    "ids": _b64(gen.response_ids) if arrays else None,
                    "logprobs": _b64(gen.response_logprobs) if arrays else None, "text": gen.text,
                    "finish_reason": gen.finish_reason, "weight_version": gen.weight_version}}

    def array_bytes(self) -> tuple[bytes, bytes | None, bytes | None]:
        """The token arrays ``to_record(arrays=False)`` leaves out, as bytes: prompt ids, response ids, log-probs."""
        gen = self.generation
        if gen is None:
            return self.prompt_ids.tobytes(), None, None
        return self.prompt_ids.tobytes(), gen.response_ids.tobytes(), gen.response_logprobs.tobytes()

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> Turn:
        g = r.get("generation")
        gen = None if g is None else Generation(_unb64("i", g["ids"]), _unb64("d", g["logprobs"]), g["text"],
                                                g["finish_reason"], g.get("weight_version"))
        return cls(session_key=r["session_key"], session_id=r["session_id"], index=r["index"],
                   prompt_ids=_unb64("i", r["prompt_ids"]), messages=r.get("messages"), tools=r.get("tools"),
                   sampling_temperature=r.get("sampling_temperature"), created=r.get("created", time.time()),
                   generation=gen, next_state=r.get("next_state"), prompt_text=r.get("prompt_text"),
                   traceparent=r.get("traceparent"), feedback=r.get("feedback"), epoch=r.get("epoch", ""))


def with_array_bytes(record: dict[str, Any], prompt_ids: bytes | None, response_ids: bytes | None,
                     logprobs: bytes | None) -> dict[str, Any]:
    """A record from ``to_record(arrays=False)`` with the arrays' bytes (``array_bytes``) back in it, as
    ``to_record()`` writes them; a part given as None is left as the record has it."""
    if prompt_ids is not None:
        record["prompt_ids"] = _b64_bytes(prompt_ids)
    gen = record.get("generation")
    if gen is not None:
        if response_ids is not None:
            gen["ids"] = _b64_bytes(response_ids)
        if logprobs is not None:
            gen["logprobs"] = _b64_bytes(logprobs)
    return record


def _b64(values: array) -> str:
    return _b64_bytes(values.tobytes())


def _b64_bytes(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(typecode: str, text: str) -> array:
    out = array(typecode)
    out.frombytes(base64.b64decode(text))
    return out
