"""OEL mode: hold a session's turns until it ends, extract its experience, distil every turn from the
experience-augmented teacher.

Stage: sessions → **mode scorer** → spool. The scorer declares ``holds_until_session_end``: the tracker
parks every finished turn (persisted as a waiting turn, so a restart restores it) until the session
ends (``X-Session-Done``, idle TTL, eviction), then calls ``session_closing`` with the turns it will
judge and judges them. The first judgement of a session starts one extraction call
(``experience.py``: the judge reads the whole conversation and writes do/don't rules, deduplicated and
capped at ``oel.max_experience_tokens``); every turn then awaits it, and the teacher (the judge server
or ``--teacher-url``) scores the turn's exact response ids under the prompt with the experience added,
with its top-K (``oel.topk``, upstream's K=50); with ``openclaw_opd_teacher_source: trainer`` no server is
called: the sample stores that prompt's exact ids and the trainer's frozen teacher scores them (the same
K, ``openclaw_rl/embedded/frozen_teacher.py``), exactly as OPD's hinted prompt. The sample (kind ``oel``, reward 1.0) trains the top-K +
tail reverse KL of ``openclaw_opd.loss.topk_distillation_loss_function``. Drops, each counted:
extraction failed → ``judge_failed``; no rule extracted → ``no_hint``; teacher failed → ``teacher_failed``.

Experience per user (API key namespace) is kept in ``store.py``. ``oel.accumulate`` (upstream's
``SESSION_EXPERIENCE``): the user's stored rules go into the extraction prompt and the teacher sees
the merged rules; default off (upstream's default): the teacher sees this session's rules only, and the
store keeps the latest session's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from openclaw_opd.teacher import TeacherSignal, teacher_packed, teacher_signal, trainer_signal_off_loop
from openclaw_rl.chat import ChatRenderer
from openclaw_rl.config import Settings
from openclaw_rl.errors import OpenClawError
from openclaw_rl.judge import JudgeClient
from openclaw_rl.samples import TrainingSample
from openclaw_rl.scoring import Ledger, Outcome
from openclaw_rl.sessions import _namespace
from openclaw_rl.turns import DropReason, Turn

from .experience import (
    EXTRACT_SYSTEM,
    cap_rules,
    experience_messages,
    extraction_prompt,
    fit_conversation,
    format_experience,
    merge_rules,
    parse_rules,
)
from .settings import OELSettings
from .store import ExperienceStore, store_key

__all__ = ["OELScorer", "OELSettings"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Experience:
    rules: list[str]
    failed: str = ""  # why extraction failed ("" when it answered)
    cut: int = 0  # rules left out by the token cap
    raw: str = ""

    @property
    def text(self) -> str:
        return format_experience(self.rules)


@dataclass(slots=True)
class OELJudgement:
    experience: Experience
    teacher: TeacherSignal | None = None
    teacher_error: str = ""

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"accepted": self.teacher is not None, "experience": self.experience.rules}
        if self.experience.failed:
            out["extraction_error"] = self.experience.failed
        if self.experience.cut:
            out["rules_cut"] = self.experience.cut
        if self.teacher_error:
            out["teacher_error"] = self.teacher_error
        return out


@dataclass(slots=True)
class _Pending:
    task: asyncio.Future[Experience]
    waiting: set[int] = field(default_factory=set)  # turn indices still to be judged against it


class OELScorer:
    name = "oel"
    keeps_messages = True
    holds_until_session_end = True

    def __init__(self, settings: Settings, judge: JudgeClient, renderer: ChatRenderer,
                 teacher: JudgeClient | None = None, store: ExperienceStore | None = None):
        self.cfg = settings.oel
        self.teacher_source = settings.opd.teacher_source  # trainer: the trainer's frozen teacher scores the ids
        if self.cfg.topk < 1:
            raise ValueError("openclaw_oel_topk must be >= 1: OEL trains the top-K distillation loss")
        self.judge_client, self.renderer, self.teacher = judge, renderer, teacher
        if store is None:  # beside the spool; a proxy without a spool dir (tests) keeps it in memory
            store = ExperienceStore.beside(settings.spool.dir) if settings.spool.dir else ExperienceStore(":memory:")
        self.store = store
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._deletions: dict[str, int] = {}  # store key -> times its user was deleted (an extraction started
        # before a deletion must not write the deleted user's experience back)
        self._deleting = threading.Lock()
        self.extractions = 0  # extraction calls made (tests count them)
        self.trimmed_extractions = 0  # extractions whose conversation was cut to the judge's context

    # --- session end ------------------------------------------------------------------------------------

    def session_closing(self, turns: list[Turn]) -> None:
        """The tracker ends a session and will judge ``turns``: start its one extraction now."""
        if not turns:
            return
        key = (turns[0].session_key, turns[0].epoch)
        pending = self._pending.get(key)
        if pending is None:
            task = asyncio.get_running_loop().create_task(self._extract(turns))
            pending = self._pending[key] = _Pending(task)
        pending.waiting.update(t.index for t in turns)

    def forget_user(self, user: str) -> int:
        """Delete `user`'s experience (``DELETE /v1/users/{user}``); extractions of theirs already running keep
        theirs to themselves. Returns the entries removed (0 or 1)."""
        skey = store_key(user)
        for key in [k for k in self._pending if _namespace(k[0]) == user]:
            self._pending.pop(key).task.cancel()
        with self._deleting:
            self._deletions[skey] = self._deletions.get(skey, 0) + 1
            return int(self.store.delete(skey))

    def _put_unless_deleted(self, skey: str, rules: list[str], incarnation: int) -> None:
        with self._deleting:  # checked and written as one step: a deletion comes wholly before or after
            if self._deletions.get(skey, 0) == incarnation:
                self.store.put(skey, rules)

    async def _experience_for(self, turn: Turn) -> Experience:
        key = (turn.session_key, turn.epoch)
        pending = self._pending.get(key)
        if pending is None or turn.index not in pending.waiting:
            # a turn that finished generating after its session ended: its own extraction, from its conversation
            return await self._extract([turn])
        try:
            return await asyncio.shield(pending.task)
        finally:
            pending.waiting.discard(turn.index)
            if not pending.waiting and self._pending.get(key) is pending:
                del self._pending[key]

    def _count_tokens(self, text: str) -> int:
        return len(self.renderer.tokenizer.encode(text, add_special_tokens=False))

    async def _extract(self, turns: list[Turn]) -> Experience:
        last = max(turns, key=lambda t: t.index)
        assert last.generation is not None and last.messages is not None
        conversation = [*last.messages, {"role": "assistant", "content": last.generation.text}]
        if last.next_state is not None:
            conversation.append(dict(last.next_state))
        skey = store_key(_namespace(last.session_key))
        incarnation = self._deletions.get(skey, 0)
        previous: list[str] = []
        if self.cfg.accumulate:
            entry = await asyncio.to_thread(self.store.get, skey)
            previous = entry.rules if entry else []
        self.extractions += 1
        prompt = await self._fitted_prompt(conversation, format_experience(previous), last.session_key)
        raws = await self.judge_client._votes(EXTRACT_SYSTEM, prompt)
        answered = [r for r in raws if r is not None]
        if not answered:
            return Experience([], failed=f"all {len(raws)} extraction calls failed")
        rules, cut = cap_rules(merge_rules(previous, *(parse_rules(r) for r in answered)), self._count_tokens,
                               self.cfg.max_experience_tokens)
        if rules:
            try:
                await asyncio.to_thread(self._put_unless_deleted, skey, rules, incarnation)
            except Exception as e:  # the store is a record: its failure must not cost the session's samples
                log.warning("experience store: saving %s failed: %s", skey, e)
        return Experience(rules, cut=cut, raw=answered[0])

    async def _fitted_prompt(self, conversation: list[dict[str, Any]], previous: str, session: str) -> str:
        """The extraction prompt of as much of the conversation as the judge's context takes with room for
        its answer (``min(max_new_tokens, context / 2)`` tokens); the oldest messages go first."""
        jc = self.judge_client
        try:
            await jc.learn_context()
        except OpenClawError:  # unreachable: the extraction call says so itself
            pass
        if not jc.context_length or jc.tokenizer is None:
            return extraction_prompt(conversation, previous)
        budget = jc.context_length - min(jc.max_new_tokens, jc.context_length // 2)

        def fits(messages: list[dict[str, Any]]) -> bool:
            rendered = jc.render(EXTRACT_SYSTEM, extraction_prompt(messages, previous))
            return len(jc.tokenizer.encode(rendered, add_special_tokens=False)) <= budget

        kept, dropped = await asyncio.to_thread(fit_conversation, conversation, fits)
        if dropped:
            self.trimmed_extractions += 1
            log.info("experience extraction for %s: the %d oldest of %d messages left out to fit the judge's "
                     "context of %d tokens", session, dropped, len(conversation), jc.context_length)
        return extraction_prompt(kept, previous)

    # --- TurnScorer -------------------------------------------------------------------------------------

    async def judge(self, turn: Turn) -> OELJudgement:
        experience = await self._experience_for(turn)
        result = OELJudgement(experience)
        if experience.failed or not experience.rules or turn.messages is None:
            return result
        messages = experience_messages(turn.messages, experience.text)
        if self.teacher_source == "trainer":  # no server call: the prompt's exact ids for the trainer's teacher
            result.teacher = await trainer_signal_off_loop(turn, "", self.renderer, messages)
            return result
        try:
            result.teacher = await teacher_signal(turn, "", self.teacher or self.judge_client, self.renderer,
                                                  self.cfg.topk, messages=messages)
        except OpenClawError as e:
            result.teacher_error = e.message
        return result

    def build(self, turn: Turn, judgement: OELJudgement, ledger: Ledger) -> Outcome:
        record = judgement.record()
        exp = judgement.experience
        if exp.failed:
            return Outcome(drop=DropReason.JUDGE_FAILED, drop_detail=f"experience extraction: {exp.failed}",
                           record=record)
        if not exp.rules:
            return Outcome(drop=DropReason.NO_HINT, drop_detail="the session yielded no experience", record=record)
        t = judgement.teacher
        if t is None:
            return Outcome(drop=DropReason.TEACHER_FAILED, drop_detail=judgement.teacher_error, record=record)
        ledger.effective += 1
        teacher = ({"teacher_prompt_ids": list(t.prompt_ids)} if t.prompt_ids is not None else
                   {"teacher_log_probs": t.log_probs, "teacher_topk_log_probs": t.topk_log_probs,
                    "teacher_topk_indices": t.topk_indices})
        sample = TrainingSample.from_turn(
            turn, kind="oel", reward=1.0, loss_mask=list(t.mask),
            metadata={"experience": exp.text, "teacher_unscored": t.mask.count(0)}, packed=teacher_packed(t),
            **teacher)
        return Outcome(samples=[sample], record=record)
