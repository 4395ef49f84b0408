"""``SeveralHintsJudgeModel``: the rule judge with one distinct hint per vote (``local --judge-hints several``).

Stage: proxy's ``JudgeClient`` → engine server → **rule judge core**, a variant of ``rule_judge.py``. The
default rule judge gives every hint vote the same hint ("Answer formally and politely."), so the
candidate hints of ``openclaw_opd.selection`` collapse to one and ``shortest``, ``sequence_optimal`` and
``token_optimal`` all keep it: a learning run cannot tell them apart. This core answers the k-th vote on a
hint prompt with a hint of kind ``KINDS[k % 3]``, so a turn judged with 3 votes has three candidates of
different quality and length, as a real LLM judge's sampled votes differ:

| kind | text | length |
|---|---|---|
| ``precise`` | the user's instruction as an imperative (``extract_hint``), "Answer formally and politely." | shortest |
| ``vague`` | a style change without naming the style, one of ``VAGUE`` (picked from the seed and the next state) | middle |
| ``verbose`` | the precise instruction between two sentences of padding (``VERBOSE``) | longest |

``shortest`` therefore keeps the precise hint, ``longest`` the verbose one, and the scored rules whatever
the teacher's log-probs of the sampled reply prefer (``selection.py``: the highest sum, or per token).
The vote index is counted per prompt (the votes of one turn are identical prompts, sent as one
``/generate`` with ``n = m``), so the set of hints a turn gets is fixed whatever order its votes run in;
PRM votes, extraction prompts and turns without a correction are answered exactly as ``rule_judge``.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from openclaw_rl.embedded.rule_judge import (
    RuleJudgeModel,
    extract_hint,
    judge_reply,
    read_extraction_prompt,
    read_judge_prompt,
    score_next_state,
)
from openclaw_rl.engine.model import EngineModel

JUDGE_HINTS = ("one", "several")  # `local --judge-hints`: the rule judge, or this one
KINDS = ("precise", "vague", "verbose")  # vote k of a hint prompt gets KINDS[k % 3]
VOTES = len(KINDS)  # judge votes `local` asks for with --judge-hints several
VAGUE = ("Answer in a different way than the last reply.", "Write the reply differently from the last time.",
         "The user wants another kind of answer this time.")
VERBOSE = ("The user was not happy with how the last reply was written and asked again. {hint} Keep what "
           "the reply says and change only the way it is written.")
_SEEN_CAP = 4096  # prompts whose vote count is remembered (a turn's votes arrive together)


def kind_hint(kind: str, precise: str, state: str, seed: int) -> str:
    """The hint of `kind` for a correction whose precise hint is `precise` (deterministic in seed and state)."""
    if kind == "precise":
        return precise
    if kind == "verbose":
        return VERBOSE.format(hint=precise)
    if kind == "vague":
        return VAGUE[zlib.crc32(f"{seed}\n{state}".encode()) % len(VAGUE)]
    raise ValueError(f"unknown hint kind {kind!r}; one of {', '.join(KINDS)}")


def hint_kind(hint: str) -> str:
    """Which kind a hint of this judge is (for counting what a selection rule picked)."""
    hint = hint.strip()
    if hint in VAGUE:
        return "vague"
    head = VERBOSE.split("{hint}", 1)[0].strip()
    return "verbose" if hint.startswith(head) else "precise"


def several_hints_reply(prompt: str, vote: int, seed: int = 0) -> tuple[str, str]:
    """(full reply, minimal reply) of vote number `vote` on a judge prompt: ``judge_reply``'s, except that a
    hint prompt with a correction gets the hint of kind ``KINDS[vote % 3]``."""
    parsed = None if read_extraction_prompt(prompt) is not None else read_judge_prompt(prompt)
    if parsed is None or parsed[0] != "hint":
        return judge_reply(prompt)
    _, role, state = parsed
    precise = extract_hint(state) if role != "tool" and score_next_state(state, role) < 0 else ""
    if not precise:
        return judge_reply(prompt)
    hint = kind_hint(KINDS[vote % len(KINDS)], precise, state, seed)
    short = f"\\boxed{{1}}\n[HINT_START]{hint}[HINT_END]"
    return f"The user corrected the response. {short}", short


class SeveralHintsJudgeModel(RuleJudgeModel):
    """``RuleJudgeModel`` whose hint votes on one prompt give the precise, vague and verbose hint in turn.

    Args: as ``RuleJudgeModel``, plus `seed` (which vague phrasing a turn gets).
    """

    def __init__(self, tokenizer: Any, teacher: EngineModel | None = None, *, context_length: int = 131072,
                 seed: int = 0):
        super().__init__(tokenizer, teacher, context_length=context_length)
        self.seed = seed
        self._votes: OrderedDict[bytes, int] = OrderedDict()  # prompt digest -> votes answered

    def _next_vote(self, prompt: str) -> int:
        key = hashlib.blake2b(prompt.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        vote = self._votes.pop(key, 0)
        self._votes[key] = vote + 1
        while len(self._votes) > _SEEN_CAP:
            self._votes.popitem(last=False)
        return vote

    def reply_ids(self, prompt_ids: Sequence[int], budget: int) -> list[int]:
        prompt = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        full, short = several_hints_reply(prompt, self._next_vote(prompt), self.seed)
        ids = self.tokenizer.encode(full, add_special_tokens=False)
        return ids if len(ids) < budget else self.tokenizer.encode(short, add_special_tokens=False)


def judge_core(judge_hints: str, tokenizer: Any, teacher: EngineModel | None, seed: int) -> RuleJudgeModel:
    """The embedded judge core for ``local --judge-hints`` (one: the rule judge, unchanged)."""
    if judge_hints == "one":
        return RuleJudgeModel(tokenizer, teacher=teacher)
    if judge_hints == "several":
        return SeveralHintsJudgeModel(tokenizer, teacher=teacher, seed=seed)
    raise ValueError(f"unknown --judge-hints {judge_hints!r}; one of {', '.join(JUDGE_HINTS)}")
