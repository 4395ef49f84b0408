"""Binary RL mode: a turn's reward is the judge's majority vote on its next state (+1, −1 or 0).

Rules, as upstream OpenClaw-RL §4.5: a turn with a next state gets m PRM votes; score 0 or no next
state excludes the turn; the first judged turn of a session is kept anyway if the session has no
effective sample yet (at-least-one). Deviations, both configurable back to upstream:
1) excluded turns are counted and dropped instead of being queued with an all-zero loss mask, where
   they took batch slots and diluted the loss (``rl.keep_masked_samples``);
2) without a judge URL every turn scores 0 (upstream's PRM-disabled path), so nothing trains; the
   proxy says so at start-up.
"""

from __future__ import annotations

from typing import Any

from .config import Settings
from .judge import JudgeClient, PRMJudgement
from .samples import TrainingSample
from .scoring import Ledger, Outcome
from .turns import DropReason, Turn


class BinaryRLScorer:
    name = "rl"
    keeps_messages = False

    def __init__(self, settings: Settings, judge: JudgeClient, renderer: Any = None):
        self.judge_client = judge
        self.cfg = settings.rl

    async def judge(self, turn: Turn) -> PRMJudgement | None:
        if turn.feedback is not None:  # an explicit rating replaces the votes
            return PRMJudgement.from_feedback(turn.feedback)
        if turn.next_state is None or not self.judge_client.enabled:
            return None
        assert turn.generation is not None
        return await self.judge_client.prm(turn.generation.text, turn.next_state)

    def build(self, turn: Turn, judgement: PRMJudgement | None, ledger: Ledger) -> Outcome:
        score = judgement.score if judgement else 0.0
        # Without a judge a next state is not evidence of anything (upstream never marks it either).
        has_next = turn.next_state is not None and (self.judge_client.enabled or turn.feedback is not None)
        record = {"next_state": turn.next_state, **(judgement.record() if judgement else {"score": 0.0})}
        if judgement and judgement.representative and score != 0:
            record["representative_eval"] = judgement.representative
        if judgement is not None and judgement.failed:  # a dead judge is not a model that never does right
            return Outcome(drop=DropReason.JUDGE_FAILED, drop_detail=f"all {len(judgement.votes)} judge votes failed",
                           record=record)
        excluded = (not has_next) or score == 0
        promoted = excluded and has_next and self.cfg.at_least_one and ledger.effective == 0
        if excluded and not promoted:
            reason = (DropReason.ZERO_SCORE if has_next else DropReason.NO_NEXT_STATE if turn.next_state is None
                      else DropReason.NO_JUDGE)
            if not self.cfg.keep_masked_samples:
                return Outcome(drop=reason, eval_score=score, record=record)
            mask = [0] * turn.response_length
        else:
            mask = [1] * turn.response_length
            ledger.effective += 1
        meta = {"judge_votes": record.get("votes"), "next_state_role": (turn.next_state or {}).get("role"),
                "promoted_at_least_one": promoted}
        sample = TrainingSample.from_turn(turn, kind="rl", reward=score, loss_mask=mask, metadata=meta)
        return Outcome(samples=[sample], eval_score=score, record=record)
