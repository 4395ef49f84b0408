"""The training sample: what a finished turn becomes, what the spool stores, what the trainer reads.

``TrainingSample.from_turn`` is the one constructor from a turn. It takes the prompt ids the policy
consumed and the ids it sampled, never re-tokenised text, and checks every per-token field against
the response length. The prompt ids stay an ``array("i")`` (a copy of the turn's) until the spool stores
their bytes: a sample read back (``from_row``) has lists, as the trainer wants. Slime's ``Sample`` is
built from this record in ``openclaw_rl.slime_hooks.samples``.
Loss-mask rule: sampled tokens are 1; a position is 0 only when the mode says so (an excluded turn, or
a position the teacher could not score) and that is recorded in ``metadata``.

The spool stores a sample as ``to_row``: its long arrays (``ARRAY_FIELDS``) as the bytes of an ``array``
each (blob columns), the rest as JSON; ``from_row`` reads both back into the same sample. Ints are
``array('i')`` (or ``'b'`` for the loss mask), floats ``array('d')``: float64, what a Python float and the
JSON path hold, so every value comes back bit for bit, NaN and infinities included. An array that does not
fit its type (a value out of range, a ragged (R, K) list, a non-number) stays in the JSON, as before.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import struct
from array import array
from dataclasses import dataclass, field, fields
from itertools import chain
from typing import Any

from . import codec
from .turns import Turn


@dataclass(slots=True)
class TrainingSample:
    session_id: str  # the client's session id
    turn: int  # 1-based turn number in the session
    kind: str  # "rl", "opd", "combine" (a mode's sample kind)
    # exactly what the policy consumed: a list, or (from_turn) an array("i") of the turn's ids, read as a
    # sequence and never changed in place (8K ids as a list cost ~95 µs to make and ~50 µs to free, per sample)
    prompt_ids: list[int] | array
    response_ids: list[int]  # exactly what it sampled (stop token included)
    rollout_log_probs: list[float]  # (R,) aligned with response_ids
    loss_mask: list[int]  # (R,)
    reward: float  # the scalar reward (Slime reads it as reward["score"])
    status: str = "completed"  # completed | truncated
    teacher_log_probs: list[float] | None = None  # (R,) OPD teacher log-probs
    teacher_topk_log_probs: list[list[float]] | None = None  # (R, K)
    teacher_topk_indices: list[list[int]] | None = None  # (R, K)
    # teacher_source trainer: the hinted teacher prompt's exact ids (prompt + hint, rendered once, never the
    # sampled text re-tokenised); the trainer's frozen teacher scores teacher_prompt_ids + response_ids
    # and fills the teacher fields above at train time (openclaw_rl/embedded/frozen_teacher.py)
    teacher_prompt_ids: list[int] | None = None
    # distill_subset student on Slime: the rollout policy's own top-K ids at each response position (R, K), the
    # ids at which the actor's frozen teacher is read (openclaw_rl/slime_hooks/trainer_teacher.py)
    student_topk_indices: list[list[int]] | None = None
    response_text: str = ""  # the engine's decoded text, for logs and inspection only (never trained on)
    metadata: dict[str, Any] = field(default_factory=dict)  # judge votes, hint, namespace, exactness …
    sample_id: str = ""  # unique id, assigned by the spool
    index: int = -1  # assigned by the spool at delivery (monotonic across restarts)
    # from_turn: the bytes of the turn's arrays that a list field was made from (or of from_turn's ``packed``), by
    # field name, with that list and a copy of it: to_row takes them instead of converting the list again (8K ids:
    # ~60 us with struct.pack, ~1.7x orjson's ~35 us; load 0.2), only while the field still holds that very list
    # with the values it had (the copy: ~15 us and 8 bytes an entry for 8K ids; a value changed in place then
    # makes to_row convert the list). Not a field of the record (no init, compare, repr or JSON).
    _packed: dict[str, tuple[list[Any], list[Any], bytes]] | None = field(default=None, init=False, repr=False,
                                                                          compare=False)

    def __post_init__(self) -> None:
        r = len(self.response_ids)
        checks = {"rollout_log_probs": self.rollout_log_probs, "loss_mask": self.loss_mask,
                  "teacher_log_probs": self.teacher_log_probs, "teacher_topk_log_probs": self.teacher_topk_log_probs,
                  "teacher_topk_indices": self.teacher_topk_indices, "student_topk_indices": self.student_topk_indices}
        for name, values in checks.items():
            if values is not None and len(values) != r:
                raise ValueError(f"{name} has {len(values)} entries for {r} response tokens "
                                 f"(session {self.session_id!r} turn {self.turn})")
        if self.teacher_log_probs is not None and any(not math.isfinite(x) for x in self.teacher_log_probs):
            raise ValueError("teacher_log_probs must be finite; mask unscored positions instead")
        if self.teacher_prompt_ids is not None and (self.teacher_log_probs is not None
                                                    or self.teacher_topk_log_probs is not None):
            raise ValueError("a sample carries either teacher log-probs (teacher_source server) or the teacher "
                             "prompt ids the trainer scores (teacher_source trainer), not both")
        if self.student_topk_indices is not None and self.teacher_prompt_ids is None:
            raise ValueError("student_topk_indices are where the trainer's frozen teacher is read: they need "
                             "teacher_prompt_ids (teacher_source trainer)")

    @classmethod
    def from_turn(cls, turn: Turn, *, kind: str, reward: float, loss_mask: list[int] | None = None,
                  metadata: dict[str, Any] | None = None, packed: dict[str, tuple[list[Any], bytes]] | None = None,
                  **teacher: Any) -> TrainingSample:
        """``packed``: for a flat teacher field, a list no one else holds, equal to the field's value, and the
        bytes of ``array(typecode, that list)`` (``ARRAY_FIELDS``): the hinted prompt's ids with the array the
        renderer built of them. ``to_row`` stores those bytes while the field holds that value with those
        values, as it does the turn's."""
        gen = turn.generation
        if gen is None:
            raise ValueError(f"turn {turn.index} of {turn.session_id!r} has no generation")
        r = len(gen.response_ids)
        meta = {"session_key": turn.session_key, "user": turn.session_key.partition("\x1f")[0],
                "finish_reason": gen.finish_reason,
                "weight_version": gen.weight_version, "sampling_temperature": turn.sampling_temperature,
                "exact_tokens": True, **(metadata or {})}
        # Deterministic id: re-judging a turn after a crash re-creates the same sample, which the spool
        # ignores (exactly-once delivery).
        sample_id = hashlib.sha1(f"{turn.session_key}\x1f{turn.epoch}\x1f{turn.index}\x1f{kind}".encode()).hexdigest()
        prompt = turn.prompt_ids
        sample = cls(session_id=turn.session_id, turn=turn.index, kind=kind, sample_id=sample_id,
                     prompt_ids=prompt[:] if prompt.typecode == "i" else prompt.tolist(),  # a copy of its own
                     response_ids=gen.response_ids.tolist(),
                     rollout_log_probs=gen.response_logprobs.tolist(),
                     loss_mask=[1] * r if loss_mask is None else loss_mask, reward=float(reward),
                     status=gen.status.value, response_text=gen.text, metadata=meta, **teacher)
        mine: dict[str, tuple[list[Any], list[Any], bytes]] = {}
        for name, source in (("response_ids", gen.response_ids), ("rollout_log_probs", gen.response_logprobs)):
            if source.typecode == _TYPECODES[name]:
                value = getattr(sample, name)
                mine[name] = (value, list(value), source.tobytes())
        for name, (snapshot, blob) in (packed or {}).items():
            value = getattr(sample, name)
            if type(value) is list and not _SHAPES[name][1]:
                mine[name] = (value, snapshot, blob)
        sample._packed = mine
        return sample

    @property
    def tokens(self) -> list[int]:
        return [*self.prompt_ids, *self.response_ids]

    @property
    def teacher_source(self) -> str | None:
        """Which teacher signal the sample carries: ``server`` (log-probs), ``trainer`` (prompt ids), None."""
        if self.teacher_prompt_ids is not None:
            return "trainer"
        return "server" if self.teacher_log_probs is not None or self.teacher_topk_log_probs is not None else None

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    def to_json(self) -> str:
        """Compact JSON: orjson (an 8K-token sample in 0.08 ms against json's 1.2 ms), except for a sample
        holding NaN or an infinity, which orjson would write as null: json writes those as it always did."""
        # A shallow field dict: dataclasses.asdict deep-copies every token list (6 ms for 8K tokens); the
        # names are read once (dataclasses.fields builds its tuple on every call)
        obj = dict(zip(_FIELD_NAMES, _field_values(self)))
        if (_finite(self.reward) and _finite(self.rollout_log_probs) and _finite(self.metadata)
                and (self.teacher_log_probs is None or _finite(self.teacher_log_probs))
                and (self.teacher_topk_log_probs is None or _finite(self.teacher_topk_log_probs))):
            return codec.dumps_str(obj)
        return json.dumps(obj, separators=(",", ":"), default=codec.array_as_list)

    @classmethod
    def from_json(cls, text: str) -> TrainingSample:
        return cls(**json.loads(text))

    def to_row(self) -> tuple[str, tuple[bytes | None, ...]]:
        """What the spool stores: the JSON of the sample without its long arrays, and those arrays' bytes in
        ``ARRAY_FIELDS`` order (None for a field that is None or stays in the JSON: see the module docstring)."""
        obj = dict(zip(_FIELD_NAMES, _field_values(self)))
        r = len(self.response_ids)
        packed = self._packed or {}
        blobs: list[bytes | None] = []
        for name, code, two_d in ARRAY_FIELDS:
            value = obj[name]
            source = packed.get(name)
            # the very list, with its values (== compares lengths first, then each entry, an identical one
            # at once); equal but not the same float (0.0 put where -0.0 was) would keep the old bytes
            if source is not None and source[0] is value and source[1] == value:
                blob: bytes | None = source[2]
            elif type(value) is array:  # from_turn's prompt ids: the array's own bytes (the copy it holds)
                blob = value.tobytes() if value.typecode == code else _to_bytes(value.tolist(), code, two_d, r)
            else:
                blob = None if value is None else _to_bytes(value, code, two_d, r)
            if blob is not None:
                del obj[name]
            blobs.append(blob)
        if _finite(obj):
            return codec.dumps_str(obj), tuple(blobs)
        return json.dumps(obj, separators=(",", ":")), tuple(blobs)

    @classmethod
    def from_row(cls, text: str, blobs: tuple[bytes | None, ...] | list[bytes | None]) -> TrainingSample:
        """The sample ``to_row`` wrote (or the JSON of ``to_json``, with no blobs: a row written before the
        arrays moved out, whose JSON holds them)."""
        obj = json.loads(text)
        if any(b is not None for b in blobs):
            values = {name: blob for (name, _, _), blob in zip(ARRAY_FIELDS, blobs) if blob is not None}
            if "response_ids" in values:
                obj["response_ids"] = _from_bytes(values.pop("response_ids"), "i", False, 0)
            r = len(obj["response_ids"])
            for name, blob in values.items():
                code, two_d = _SHAPES[name]
                obj[name] = _from_bytes(blob, code, two_d, r)
        return cls(**obj)

    def summary(self) -> dict[str, Any]:
        """The row ``openclaw-rl samples`` prints."""
        out = {"sample_id": self.sample_id, "index": self.index, "session_id": self.session_id, "turn": self.turn,
               "kind": self.kind, "tokens": self.tokens, "prompt_length": len(self.prompt_ids),
               "response_length": self.response_length, "response_text": self.response_text, "loss_mask": self.loss_mask,
               "rollout_log_probs": self.rollout_log_probs, "reward": self.reward, "status": self.status,
               "metadata": self.metadata}
        for name in ("teacher_log_probs", "teacher_topk_log_probs", "teacher_topk_indices", "teacher_prompt_ids",
                     "student_topk_indices"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


_FIELD_NAMES = tuple(f.name for f in fields(TrainingSample) if f.init)
_field_values = operator.attrgetter(*_FIELD_NAMES)

ARRAY_FIELDS: tuple[tuple[str, str, bool], ...] = (
    # (field, array typecode, (R, K) rows): the spool's blob columns, named after the fields, in this order
    ("prompt_ids", "i", False), ("response_ids", "i", False), ("rollout_log_probs", "d", False),
    ("loss_mask", "b", False), ("teacher_log_probs", "d", False), ("teacher_topk_log_probs", "d", True),
    ("teacher_topk_indices", "i", True), ("teacher_prompt_ids", "i", False), ("student_topk_indices", "i", True))
_TYPECODES = {name: code for name, code, _ in ARRAY_FIELDS}
_SHAPES = {name: (code, two_d) for name, code, two_d in ARRAY_FIELDS}


def _to_bytes(value: Any, code: str, two_d: bool, r: int) -> bytes | None:
    """The bytes of ``value`` as ``array(code)`` (the rows of an (R, K) list one after another), or None when it
    does not fit (a value out of the type's range, a string or None in it, ragged rows): the list then stays in
    the JSON. An int (or a bool) in a float array comes back as the nearest float (equal up to 2**53; no log-prob
    is an int that large), a bool in an int array as the equal int; floats are refused by an int array.
    ``struct.pack`` in the native layout makes exactly ``array(code)``'s bytes and refuses the same values, in
    half the time of ``array.fromlist`` for a flat 8K list (~55 against ~115 µs), a quarter less for (R, K) rows
    (``scripts/bench_sample_rows.py``)."""
    if type(value) is not list:
        return None
    try:
        if not two_d:
            return struct.pack(f"@{len(value)}{code}", *value)
        if len(value) != r:
            return None
        k = len(value[0]) if value else 0
        for row in value:
            if type(row) is not list or len(row) != k:
                return None  # ragged: no K to read it back by
        return struct.pack(f"@{r * k}{code}", *chain.from_iterable(value))
    except (struct.error, OverflowError, TypeError):
        return None


def _from_bytes(blob: bytes, code: str, two_d: bool, r: int) -> list[Any]:
    """The list ``_to_bytes`` stored: flat, or ``r`` rows of the same length."""
    values = array(code)
    values.frombytes(blob)
    flat = values.tolist()
    if not two_d:
        return flat
    if r == 0:
        return []
    k = len(flat) // r
    return [flat[i:i + k] for i in range(0, r * k, k)] if k else [[] for _ in range(r)]


_PLAIN = frozenset((str, int, bool, type(None)))  # types that hold no float


def _finite(value: Any) -> bool:
    """No NaN or infinity in a float, a (nested) list or a dict's values. A list of floats is summed in C:
    a NaN or infinity makes the sum non-finite (so may an overflow, which only costs the json path)."""
    kind = type(value)
    if kind in _PLAIN:  # the usual metadata values, answered without the checks below
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        try:
            return math.isfinite(sum(value))
        except TypeError:  # nested lists, None, strings: one by one
            return all(map(_finite, value))
    if isinstance(value, dict):
        return all(map(_finite, value.values()))
    return True
