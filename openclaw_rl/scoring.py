"""What a mode is: how a finished turn is judged, and how a judged turn becomes samples.

Stage: sessions → **mode scorer** → spool. The session tracker calls ``judge`` as soon as a turn has its
response and its next state (or its session ended); judgements may finish in any order. It then calls
``build`` strictly in turn order per session, with that session's ``Ledger``, so rules that depend on
earlier turns (RL's at-least-one guarantee) see them in order. Modes never touch HTTP, sessions or the
spool: they receive a ``Turn`` and a ``JudgeClient`` and return an ``Outcome``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .config import Settings
from .judge import JudgeClient
from .modes import get_mode, resolve
from .samples import TrainingSample
from .turns import DropReason, Turn


@dataclass(slots=True)
class Ledger:
    """Per-session state a mode may keep across turns."""

    effective: int = 0  # samples emitted with a non-zero loss mask


@dataclass(slots=True)
class Outcome:
    samples: list[TrainingSample] = field(default_factory=list)
    drop: DropReason | None = None  # why the turn produced no sample (None when it did)
    drop_detail: str = ""
    eval_score: float | None = None  # contributes to rollout/prm_eval_score
    record: dict[str, Any] = field(default_factory=dict)  # the judge record line for this turn


class TurnScorer(Protocol):
    name: str
    keeps_messages: bool  # the turn's messages must be kept until judged (OPD's enhanced prompt)

    async def judge(self, turn: Turn) -> Any:
        """Run the judge/teacher for a turn (``turn.next_state`` may be None at session end)."""

    def build(self, turn: Turn, judgement: Any, ledger: Ledger) -> Outcome:
        """Turn a judgement into samples; called in turn order within a session."""


def make_scorer(settings: Settings, judge: JudgeClient, renderer: Any, teacher: JudgeClient | None = None) -> TurnScorer:
    """Instantiate the scorer of the mode named in ``settings.mode`` (``openclaw_rl.modes.MODES``). A mode
    that needs the teacher gets ``teacher=`` too when a teacher server apart from the judge is set."""
    cls = resolve(get_mode(settings.mode).scorer)
    if teacher is not None and get_mode(settings.mode).needs_teacher:
        return cls(settings, judge, renderer, teacher=teacher)
    return cls(settings, judge, renderer)
