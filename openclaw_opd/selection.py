"""Several candidate hints per turn, and which one's teacher signal a sample keeps.

Stage: mode scorer → teacher → **hint selection** (proxy side, before the sample is spooled). Shared by
OPD and Combine through ``settings.opd.hint_selection`` (``OPENCLAW_TOPK_HINT_SELECTION``), so both modes
make the same choice. Upstream (PRs #105/#106, ``hint_opd_select_loss.py``) selects inside the loss,
where the teacher runs in the trainer and the student's current top-K is at hand; here the teacher is
a server the proxy already calls, so every candidate is scored by it here and the sample carries one
ordinary teacher signal: the losses, the spool format and the Slime bridge are unchanged.

Candidates, as upstream's select server: the hints of +1 votes, stripped, longer than
``min_hint_chars``, deduplicated, sorted shortest first (stable), at most ``max_hint_candidates``.

| rule | teacher calls | what the sample keeps |
|---|---|---|
| ``longest`` (default) | 1 | the longest hint (upstream's single-hint ``_select_best_hint``, as before) |
| ``shortest`` | 1 | candidate 0, the shortest (upstream: k* = 0) |
| ``sequence_optimal`` | one per candidate | k* = argmax_k Σ_t score_k(t), one candidate for the whole response |
| ``token_optimal`` | one per candidate | k*(t) = argmax_k score_k(t), token by token (its log-prob and top-K row) |

The per-token score: upstream's is ``|S^q_t ∩ S^p_{t,k}|``, the size of the overlap of the student's
top-K with candidate k's teacher top-K. The proxy has no student top-K (SGLang returns the sampled
token's log-prob only), so here ``score_k(t)`` is candidate k's teacher log-prob of the token the student
sampled at t: how much of the student's own choice the hinted teacher covers, the one-token case of the
same overlap. A position a candidate could not score counts as the rollout log-prob in a sequence sum
(neutral) and loses to any candidate that scored it in ``token_optimal``.
Ties go to the lower k, i.e. the shorter hint (``torch.argmax``'s first maximum, as upstream).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from openclaw_rl.config import HINT_SELECTIONS
from openclaw_rl.judge import HintJudgement

from .teacher import TeacherSignal

__all__ = ["HINT_SELECTIONS", "Selection", "hint_candidates", "hints_to_score", "select"]
SCORED = ("sequence_optimal", "token_optimal")  # the rules that call the teacher once per candidate


def hint_candidates(hints: HintJudgement, min_chars: int, max_candidates: int) -> list[str]:
    """Accepted hints, deduplicated, shortest first, capped (upstream's select server)."""
    seen: list[str] = []
    for v in hints.votes:
        hint = v.hint.strip()
        if v.score == 1 and len(hint) > min_chars and hint not in seen:
            seen.append(hint)
    return sorted(seen, key=len)[:max_candidates]


def hints_to_score(hints: HintJudgement, rule: str, min_chars: int, max_candidates: int) -> list[str]:
    """The hints whose teacher signal is fetched under ``rule`` ([] when none is accepted)."""
    if rule == "longest":
        best = hints.best_hint(min_chars)
        return [best] if best else []
    candidates = hint_candidates(hints, min_chars, max_candidates)
    return candidates[:1] if rule == "shortest" else candidates


@dataclass(slots=True)
class Selection:
    signal: TeacherSignal  # what the sample keeps
    picks: list[int] = field(default_factory=list)  # (R,) the candidate each response token's values came from

    def counts(self, n: int) -> list[int]:
        return [self.picks.count(k) for k in range(n)]


def _argmax(values: list[float]) -> int:
    best = 0
    for k, v in enumerate(values):
        if v > values[best]:
            best = k
    return best


def select(signals: list[TeacherSignal], rule: str) -> Selection:
    """Pick among the candidates' teacher signals (index k = candidate k, shortest hint first)."""
    if not signals:
        raise ValueError("select: no candidate signal")
    n = len(signals[0].log_probs)
    if rule not in SCORED or len(signals) == 1:
        return Selection(signals[0], [0] * n)
    if rule == "sequence_optimal":
        k = _argmax([sum(s.log_probs) for s in signals])
        return Selection(signals[k], [k] * n)
    if rule != "token_optimal":
        raise ValueError(f"unknown hint selection {rule!r}; one of {', '.join(HINT_SELECTIONS)}")
    picks = [_argmax([s.log_probs[t] if s.mask[t] else -math.inf for s in signals]) for t in range(n)]
    topk = all(s.topk_log_probs is not None and s.topk_indices is not None for s in signals)
    out = TeacherSignal([signals[k].log_probs[t] for t, k in enumerate(picks)],
                        [signals[k].mask[t] for t, k in enumerate(picks)])
    if topk:
        out.topk_log_probs = [signals[k].topk_log_probs[t] for t, k in enumerate(picks)]  # type: ignore[index]
        out.topk_indices = [signals[k].topk_indices[t] for t, k in enumerate(picks)]  # type: ignore[index]
    return Selection(out, picks)
