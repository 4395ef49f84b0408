"""SGLang-compatible HTTP layer over a token-level model core (``EngineModel``).

Stage: client (proxy, judge, teacher) → **engine server** → core. It owns everything real SGLang 0.5.23
decides above sampling, so that a client cannot tell the two apart: text prompts are tokenised,
batches and ``n`` expanded, stop tokens and strings checked and trimmed, stream chunks made cumulative
with incomplete UTF-8 held back (or, with ``incremental_streaming_output``, holding only the new
text, ids and log-probs, as SGLang's ``--incremental-streaming-output``), input log-probs laid out with SGLang's null first entry, errors shaped
as SGLang shapes them, and out-of-vocabulary ids "crash" the server. It deliberately does not sample,
batch forward passes or cache KV (the core does), and serves no ``/v1/chat/completions``. The routes themselves: ``app.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from openclaw_rl.engine.model import EngineModel, TokenStep
from openclaw_rl.engine.protocol import (
    FLUSH_REFUSED,
    SAMPLING_FIELDS,
    SSE_DONE,
    EngineRequestError,
    GenerateRequest,
    GenerationItem,
    OutOfVocabIds,
    UpdateWeightsFromDiskRequest,
    compact_json,
    error_body,
    finish_abort,
    finish_length,
    finish_stop,
    logprob_fields,
    meta_info,
    sse_event,
    stream_error_body,
    unknown_field_body,
    update_weights_body,
    weight_version_segments,
)
from openclaw_rl.servers import RAW_SEND

logger = logging.getLogger(__name__)



class TokenizerLike(Protocol):
    """The slice of a Hugging Face tokenizer the server uses (text prompts, output text, token texts)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...


class EngineCrashed(RuntimeError):
    """Raised instead of dropping the connection when the ASGI server is not uvicorn."""


async def _drop_connection(send: Any) -> None:
    """Close the client's TCP connection without any response, as a dead SGLang process does.

    Uvicorn's ``send`` is a bound method of its per-request cycle, which holds the transport. Closing
    it and yielding once lets uvicorn's ``connection_lost`` mark the cycle disconnected, so uvicorn
    writes no 500 of its own. Under another server, raise: the client still gets no answer.
    """
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        raise EngineCrashed("the engine has crashed (out-of-vocabulary input ids)")
    transport.close()
    for _ in range(2):
        await asyncio.sleep(0)


@dataclass(slots=True)
class _Run:
    """The growing state of one GenerationItem; every output (chunk or final) is built from it."""

    item: GenerationItem
    started: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    output_logprobs: list[list[Any]] = field(default_factory=list)
    output_top: list[list[list[Any]]] = field(default_factory=list)
    input_logprobs: list[Any] = field(default_factory=list)
    input_top: list[Any] = field(default_factory=list)
    next_top: list[list[Any]] | None = None
    """The extra ``output_top_logprobs`` entry SGLang adds when max_new_tokens is 0."""
    finish: dict[str, Any] | None = None


class _HeldBackText:
    """Streamed text that never ends inside a UTF-8 sequence (SGLang's detokenizer rule): while the
    newest tokens decode to a trailing U+FFFD, the previous text is repeated. It catches up, with the
    U+FFFD if the bytes stay invalid, as soon as a later token decodes cleanly."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.text = ""
        self._decode = decode
        self._surr = self._read = 0

    def update(self, ids: list[int]) -> str:
        prefix = self._decode(ids[self._surr:self._read])
        new = self._decode(ids[self._surr:])
        if len(new) > len(prefix) and not new.endswith("\ufffd"):
            self.text += new[len(prefix):]
            self._surr, self._read = self._read, len(ids)
        return self.text


class EngineService:
    """What the routes call: request expansion, the per-token loop, output building, control state."""

    def __init__(self, model: EngineModel, tokenizer: TokenizerLike, *, served_model_name: str, model_path: str,
                 crash_on_bad_ids: bool = True, max_total_num_tokens: int | None = None,
                 incremental_streaming_output: bool = False, stream_interval: int = 1,
                 refused_sampling_fields: frozenset[str] = frozenset()):
        self.model = model
        # keys answered with SGLang's "unknown field" 400, as an SGLang without them would (compatibility tests)
        self.refused_sampling_fields = refused_sampling_fields
        self.incremental_streaming_output = incremental_streaming_output
        self.stream_interval = stream_interval  # SGLang's --stream-interval: a request's own value wins
        self.tokenizer = tokenizer
        self.served_model_name = served_model_name
        self.model_path = model_path
        self.crash_on_bad_ids = crash_on_bad_ids
        self.max_total_num_tokens = max_total_num_tokens or 4 * model.context_length
        self.created = int(time.time())
        self.crashed = False
        """Set once out-of-vocabulary ids arrived with crash_on_bad_ids: every later request is dropped."""
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._pause_mode = ""  # SGLang's pause mode while paused ("abort", "retract" or "in_place")
        self._abort_epoch = 0  # a pause in abort mode ends every request that started before it
        self._aborted = asyncio.Event()  # set (and replaced) by each such pause: wakes the held requests
        self._running = 0  # requests dispatched (past a pause they arrived in) and not finished
        self.held_arrivals = 0
        """Requests that arrived during a pause and wait to be dispatched (SGLang's queue before its scheduler)."""
        self.held_running = 0
        """Running requests a pause (``in_place``, ``retract``) holds between two tokens until ``continue``."""
        self._idle = asyncio.Event()  # set while none runs: an unpaused weight update waits for it
        self._idle.set()
        self.waiting_updates = 0
        """Unpaused weight updates waiting for the running requests to finish (SGLang's model-update lock)."""
        self._reported_version: str | None = None  # /get_model_info's, while it lags the weights (see below)
        self._token_texts: dict[int, str] = {}

    # --- /generate ------------------------------------------------------------------------------

    async def generate(self, body: GenerateRequest, request: Request) -> Response:
        refused = self._refused_field(body.sampling_params)
        if refused:
            known = [k for k in SAMPLING_FIELDS if k not in self.refused_sampling_fields]
            return json_response(unknown_field_body(refused, known), status_code=400)
        try:
            items = body.to_items(self.tokenizer.encode, context_length=self.model.context_length,
                                  vocab_size=self.model.vocab_size)
        except OutOfVocabIds as exc:
            if self.crash_on_bad_ids:
                return await self.crash(request, exc.message)
            return self._reject(exc.message, stream=body.stream)
        except EngineRequestError as exc:
            return self._reject(exc.message, stream=body.stream)
        refused_lora = self._refused_lora(items)
        if refused_lora:
            return self._reject(refused_lora, stream=body.stream)
        if body.stream:
            return StreamingResponse(self._stream(items, body.returns_list), media_type="text/event-stream")
        outputs = await asyncio.gather(*(self._complete(item) for item in items))
        return json_response(outputs if body.returns_list else outputs[0])

    def _refused_lora(self, items: list[Any]) -> str | None:
        """Why a ``lora_path`` cannot be served (LoRA not enabled, an adapter not loaded), or None."""
        wanted = sorted({item.lora for item in items if item.lora})
        if not wanted:
            return None
        served = getattr(self.model, "adapter_names", lambda: None)()
        if served is None:
            return "lora_path is not supported by this engine (LoRA is not enabled)."
        missing = [name for name in wanted if name not in served]
        if missing:
            return f"The following requested LoRA adapters are not loaded: {', '.join(missing)}"
        if any(item.lora and item.logprob_start_len >= 0 for item in items):
            return "input log-probs (logprob_start_len) with a lora_path are not supported by this engine."
        return None

    def _refused_field(self, params: Any) -> str | None:
        """A ``sampling_params`` key SGLang 0.5.23 would refuse: one it does not know, or one this engine
        was told to refuse (an older SGLang). A client that sends a misspelt key learns it here, as
        from SGLang, instead of having it ignored."""
        for one in params if isinstance(params, list) else [params]:
            for key in one if isinstance(one, dict) else {}:
                if key not in SAMPLING_FIELDS or key in self.refused_sampling_fields:
                    return key
        return None

    @staticmethod
    def _reject(message: str, *, stream: bool) -> Response:
        if stream:  # SGLang streams validation errors as an event on an HTTP 200
            events = [sse_event(stream_error_body(message)), SSE_DONE]
            return StreamingResponse(iter(events), media_type="text/event-stream")
        return json_response(error_body(message), status_code=400)

    async def crash(self, request: Request, reason: str) -> Response:
        """Die as CPU SGLang does: no response now, and every later request is dropped."""
        self.crashed = True
        logger.error("engine crashed like SGLang would (%s); all later requests are dropped", reason)
        await _drop_connection(request.scope[RAW_SEND])
        return Response(status_code=500)  # reaches nobody: the connection is already closed

    async def _complete(self, item: GenerationItem) -> dict[str, Any]:
        run = [snapshot async for snapshot in self._drive(item)][-1]  # one object, yielded once per token
        return self._output(run, self._final_text(run), final=True, first=True)

    async def _stream(self, items: list[GenerationItem], as_list: bool) -> AsyncIterator[bytes]:
        chunks = self._merged(items) if as_list else self._chunks(items[0])
        try:
            async for chunk in chunks:
                yield sse_event(chunk)
            yield SSE_DONE
        finally:
            await chunks.aclose()

    async def _chunks(self, item: GenerationItem) -> AsyncGenerator[dict[str, Any], None]:
        """One output per ``stream_interval`` tokens (SGLang's rule: the first token at once, then whenever
        at least that many tokens are unsent, and the finish always): cumulative (SGLang's default
        ``incremental_streaming_output=false``), or only what is new since the previous chunk
        (``--incremental-streaming-output``). In both, ``completion_tokens`` and
        ``output_token_logprobs_length`` count everything so far. The text is decoded only for an output
        (SGLang's detokenizer sees only the outputs), so its held-back UTF-8 follows the same steps."""
        skip = item.params.skip_special_tokens
        interval = item.params.stream_interval or self.stream_interval
        text = _HeldBackText(lambda ids: self.tokenizer.decode(ids, skip_special_tokens=skip))
        runs = self._drive(item)
        first, sent_ids, sent_text = True, 0, ""
        try:
            async for run in runs:
                final = run.finish is not None
                unsent = len(run.output_ids) - sent_ids
                if not (final or interval == 1 or unsent >= interval or (not sent_ids and unsent > 0)):
                    continue
                if not final and self._may_become_a_stop_string(run):
                    continue  # held, as SGLang does: a streamed text never shows what the stop trims away
                shown = self._final_text(run) if final else text.update(run.output_ids)
                if not self.incremental_streaming_output:
                    yield self._output(run, shown, final=final, first=first)
                else:
                    delta = shown[len(sent_text):] if shown.startswith(sent_text) else ""
                    yield self._output(run, delta, final=final, first=first, since=sent_ids)
                    sent_text = shown if len(shown) > len(sent_text) else sent_text
                sent_ids, first = len(run.output_ids), False
        finally:
            await runs.aclose()

    async def _merged(self, items: list[GenerationItem]) -> AsyncGenerator[dict[str, Any], None]:
        """Chunks of several sequences in arrival order, each tagged with its ``index`` (SGLang's batch stream)."""
        streams = [self._chunks(item) for item in items]
        pending = {asyncio.ensure_future(stream.__anext__()): i for i, stream in enumerate(streams)}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    index = pending.pop(task)
                    if isinstance(task.exception(), StopAsyncIteration):
                        continue
                    chunk = task.result()
                    chunk["index"] = index
                    yield chunk
                    pending[asyncio.ensure_future(streams[index].__anext__())] = index
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for stream in streams:
                await stream.aclose()

    async def _drive(self, item: GenerationItem) -> AsyncGenerator[_Run, None]:
        """Score the input if asked, then pull tokens from the core until SGLang would finish; yields
        the run after every token (once, finished, when max_new_tokens is 0)."""
        run = _Run(item)
        if item.return_logprob:
            await self._score_input(run)
        if item.max_new_tokens == 0:
            run.finish = finish_length(0)
            yield run
            return
        if not self._unpaused.is_set():  # SGLang holds a request that arrives during a pause before dispatch
            self.held_arrivals += 1
            try:
                await self._unpaused.wait()
            finally:
                self.held_arrivals -= 1
        steps = self.model.generate(item.input_ids, item.sampling_config())
        epoch = self._abort_epoch
        self._running += 1
        self._idle.clear()
        try:
            while run.finish is None:
                if not self._unpaused.is_set() and epoch == self._abort_epoch:
                    self.held_running += 1  # /pause_generation holds every running request between tokens
                    try:
                        await self._held()
                    finally:
                        self.held_running -= 1
                if epoch != self._abort_epoch:
                    # ... and in abort mode ends those it found. SGLang runs an aborted request one more
                    # decode step first, so its output may end with any token, even its EOS.
                    with contextlib.suppress(StopAsyncIteration):
                        self._append(run, await steps.__anext__())
                    run.finish = finish_abort()
                    yield run
                    break
                try:
                    step = await steps.__anext__()
                except StopAsyncIteration:
                    raise RuntimeError(f"model core stopped after {len(run.output_ids)} of "
                                       f"{item.max_new_tokens} tokens") from None
                self._append(run, step)
                run.finish = self._finish_reason(run)
                yield run
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()
            await steps.aclose()

    async def _held(self) -> None:
        """Until generation continues, or a pause in abort mode ends this request."""
        waits = [asyncio.ensure_future(self._unpaused.wait()), asyncio.ensure_future(self._aborted.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _score_input(self, run: _Run) -> None:
        """SGLang's input log-prob layout for ``logprob_start_len = k``: one entry per id in ids[k:],
        the first always null; the core scores positions k+1 onwards, never temperature-scaled."""
        item, ids = run.item, run.item.input_ids
        k, top_k = item.logprob_start_len, item.top_logprobs_num
        want_next = item.max_new_tokens == 0 and top_k > 0
        if k < 0 and not want_next:
            return
        start = len(ids) if k < 0 else min(k + 1, len(ids))
        scores = await self.model.score(ids, start, top_k)
        if len(scores.token_logprobs) != len(ids) - start:
            raise RuntimeError(f"model core scored {len(scores.token_logprobs)} positions, expected {len(ids) - start}")
        if 0 <= k < len(ids):
            run.input_logprobs = [self._triple(item, None, ids[k])]
            run.input_logprobs += [self._triple(item, lp, ids[start + j]) for j, lp in enumerate(scores.token_logprobs)]
            if top_k:
                run.input_top = [None] + [[self._triple(item, lp, t) for lp, t in top] for top in scores.top_logprobs]
        if want_next:
            run.next_top = [self._triple(item, lp, t) for lp, t in scores.next_top_logprobs]

    def _append(self, run: _Run, step: TokenStep) -> None:
        item = run.item
        run.output_ids.append(step.token_id)
        run.versions.append(step.weight_version)
        if item.return_logprob:
            run.output_logprobs.append(self._triple(item, step.logprob, step.token_id))
            if item.top_logprobs_num:
                run.output_top.append([self._triple(item, lp, t) for lp, t in step.top_logprobs])

    def _finish_reason(self, run: _Run) -> dict[str, Any] | None:
        """SGLang's check order: length first, then stop/eos tokens (all off with ignore_eos), then strings."""
        item, ids = run.item, run.output_ids
        if len(ids) >= item.max_new_tokens:
            return finish_length(item.max_new_tokens)
        last = ids[-1]
        if not item.params.ignore_eos and (last in item.stop_token_ids or last in self.model.eos_token_ids):
            return finish_stop(last)
        if item.params.stop_strings:
            tail = self.tokenizer.decode(ids[-item.stop_window:], skip_special_tokens=False)
            for stop in item.params.stop_strings:
                if stop in tail:
                    return finish_stop(stop)
        return None

    def _may_become_a_stop_string(self, run: _Run) -> bool:
        """SGLang's ``check_match_stop_str_prefix``: the output's tail holds a stop string or ends with the
        start of one. SGLang sends no stream event then, so the trimmed text never shrinks mid-stream."""
        stops = [s for s in run.item.params.stop_strings or () if s]
        if not stops:
            return False
        tail = self.tokenizer.decode(run.output_ids[-run.item.stop_window:], skip_special_tokens=False)
        return any(stop in tail or any(tail.endswith(stop[:i]) for i in range(1, min(len(tail), len(stop)) + 1))
                   for stop in stops)

    def _final_text(self, run: _Run) -> str:
        """The matched stop token is cut before decoding and a matched string after, unless no_stop_trim."""
        params = run.item.params
        matched = (run.finish or {}).get("matched")
        trim = not params.no_stop_trim
        ids = run.output_ids[:-1] if trim and isinstance(matched, int) else run.output_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
        if trim and isinstance(matched, str) and matched in text:
            text = text[:text.index(matched)]
        return text

    def _triple(self, item: GenerationItem, logprob: float | None, token_id: int) -> list[Any]:
        if not item.return_text_in_logprobs:
            return [logprob, token_id, None]
        if token_id not in self._token_texts:
            self._token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return [logprob, token_id, self._token_texts[token_id]]

    def _output(self, run: _Run, text: str, *, final: bool, first: bool, since: int = 0) -> dict[str, Any]:
        """An output object; ``since`` > 0 keeps only the ids and output log-probs from there on."""
        item = run.item
        version = run.versions[-1] if run.versions else self.model.weight_version
        logprobs = None
        if item.return_logprob:
            tops = item.top_logprobs_num > 0
            output_top = run.output_top + ([run.next_top] if run.next_top is not None else [])
            logprobs = logprob_fields(run.input_logprobs, run.output_logprobs[since:],
                                      run.input_top if tops else None, output_top[since:] if tops else None,
                                      length=len(run.output_logprobs))
        meta = meta_info(rid=item.rid, finish_reason=run.finish if final else None, prompt_tokens=len(item.input_ids),
                         weight_version=version, completion_tokens=len(run.output_ids), logprobs=logprobs,
                         weight_versions=weight_version_segments(run.versions, version) if final else None,
                         e2e_latency=time.monotonic() - run.started if final else None, sent_to_client=first)
        return {"text": text, "output_ids": run.output_ids[since:], "meta_info": meta}

    # --- control --------------------------------------------------------------------------------

    @property
    def reported_weight_version(self) -> str:
        return self._reported_version or self.model.weight_version

    async def update_weights(self, body: UpdateWeightsFromDiskRequest) -> Response:
        """As SGLang 0.5.23: unpaused, the update waits for the running requests (each holds the model
        update lock's reader side while it generates) and then flushes; paused, it runs at once, and
        the flush fails if running requests are still in the batch (``in_place``)."""
        if self._unpaused.is_set():
            self.waiting_updates += 1
            try:
                await self._idle.wait()
            finally:
                self.waiting_updates -= 1
        before = self.reported_weight_version
        try:
            await self.model.update_weights_from_disk(body.model_path, body.weight_version)
        except Exception as exc:  # the core's failure is the caller's answer (success: false), not a 500
            logger.exception("update_weights_from_disk(%s) failed", body.model_path)
            return json_response(update_weights_body(False, f"Failed to update weights: {exc}"), status_code=400)
        self.model_path = body.model_path
        if (body.model_extra or {}).get("flush_cache", True) and not self._flushable():
            # SGLang 0.5.23 paused in place: the new weights serve (generations report their version), but
            # the old weights' cache cannot be flushed under running requests, so the call fails and
            # /get_model_info keeps the old version
            self._reported_version = before
            logger.error("%s", FLUSH_REFUSED)
            return json_response(update_weights_body(False, FLUSH_REFUSED), status_code=400)
        self._reported_version = None
        message = "Succeeded to update model weights."
        if body.weight_version is not None:
            message += f" Weight version updated to {body.weight_version}."
        return json_response(update_weights_body(True, message))

    def set_paused(self, paused: bool, mode: str = "abort") -> None:
        """SGLang's pause modes: ``abort`` (its default, and Slime's) ends the running requests with an
        ``abort`` finish and holds later ones until ``continue``; ``retract`` and ``in_place`` hold the
        running ones between two tokens (SGLang's ``retract`` would recompute their KV; not modelled
        beyond the cache flush it allows)."""
        if paused:
            self._pause_mode = mode
            self._unpaused.clear()
            if mode == "abort":
                self._abort_epoch += 1
                self._aborted.set()
                self._aborted = asyncio.Event()
        else:
            self._pause_mode = ""
            self._unpaused.set()

    @property
    def paused(self) -> bool:
        """Between ``/pause_generation`` and ``/continue_generation`` (any mode)."""
        return not self._unpaused.is_set()

    def _flushable(self) -> bool:
        """SGLang flushes its cache only with no request running, or when paused in a mode that took the
        running ones out of the batch (``abort``, ``retract``); paused ``in_place``, they stay in it."""
        return not self._running or self._pause_mode in ("abort", "retract")


def json_response(obj: Any, status_code: int = 200) -> Response:
    return Response(compact_json(obj), status_code=status_code, media_type="application/json")
