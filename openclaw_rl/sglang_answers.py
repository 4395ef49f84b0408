"""What SGLang's ``/generate`` answers mean: one answer parsed and checked, an aborted one resumed, and
a stream's bytes assembled into snapshots (split out of ``backend.py``, which sends the requests).

Stage: backend → **answer parsing** (pure functions and byte handling, no I/O of its own).

How a stream's bytes become snapshots: ``sglang_stream.py``.
"""


from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .errors import (
    BackendUnavailable,
    BadRequest,
    GenerationAborted,
)


@dataclass(slots=True)
class GenerateResult:
    """One /generate answer (final, or a cumulative streaming snapshot)."""

    text: str
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None  # None while streaming; "stop" | "length" | "abort" at the end
    prompt_tokens: int
    weight_version: str | None
    resumable: bool = False  # an "abort" without a status code: a pause (Slime's weight update), not an error
    top_logprobs: list[list[tuple[float, int]]] | None = None  # per output token, when top_logprobs_num was asked


def _check_error(data: Any) -> dict[str, Any]:
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict):
        raise BackendUnavailable("policy backend answered an unexpected JSON shape")
    if "error" in data:
        err = data["error"]
        message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        raise BadRequest(f"policy backend rejected the request: {message}")
    return data


def _finish_and_version(meta: dict[str, Any]) -> tuple[str | None, str | None, bool]:
    """(finish type, weight version, whether an abort is a pause's rather than an error)."""
    fr = meta.get("finish_reason")
    finish = fr.get("type") if isinstance(fr, dict) else fr
    version = meta.get("weight_version")
    segments = meta.get("weight_versions") or []
    if len(segments) > 1:  # the weights changed mid-generation: no single version produced it
        version = "mixed:" + ",".join(str(seg.get("version")) for seg in segments if isinstance(seg, dict))
    return finish, version, finish == "abort" and isinstance(fr, dict) and fr.get("status_code") is None


MAX_RESUMES = 3
"""Aborted-by-a-pause generations resumed per request; a fourth abort ends it as an error."""


def settle_abort(payload: dict[str, Any], done: GenerateResult, end_ids: frozenset[int]) -> GenerateResult:
    """What an abort really ended. SGLang runs an aborted request one more decode step before it ends it,
    so the output may already be complete: ending with an end-of-reply token (a "stop"), or filling the
    token budget (a "length"). Only an abort that cut the reply short is one to resume."""
    if done.finish_reason != "abort":
        return done
    if done.output_ids and done.output_ids[-1] in end_ids:
        return replace(done, finish_reason="stop", resumable=False)
    budget = (payload.get("sampling_params") or {}).get("max_new_tokens")
    if budget is not None and len(done.output_ids) >= budget:
        return replace(done, finish_reason="length", resumable=False)
    return done


def resumable(payload: dict[str, Any], done: GenerateResult) -> bool:
    """A pause's abort (no status code), in a request without stop strings: SGLang matches those in a
    request's own output only, so one that straddled the resume point would be missed."""
    return done.finish_reason == "abort" and done.resumable and not (payload.get("sampling_params") or {}).get("stop")


def continuation(payload: dict[str, Any], done: GenerateResult) -> dict[str, Any] | None:
    """The request that goes on from ``done``'s tokens: its ids appended to the prompt (ids, never text),
    the token budget reduced by as many; None when no budget is left."""
    params = payload.get("sampling_params") or {}
    budget = params.get("max_new_tokens")
    if budget is not None and budget - len(done.output_ids) <= 0:
        return None
    rest = {**params} if budget is None else {**params, "max_new_tokens": budget - len(done.output_ids)}
    return {**payload, "input_ids": [*payload["input_ids"], *done.output_ids], "sampling_params": rest}


def joined(done: GenerateResult, more: GenerateResult,
           decode: Callable[[list[int]], str] | None = None) -> GenerateResult:
    """One reply from a generation and its continuation; their versions ``mixed:`` when they differ.

    Each part's text is SGLang's decode of that part's ids alone, so a character whose bytes span the
    two parts shows as replacement characters in both; then the text is ``decode`` of all the ids
    (without a trailing replacement character while the reply still streams, as SGLang holds an
    incomplete character back)."""
    versions = [v for r in (done, more) if r.weight_version is not None
                for v in (r.weight_version.removeprefix("mixed:").split(",") if r.weight_version.startswith("mixed:")
                          else [r.weight_version])]
    distinct = list(dict.fromkeys(versions))
    version = distinct[0] if len(distinct) == 1 else ("mixed:" + ",".join(distinct) if distinct else None)
    ids = done.output_ids + more.output_ids
    text = done.text + more.text
    if decode is not None and (done.text.endswith("\ufffd") or more.text.startswith("\ufffd")):
        text = decode(ids)
        if more.finish_reason is None:
            text = text.rstrip("\ufffd")
    parts = [r.top_logprobs if r.top_logprobs is not None or r.output_ids else [] for r in (done, more)]
    tops = None if None in parts else parts[0] + parts[1]  # a part without tokens (aborted in the queue) has none
    return GenerateResult(text, ids, done.logprobs + more.logprobs, more.finish_reason, done.prompt_tokens, version,
                          more.resumable, tops)


def _unresumed(result: GenerateResult, resumes: int) -> GenerationAborted:
    why = (f", resumed {resumes} times" if resumes >= MAX_RESUMES else
           "; not resumed: the abort carries an error status" if not result.resumable else
           "; not resumed: a request with stop strings")
    return GenerationAborted(f"policy backend aborted the generation after {len(result.output_ids)} tokens{why}")


def _completion_tokens(meta: dict[str, Any]) -> int | None:
    n = meta.get("completion_tokens")
    return None if n is None else int(n)


_LOGPROB, _TOKEN = operator.itemgetter(0), operator.itemgetter(1)


def _aligned_logprobs(ids: list[int], triples: list[Any]) -> list[float]:
    """The log-probs of ``triples`` (``[logprob, id, text]``), which must score exactly ``ids``. Per token
    this runs in C (``map``): it is the one loop over every token of a streamed reply."""
    if len(triples) != len(ids) or list(map(int, map(_TOKEN, triples))) != ids:
        raise BackendUnavailable("policy backend log-probs do not match its output ids (return_logprob off?)")
    return list(map(float, map(_LOGPROB, triples)))


def _top_logprobs(ids: list[int], rows: Any) -> list[list[tuple[float, int]]] | None:
    """``output_top_logprobs`` (per output token, ``[[logprob, id, text], …]``) as (logprob, id) pairs."""
    if not rows:
        return None
    if len(rows) != len(ids):
        raise BackendUnavailable(f"policy backend sent top log-probs for {len(rows)} of {len(ids)} tokens")
    return [[(float(lp), int(t)) for lp, t, *_ in row] for row in rows]


def parse_generate(data: Any, *, final: bool) -> GenerateResult:
    """A whole (non-streamed) ``/generate`` object."""
    data = _check_error(data)
    try:
        meta = data["meta_info"]
        ids = [int(t) for t in data["output_ids"]]
        logprobs = _aligned_logprobs(ids, meta.get("output_token_logprobs") or [])
        finish, version, pause_abort = _finish_and_version(meta)
        if final and finish is None:
            raise BackendUnavailable("policy backend ended without a finish_reason")
        n = _completion_tokens(meta)
        if n is not None and n != len(ids):
            raise BackendUnavailable(f"policy backend reports {n} completion tokens but sent {len(ids)} ids")
        return GenerateResult(str(data.get("text") or ""), ids, logprobs, finish, int(meta.get("prompt_tokens", 0)),
                              version, pause_abort, _top_logprobs(ids, meta.get("output_top_logprobs")))
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise BackendUnavailable(f"policy backend answered malformed /generate output: {e!r}") from e
