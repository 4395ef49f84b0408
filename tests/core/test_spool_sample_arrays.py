"""A training sample's long arrays stored as blob columns beside its JSON (issue #33 item 2, the writer's fifth
pass): every kind of sample the modes build comes back from the spool equal, floats bit for bit; a spool
written before the columns existed opens and reads as it did; the cap counts the blobs."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import struct
from array import array

import pytest
import spool_schemas

from openclaw_rl.samples import ARRAY_FIELDS, TrainingSample
from openclaw_rl.spool import Spool, SpoolFull
from openclaw_rl.turns import Generation, Turn

# values a float64 must keep exactly: a subnormal, negative zero, thirds, the largest finite, and infinities/NaN
# where a field may hold them (the rollout's and the top-K padding's)
TRICKY = [-1 / 3, -0.0, -5e-324, -1.7976931348623157e308, -2.220446049250313e-16, -12.5]


def _turn(index: int = 1, *, nonfinite: bool = False) -> Turn:
    logprobs = TRICKY + ([-math.inf, math.nan] if nonfinite else [-0.5, -0.25])
    r = len(logprobs)
    turn = Turn(session_key="alice\x1fs", session_id="s", index=index, prompt_ids=array("i", [7, 2**31 - 1, 0, 151643]),
                messages=None, tools=None, sampling_temperature=0.7, epoch="e")
    turn.generation = Generation(array("i", range(100, 100 + r)), array("d", logprobs), "r\u00e9ply", "stop", "v3")
    return turn


def _samples() -> list[TrainingSample]:
    """One of each kind the modes build, through their own constructors where they are plain functions."""
    from openclaw_opd.scorer import HintedJudgement, distillation_sample
    from openclaw_opd.teacher import TeacherSignal

    turn = _turn()
    r = turn.response_length
    teacher = [x - 0.125 for x in TRICKY] + [-1e-3, -7.0]
    mask = [1] * (r - 1) + [0]
    rl = TrainingSample.from_turn(turn, kind="rl", reward=-1.0, loss_mask=mask, metadata={"judge_votes": [-1, -1, 1]})
    rl_nonfinite = TrainingSample.from_turn(_turn(2, nonfinite=True), kind="rl", reward=1.0)
    token = distillation_sample(turn, HintedJudgement(None, None, hint="h", teacher=TeacherSignal(teacher, mask)),
                                "opd", 1.0)
    topk_lp = [[x, x - 1.0, -math.inf] for x in teacher]
    topk_ids = [[5, 151643, 0] for _ in range(r)]
    topk = distillation_sample(turn, HintedJudgement(None, None, hint="h", teacher=TeacherSignal(
        teacher, mask, topk_lp, topk_ids)), "opd", 1.0)
    trainer = distillation_sample(turn, HintedJudgement(None, None, hint="h", teacher=TeacherSignal(
        [], [1] * r, prompt_ids=[9, 8, 7, 2**31 - 1])), "opd", 1.0)
    trainer.student_topk_indices = [[i, i + 1] for i in range(r)]  # distill_subset (set by the rollout on Slime)
    # combine's RL branch, as CombineScorer._rl_only builds it: the rollout as the teacher, top-K padded with -inf
    rollout = turn.generation.response_logprobs.tolist()
    ids = turn.generation.response_ids.tolist()
    combine = TrainingSample.from_turn(turn, kind="combine", reward=1.0, teacher_log_probs=rollout,
                                       teacher_topk_log_probs=[[lp] + [-math.inf] * 3 for lp in rollout],
                                       teacher_topk_indices=[[t] + [0] * 3 for t in ids],
                                       metadata={"branch": "rl", "eval_score": 1.0})
    plain = TrainingSample(session_id="p", turn=3, kind="rl", prompt_ids=[1, 2], response_ids=[3],
                           rollout_log_probs=[-0.1], loss_mask=[1], reward=0.0, metadata={"x": math.inf})
    empty_rows = TrainingSample(session_id="q", turn=1, kind="opd", prompt_ids=[1], response_ids=[2, 3],
                                rollout_log_probs=[-0.1, -0.2], loss_mask=[1, 1], reward=1.0,
                                teacher_topk_log_probs=[[], []], teacher_topk_indices=[[], []])
    out = [rl, rl_nonfinite, token, topk, trainer, combine, plain, empty_rows]
    for i, s in enumerate(out):
        s.sample_id = f"{i:032d}"
    return out


def _exact(value):
    """A value with every float as its IEEE bytes (NaN == NaN, -0.0 != 0.0) and every type kept."""
    if isinstance(value, float):
        return ("f", struct.pack("<d", value))
    if isinstance(value, (list, array)):  # from_turn's prompt ids are the turn's array("i"): its values count
        return [_exact(v) for v in value]
    if isinstance(value, dict):
        return {k: _exact(v) for k, v in value.items()}
    return (type(value).__name__, value)


def _same(got: TrainingSample, want: TrainingSample) -> None:
    for f in dataclasses.fields(TrainingSample):
        if f.init and f.name != "index":
            assert _exact(getattr(got, f.name)) == _exact(getattr(want, f.name)), f.name


def _stored(spool: Spool) -> list[tuple]:
    cols = ", ".join(name for name, _, _ in ARRAY_FIELDS)
    return spool._db.execute(f"SELECT payload, {cols} FROM samples ORDER BY seq").fetchall()


def test_every_kind_of_sample_comes_back_from_the_spool_exact_with_its_arrays_as_blobs(tmp_path):
    want = _samples()
    spool = Spool(tmp_path)
    spool.put(want)
    for (payload, *blobs), s in zip(_stored(spool), want):
        keys = json.loads(payload).keys()
        for (name, _, _), blob in zip(ARRAY_FIELDS, blobs):
            if getattr(s, name) is None:
                assert blob is None and name in keys
            else:  # out of the JSON, in its column
                assert blob is not None and name not in keys, name
    # the prompt ids are the turn's own bytes, the log-probs float64 (not float32)
    assert _stored(spool)[0][1] == _turn().prompt_ids.tobytes() and len(_stored(spool)[0][3]) == 8 * 8
    for got, s in zip(spool.iter_samples(), want):
        _same(got, s)
    _, leased = spool.lease(len(want))
    assert len(leased) == len(want)
    for got, s in zip(leased, want):
        _same(got, s)
    spool.close()


def test_an_array_that_does_not_fit_its_blob_stays_in_the_json_and_comes_back_exact(tmp_path):
    """Ragged top-K rows, an id beyond 32 bits, a float in the loss mask (weights), a NaN where JSON has it:
    no blob for those fields, their JSON as before."""
    odd = TrainingSample(session_id="o", turn=1, kind="opd", prompt_ids=[1, 2**40], response_ids=[3, 4],
                         rollout_log_probs=[-0.1, math.nan], loss_mask=[1.0, 0.5], reward=1.0,
                         teacher_topk_log_probs=[[-1.0, -2.0], [-1.0]], teacher_topk_indices=[[1, 2], [3]])
    spool = Spool(tmp_path)
    spool.put([odd])
    ((payload, *blobs),) = _stored(spool)
    inline = {name for (name, _, _), blob in zip(ARRAY_FIELDS, blobs) if blob is None}
    assert {"prompt_ids", "loss_mask", "teacher_topk_log_probs", "teacher_topk_indices"} <= inline
    assert "response_ids" not in inline and "rollout_log_probs" not in inline
    assert json.loads(payload)["prompt_ids"] == [1, 2**40]
    _same(next(spool.iter_samples()), odd)
    spool.close()


def test_a_field_replaced_after_from_turn_is_stored_as_it_is_not_as_the_turn_had_it(tmp_path):
    """from_turn hands the turn's array bytes to to_row; a list put in the field since (or a copy with other
    ids) must be what is stored."""
    turn = _turn()
    s = TrainingSample.from_turn(turn, kind="rl", reward=1.0)
    s.prompt_ids = [4, 5, 6, 8]  # as many as the turn's: only the list's identity tells them apart
    copy = dataclasses.replace(s, response_ids=s.response_ids[::-1], sample_id="other")
    spool = Spool(tmp_path)
    spool.put([s, copy])
    got = list(spool.iter_samples())
    assert got[0].prompt_ids == [4, 5, 6, 8] and got[1].response_ids == turn.generation.response_ids.tolist()[::-1]
    spool.close()




def test_a_spool_written_before_the_sample_blobs_opens_and_reads_as_it_did(tmp_path):
    """The previous version's schema (main at 34b3828) and its rows, written with its SQL: the JSON of
    ``to_json`` with every array in it. The spool opens (the columns are added), those samples come back
    equal, the cap's count is unchanged and freed exactly at ack, new samples go in beside them as blobs."""
    old = _samples()
    db = sqlite3.connect(tmp_path / "samples.sqlite3", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(spool_schemas.WAITING_ARRAYS_AS_BLOBS)
    total = 0
    for s in old:
        payload = s.to_json()
        total += len(payload.encode())
        db.execute("INSERT INTO samples(sample_id, session_id, turn, kind, created, payload) VALUES (?,?,?,?,?,?)",
                   (s.sample_id, s.session_id, s.turn, s.kind, 0.0, payload))
    db.execute("INSERT INTO spool_stats VALUES ('live_bytes', ?)", (total,))
    db.close()

    spool = Spool(tmp_path, exclusive=True)
    assert spool.live_bytes() == total
    for got, s in zip(spool.iter_samples(), old):
        _same(got, s)
    new = TrainingSample.from_turn(_turn(5), kind="rl", reward=1.0)
    spool.put([new])
    batch, leased = spool.lease(len(old))
    for got, s in zip(leased, old):
        _same(got, s)
    spool.ack(batch)
    payload, blobs = new.to_row()
    assert spool.live_bytes() == len(payload.encode()) + sum(len(b) for b in blobs if b is not None)
    _, (got,) = spool.lease(5)
    _same(got, new)
    spool.close()
    # a spool that lost its count (written before it existed) is counted at open, old rows and new alike
    fresh = Spool(tmp_path / "again")
    fresh.put(old[:2])
    fresh._db.execute("UPDATE samples SET prompt_ids = NULL, response_ids = NULL, rollout_log_probs = NULL, "
                      "loss_mask = NULL, payload = ? WHERE sample_id = ?", (old[0].to_json(), old[0].sample_id))
    fresh._db.execute("DROP TABLE spool_stats")
    fresh.close()
    p1, b1 = old[1].to_row()
    reopened = Spool(tmp_path / "again")
    assert reopened.live_bytes() == len(old[0].to_json().encode()) + len(p1.encode()) + sum(
        len(b) for b in b1 if b is not None)
    for got, s in zip(reopened.iter_samples(), old[:2]):
        _same(got, s)
    reopened.close()


def test_the_cap_counts_a_samples_arrays_not_only_its_json(tmp_path):
    """A sample of 3,000 prompt ids is ~12 KB of blob and a few hundred bytes of JSON: the cap must see the
    12 KB, and acknowledging it frees them all."""
    turn = _turn()
    turn.prompt_ids = array("i", range(3000))
    big = TrainingSample.from_turn(turn, kind="rl", reward=1.0)
    payload, blobs = big.to_row()
    assert len(payload) < 1000
    size = len(payload.encode()) + sum(len(b) for b in blobs if b is not None)
    spool = Spool(tmp_path, max_bytes=10_000)
    spool.put([big])
    assert spool.live_bytes() == size > 12_000
    with pytest.raises(SpoolFull):
        spool.put([TrainingSample.from_turn(_turn(2), kind="rl", reward=1.0)])
    batch, _ = spool.lease(1)
    spool.ack(batch)
    assert spool.live_bytes() == 0
    spool.put([big])
    n, _, _ = spool.remove_user(lambda p: json.loads(p)["metadata"]["user"] == "nobody", "nobody\x1f")
    assert n == 0 and spool.live_bytes() == size  # the recount after a user's deletion counts the blobs too
    spool.close()


def test_a_list_changed_in_place_after_from_turn_is_stored_as_it_now_is(tmp_path):
    """The field still holds the very list from_turn made, but a value in it was changed in place (same length):
    the turn's bytes are stale then, and what is stored must be the list as it is now."""
    turn = _turn()
    s = TrainingSample.from_turn(turn, kind="rl", reward=1.0)
    s.prompt_ids[1] = 42
    s.response_ids[0] = 7
    s.rollout_log_probs[-1] = -9.5
    want = dataclasses.replace(s)  # the same values, no turn bytes to reuse
    spool = Spool(tmp_path)
    spool.put([s])
    _same(next(spool.iter_samples()), want)
    spool.close()


def test_from_turn_keeps_the_prompt_ids_as_an_array_of_its_own_and_stores_its_bytes(tmp_path):
    """No list of the prompt ids is made for a sample (8K ids: ~95 µs to make, ~50 µs to free): it holds a copy of
    the turn's array, which a later change to the turn's array does not reach, and the spool stores its bytes."""
    turn = _turn()
    want = turn.prompt_ids.tobytes()
    s = TrainingSample.from_turn(turn, kind="rl", reward=1.0)
    assert type(s.prompt_ids) is array and s.prompt_ids is not turn.prompt_ids
    turn.prompt_ids[0] += 1
    _, blobs = s.to_row()
    assert blobs[0] == want
    assert s.tokens == [*array("i", want), *s.response_ids] and json.loads(s.to_json())["prompt_ids"] == list(
        array("i", want))
    spool = Spool(tmp_path)
    spool.put([s])
    back = next(spool.iter_samples())
    assert back.prompt_ids == array("i", want).tolist() and type(back.prompt_ids) is list
    spool.close()


class _Renderer:
    """Stands for ``ChatRenderer.render``: fixed ids, as a list and the array it builds of them."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def render(self, messages, tools=None, with_array=False):
        ids = list(self.ids)
        return ("", ids, array("i", ids)) if with_array else ("", ids)


def _trainer_sample(ids: list[int]) -> TrainingSample:
    """A teacher_source trainer sample as the OPD scorer builds it: trainer_signal, then distillation_sample."""
    from openclaw_opd.scorer import HintedJudgement, distillation_sample
    from openclaw_opd.teacher import trainer_signal

    turn = _turn()
    turn.messages = [{"role": "user", "content": "x"}]
    signal = trainer_signal(turn, "h", _Renderer(ids))
    return distillation_sample(turn, HintedJudgement(None, None, hint="h", teacher=signal), "opd", 1.0)


def test_the_hinted_prompt_ids_are_stored_from_the_renderers_array_not_converted_again(tmp_path, monkeypatch):
    """trainer_signal hands the renderer's array bytes of the hinted prompt on (TeacherSignal.prompt_packed):
    to_row stores them without converting the sample's list, and the sample comes back exact."""
    import openclaw_rl.samples as samples

    ids = [9, 8, 7, 2**31 - 1, 0, -5]
    s = _trainer_sample(ids)
    converted = []
    real = samples._to_bytes
    monkeypatch.setattr(samples, "_to_bytes", lambda value, *a: converted.append(value) or real(value, *a))
    spool = Spool(tmp_path)
    spool.put([s])
    assert ids not in converted  # the loss mask is the one list converted
    ((_, *blobs),) = _stored(spool)
    assert blobs[[n for n, _, _ in ARRAY_FIELDS].index("teacher_prompt_ids")] == array("i", ids).tobytes()
    _same(next(spool.iter_samples()), dataclasses.replace(s))
    spool.close()


def test_hinted_prompt_ids_changed_or_replaced_after_the_hand_over_are_stored_as_they_now_are(tmp_path):
    """The renderer's bytes are stale once the sample's teacher_prompt_ids list changes in place, or once another
    list (as long) takes its place: what is stored must be the list as it is now."""
    changed, replaced = _trainer_sample([9, 8, 7, 6]), _trainer_sample([9, 8, 7, 6])
    changed.teacher_prompt_ids[2] = 70
    replaced.teacher_prompt_ids = [1, 2, 3, 4]
    replaced.sample_id = "r"
    want = [dataclasses.replace(changed), dataclasses.replace(replaced)]
    spool = Spool(tmp_path)
    spool.put([changed, replaced])
    got = list(spool.iter_samples())
    assert [g.teacher_prompt_ids for g in got] == [[9, 8, 70, 6], [1, 2, 3, 4]]
    for g, w in zip(got, want):
        _same(g, w)
    spool.close()


@pytest.mark.parametrize(("code", "two_d", "value"), [
    ("i", False, [0, -2**31, 2**31 - 1, True, 151643]), ("i", False, [1, 2**31]), ("i", False, [1, -2**31 - 1]),
    ("i", False, [1, 2.0]), ("i", False, [1, None]), ("i", False, ["1"]), ("i", False, []),
    ("d", False, [-0.0, 5e-324, -1 / 3, math.inf, math.nan, 1, True, 2**53 + 1]), ("d", False, [1.0, 10**400]),
    ("d", False, [1.0, None]), ("d", False, [1.0, "x"]), ("b", False, [0, 1, -128, 127, False]), ("b", False, [128]),
    ("b", False, [0.5]), ("d", True, [[-0.0, -math.inf], [math.nan, -1e-300]]), ("i", True, [[1, 2], [3, 2**31]]),
    ("i", True, [[1, 2], [3]]), ("i", True, [[1, 2], (3, 4)]), ("d", True, [[], []]), ("d", True, [[1.0]]),
])
def test_an_array_field_becomes_the_bytes_of_its_array_or_stays_in_the_json_as_array_would_have_it(code, two_d,
                                                                                                  value):
    """to_row's conversion (struct.pack, faster than array.fromlist) gives the bytes array(code) has of the
    values, bit for bit, and refuses (None: the list stays in the JSON) what array refuses or a ragged list."""
    from openclaw_rl.samples import _to_bytes

    r = 2 if two_d else len(value)
    try:
        rows = value if two_d else [value]
        if two_d and (len(value) != r or any(type(row) is not list or len(row) != len(value[0]) for row in value)):
            raise TypeError("ragged")
        want = array(code)
        for row in rows:
            want.fromlist(row)
        expected = want.tobytes()
    except (OverflowError, TypeError):
        expected = None
    assert _to_bytes(value, code, two_d, r) == expected


def test_oel_with_the_trainer_teacher_hands_the_renderers_array_bytes_over_too(tmp_path, monkeypatch):
    """OELScorer.build (teacher_source trainer: trainer_signal with the experience-augmented messages) passes the
    renderer's bytes on as the OPD scorer does: stored without converting the list, and read back exact."""
    import openclaw_rl.samples as samples
    from openclaw_oel.scorer import Experience, OELJudgement, OELScorer
    from openclaw_opd.teacher import trainer_signal
    from openclaw_rl.scoring import Ledger

    ids = [3, 2**31 - 1, -7, 0, 151643]
    turn = _turn()
    turn.messages = [{"role": "user", "content": "x"}]
    signal = trainer_signal(turn, "", _Renderer(ids), [{"role": "system", "content": "- rule"}, *turn.messages])
    judgement = OELJudgement(Experience(["rule"]), teacher=signal)
    (s,) = OELScorer.build(object.__new__(OELScorer), turn, judgement, Ledger()).samples
    assert s.teacher_prompt_ids == ids and s.teacher_prompt_ids is not signal.prompt_ids
    converted = []
    real = samples._to_bytes
    monkeypatch.setattr(samples, "_to_bytes", lambda value, *a: converted.append(value) or real(value, *a))
    spool = Spool(tmp_path)
    spool.put([s])
    assert ids not in converted
    ((_, *blobs),) = _stored(spool)
    assert blobs[[n for n, _, _ in ARRAY_FIELDS].index("teacher_prompt_ids")] == array("i", ids).tobytes()
    _same(next(spool.iter_samples()), dataclasses.replace(s))
    spool.close()


class _Id(int):
    """An int subclass (an IntEnum-like token id)."""


class _Index:
    """Not an int, but an index (``__index__``), as numpy's integer scalars are."""

    def __index__(self) -> int:
        return 5


def test_the_conversion_agrees_with_array_on_int_subclasses_indexables_and_numpy_scalars():
    """Values some caller may hand over instead of plain ints and floats: struct.pack takes and refuses exactly
    what array does (numpy's integer and float scalars, an int subclass, an ``__index__`` object, a huge int
    among floats in (R, K) rows)."""
    from openclaw_rl.samples import _to_bytes

    np = pytest.importorskip("numpy")
    cases = [("i", [_Id(7), _Id(2**31 - 1), _Index(), np.int64(-3), np.int32(9), np.uint8(200)]),
             ("i", [_Id(2**31)]), ("i", [np.int64(2**40)]), ("i", [np.float64(1.0)]), ("i", [np.float32(1.0)]),
             ("d", [np.float64(-0.0), np.float32(0.1), np.int64(3), _Id(2), _Index(), np.float16(1)]),
             ("b", [np.int8(-128), np.bool_(True), _Id(1)]), ("b", [np.int64(128)])]
    for code, value in cases:
        try:
            expected: bytes | None = array(code, value).tobytes()
        except (OverflowError, TypeError):
            expected = None
        assert _to_bytes(value, code, False, len(value)) == expected, (code, value)
    assert _to_bytes([[1.0, 10**400], [0.0, 1.0]], "d", True, 2) is None
    assert _to_bytes([[1.0, 2.0], [np.float64(3.0), _Index()]], "d", True, 2) == array("d", [1, 2, 3, 5]).tobytes()
