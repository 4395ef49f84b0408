"""Combine mode: one turn, at most one sample carrying both the RL reward and the teacher signal.

Composes the OPD pieces (``openclaw_opd.scorer``): hint votes and PRM votes always run concurrently
(upstream ran them one after the other, and only with ``OPENCLAW_EVAL_MODE=1``, without which combine
silently degenerated to OPD). Dispatch, as upstream §6:

| hint accepted | PRM ±1 | sample                                                          |
|---------------|--------|-----------------------------------------------------------------|
| yes           | yes    | teacher log-probs, reward = PRM score                           |
| yes           | no     | teacher log-probs, reward 0 (OPD-only)                          |
| no            | yes    | teacher = the rollout log-probs (no OPD signal), reward = score  |
| no            | no     | none                                                            |

With ``--distill-topk`` an RL-only sample gets top-K rows holding only its own sampled token (its
rollout log-prob, the rest −inf), so every sample of a batch has the same fields (upstream crashed
when the first sample of a batch lacked them, §12 item 12).
"""

from __future__ import annotations

import math

from openclaw_opd.scorer import HintedJudgement, distillation_sample, judge_with_hint, no_sample_reason
from openclaw_rl.chat import ChatRenderer
from openclaw_rl.config import Settings
from openclaw_rl.judge import JudgeClient
from openclaw_rl.samples import TrainingSample
from openclaw_rl.scoring import Ledger, Outcome
from openclaw_rl.turns import Turn


class CombineScorer:
    name = "combine"
    keeps_messages = True

    def __init__(self, settings: Settings, judge: JudgeClient, renderer: ChatRenderer,
                 teacher: JudgeClient | None = None):
        self.judge_client, self.renderer, self.teacher = judge, renderer, teacher
        self.opd, self.combine = settings.opd, settings.combine

    async def judge(self, turn: Turn) -> HintedJudgement | None:
        return await judge_with_hint(turn, self.judge_client, self.renderer, with_prm=True,
                                     min_hint_chars=self.opd.min_hint_chars, top_k=self.opd.distill_topk,
                                     selection=self.opd.hint_selection, max_candidates=self.opd.max_hint_candidates,
                                     teacher=self.teacher, teacher_source=self.opd.teacher_source)

    def build(self, turn: Turn, judgement: HintedJudgement | None, ledger: Ledger) -> Outcome:
        eval_score = judgement.prm.score if judgement and judgement.prm else 0.0
        record = judgement.record() if judgement else {}
        rl_valid = eval_score in (1.0, -1.0)
        if judgement is not None and judgement.teacher is not None:
            sample = distillation_sample(turn, judgement, "combine", eval_score if rl_valid else 0.0)
            sample.metadata["branch"] = "opd+rl" if rl_valid else "opd"
        elif rl_valid:
            sample = self._rl_only(turn, eval_score)
        else:
            reason, detail = no_sample_reason(judgement, turn)
            return Outcome(drop=reason, drop_detail=detail, eval_score=eval_score, record=record)
        ledger.effective += 1
        return Outcome(samples=[sample], eval_score=eval_score, record=record)

    def _rl_only(self, turn: Turn, score: float) -> TrainingSample:
        assert turn.generation is not None
        rollout = turn.generation.response_logprobs.tolist()
        topk = {}
        k = self.opd.distill_topk
        if k > 0:
            ids = turn.generation.response_ids.tolist()
            topk = {"teacher_topk_log_probs": [[lp] + [-math.inf] * (k - 1) for lp in rollout],
                    "teacher_topk_indices": [[t] + [0] * (k - 1) for t in ids]}
        return TrainingSample.from_turn(turn, kind="combine", reward=score, teacher_log_probs=rollout,
                                        metadata={"branch": "rl", "eval_score": score}, **topk)
