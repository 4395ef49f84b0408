"""OPD mode: a turn whose next state yields a hindsight hint becomes a distillation sample.

m hint votes run concurrently (plus m PRM votes when ``opd.eval_mode``, for ``rollout/prm_eval_score``,
concurrently too); by default the longest hint of a +1 vote longer than 10 characters is kept, or
several candidate hints are scored and one chosen (``opd.hint_selection``, ``selection.py``); the hinted
teacher scores the turn's exact response ids (``teacher.py``). No accepted hint → no sample (counted as
``no_hint``). The reward is upstream's dummy 1.0: token-level OPD trains on ``teacher − old`` only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from openclaw_rl.chat import ChatRenderer
from openclaw_rl.config import Settings
from openclaw_rl.errors import OpenClawError
from openclaw_rl.judge import HintJudgement, JudgeClient, PRMJudgement
from openclaw_rl.samples import TrainingSample
from openclaw_rl.scoring import Ledger, Outcome
from openclaw_rl.turns import DropReason, Turn

from .selection import Selection, hints_to_score, select
from .teacher import TeacherSignal, teacher_packed, teacher_signal, trainer_signal_off_loop


@dataclass(slots=True)
class HintedJudgement:
    hints: HintJudgement | None
    prm: PRMJudgement | None
    hint: str = ""
    teacher: TeacherSignal | None = None
    teacher_error: str = ""
    candidates: list[str] = field(default_factory=list)  # the hints scored (one unless a scored selection rule)
    picks: list[int] = field(default_factory=list)  # response tokens taken from each candidate

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"accepted": self.teacher is not None, "hint": self.hint, "hint_len": len(self.hint)}
        if len(self.candidates) > 1:
            out["candidates"] = [{"hint": h, "tokens": n} for h, n in zip(self.candidates, self.picks)]
        if self.hints:
            out["votes"] = [{"score": v.score, "hint": v.hint, "raw": v.raw} for v in self.hints.votes]
        if self.prm:
            out["eval"] = self.prm.record()
        if self.teacher_error:
            out["teacher_error"] = self.teacher_error
        return out


async def judge_with_hint(turn: Turn, judge: JudgeClient, renderer: ChatRenderer, *, with_prm: bool,
                          min_hint_chars: int, top_k: int, selection: str = "longest",
                          max_candidates: int = 1, teacher: JudgeClient | None = None,
                          teacher_source: str = "server") -> HintedJudgement | None:
    """Hint votes and (optionally) PRM votes concurrently, then the teacher for each hint to score
    (``selection.hints_to_score``: one, or every candidate under a scored rule) and the rule's choice.
    ``teacher``: a teacher server apart from the judge (``teacher_server.py``); None: the judge scores.
    ``teacher_source`` trainer: no teacher call, the hint's prompt ids for the trainer's teacher (config
    refuses the scored rules with it, so there is one candidate)."""
    feedback = PRMJudgement.from_feedback(turn.feedback) if turn.feedback is not None else None
    if turn.next_state is None or not judge.enabled:
        return None if feedback is None else HintedJudgement(None, feedback)
    assert turn.generation is not None
    text, state = turn.generation.text, turn.next_state
    if with_prm and feedback is None:
        hints, prm = await asyncio.gather(judge.hints(text, state), judge.prm(text, state))
    else:
        hints, prm = await judge.hints(text, state), feedback
    candidates = hints_to_score(hints, selection, min_hint_chars, max_candidates)
    result = HintedJudgement(hints, prm, candidates[0] if candidates else "", candidates=candidates)
    if not candidates:
        return result
    if teacher_source == "trainer":
        result.teacher = await trainer_signal_off_loop(turn, candidates[0], renderer)
        result.picks = [len(turn.generation.response_ids)]
        result.candidates = candidates[:1]
        return result
    scorer = teacher or judge
    outcomes = await asyncio.gather(*(teacher_signal(turn, h, scorer, renderer, top_k) for h in candidates),
                                    return_exceptions=True)
    scored = [(h, o) for h, o in zip(candidates, outcomes) if isinstance(o, TeacherSignal)]
    errors = [o for o in outcomes if not isinstance(o, TeacherSignal)]
    for e in errors:
        if not isinstance(e, OpenClawError):
            raise e
    if not scored:
        result.teacher_error = errors[0].message  # type: ignore[union-attr]
        return result
    chosen: Selection = select([sig for _, sig in scored], selection)
    counts = chosen.counts(len(scored))
    result.candidates = [h for h, _ in scored]
    result.picks = counts
    result.hint = result.candidates[max(range(len(counts)), key=lambda k: (counts[k], -k))]
    result.teacher = chosen.signal
    if errors:
        result.teacher_error = f"{len(errors)} of {len(candidates)} candidates' teacher calls failed: " \
                               f"{errors[0].message}"  # type: ignore[union-attr]
    return result


def distillation_sample(turn: Turn, j: HintedJudgement, kind: str, reward: float) -> TrainingSample:
    t = j.teacher
    assert t is not None
    meta = {"hint": j.hint, "teacher_unscored": t.mask.count(0),
            "eval_score": j.prm.score if j.prm else None}
    if len(j.candidates) > 1:  # a scored selection rule: the hints scored and the tokens taken from each
        meta["hint_candidates"], meta["hint_picks"] = list(j.candidates), list(j.picks)
    if t.prompt_ids is not None:  # teacher_source trainer: the trainer's frozen teacher scores these ids
        return TrainingSample.from_turn(turn, kind=kind, reward=reward, loss_mask=list(t.mask), metadata=meta,
                                        teacher_prompt_ids=list(t.prompt_ids),
                                        packed=teacher_packed(t))
    return TrainingSample.from_turn(turn, kind=kind, reward=reward, loss_mask=list(t.mask), metadata=meta,
                                    teacher_log_probs=t.log_probs, teacher_topk_log_probs=t.topk_log_probs,
                                    teacher_topk_indices=t.topk_indices)


def no_sample_reason(j: HintedJudgement | None, turn: Turn) -> tuple[DropReason, str]:
    if j is None:
        return DropReason.NO_NEXT_STATE, ""
    if j.hint and j.teacher is None:
        return DropReason.TEACHER_FAILED, j.teacher_error
    if j.hints is None:
        return DropReason.NO_HINT, "no judge: explicit feedback alone carries no hint"
    if j.hints.failed:
        return DropReason.JUDGE_FAILED, f"all {len(j.hints.votes)} hint votes failed"
    return DropReason.NO_HINT, f"{len(j.hints.votes) if j.hints else 0} votes, none with a usable hint"


class OPDScorer:
    name = "opd"
    keeps_messages = True

    def __init__(self, settings: Settings, judge: JudgeClient, renderer: ChatRenderer,
                 teacher: JudgeClient | None = None):
        self.judge_client, self.renderer, self.cfg, self.teacher = judge, renderer, settings.opd, teacher

    async def judge(self, turn: Turn) -> HintedJudgement | None:
        return await judge_with_hint(turn, self.judge_client, self.renderer, with_prm=self.cfg.eval_mode,
                                     min_hint_chars=self.cfg.min_hint_chars, top_k=self.cfg.distill_topk,
                                     selection=self.cfg.hint_selection, max_candidates=self.cfg.max_hint_candidates,
                                     teacher=self.teacher, teacher_source=self.cfg.teacher_source)

    def build(self, turn: Turn, judgement: HintedJudgement | None, ledger: Ledger) -> Outcome:
        eval_score = None
        if self.cfg.eval_mode:  # upstream counts 0.0 for turns that end without a usable judgement
            eval_score = judgement.prm.score if judgement and judgement.prm else 0.0
        record = judgement.record() if judgement else {}
        if judgement is None or judgement.teacher is None:
            reason, detail = no_sample_reason(judgement, turn)
            return Outcome(drop=reason, drop_detail=detail, eval_score=eval_score, record=record)
        ledger.effective += 1
        return Outcome(samples=[distillation_sample(turn, judgement, "opd", 1.0)], eval_score=eval_score,
                       record=record)
