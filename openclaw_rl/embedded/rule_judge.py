"""``RuleJudgeModel``: a rule-based judge core for the embedded CPU stack's judge/teacher server.

Stage: proxy's ``JudgeClient`` → engine server (``make_engine_app``) → **rule judge core**. The tiny
policy cannot judge, yet RL needs ``\\boxed{}`` votes and OPD needs hints, so this core reads the judge
prompt the client rendered (PRM or hint, see ``openclaw_rl.judge``), finds its next-state section and
answers by rules: thanks / moving on / a successful tool result score +1; a correction, redo, rephrase,
"no, …" or an error scores -1; anything else 0. Hint prompts get ``\\boxed{1}`` and the user's
instruction as an imperative hint, or ``\\boxed{-1}``. OEL's experience-extraction prompts get the
user's corrections over the whole conversation as rules (``experience_rules``). Teacher scoring (``score``) is delegated to a
wrapped core, normally the frozen initial policy, so one server plays both of upstream's PRM roles.

The output is emitted as canonical token ids with log-prob 0 and then eos: judge output is read as
text and never trained on, so there is no distribution to report.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from openclaw_rl.embedded.task import user_text
from openclaw_rl.engine.model import EngineModel, InputScores, SamplingConfig, TokenStep
from openclaw_rl.judge import HINT_USER, PRM_USER

EXPERIENCE_START = "[EXPERIENCE_START]"  # OEL's extraction prompt (openclaw_oel.experience) asks for this block

# --- pure rules ----------------------------------------------------------------------------------------

_TOOL_ERROR = re.compile(
    r"\b(?:error|errors|exception|traceback|failed|failure|fatal|not found|no such file|permission denied|"
    r"denied|invalid|timed out|timeout|cannot|can't|unable to|refused)\b|exit (?:code|status):? *[1-9]|"
    r"\"(?:ok|success)\": *false|\bstatus(?: code)?:? *[45]\d\d\b", re.IGNORECASE)
_POSITIVE = re.compile(
    r"\b(?:thanks|thank you|thx|perfect|great|awesome|excellent|exactly|nice|that works|works now|"
    r"got it|helpful|moving on|next question|next:|next,|love it|well done|looks good)", re.IGNORECASE)
_NEGATIVE = re.compile(
    r"^\s*(?:no|nope|nah|wrong)\b(?! (?:problem|worries)\b)|\b(?:wrong|incorrect|not what i|not right|"
    r"that's not|that is not|isn't right|redo|re-do|try again|do it again|once more|rephrase|rewrite|"
    r"instead|doesn't work|does not work|didn't work|did not work|not working|i said|i asked|you forgot|"
    r"change (?:it|that|this)|should have|should be|still not|not quite|mistake)\b", re.IGNORECASE)
_BUT = re.compile(r"\bbut\b", re.IGNORECASE)
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")
_CLAUSE = re.compile(r"\b(?:but|please|instead|rather)\b", re.IGNORECASE)
_LEAD_INS = re.compile(
    r"^(?:(?:no|nope|nah|wrong|hmm|ok|okay|well|actually|sorry|again|also|and|but|so)\b[,.!:;]?\s*|"
    r"(?:that's|that is|this is|it's|it is) (?:not (?:what i (?:wanted|asked for|meant)|right|it)|wrong)[,.!:;]?\s*|"
    r"please\b[,]?\s*|(?:instead|rather)\b[,]?\s*|(?:can|could|would|will) you (?:please )?|i (?:want|need|would like|'d like) you to |"
    r"you (?:should|must|need to) )+", re.IGNORECASE)
_IMPERATIVE = re.compile(
    r"^(?:answer|reply|respond|use|keep|be|write|make|add|talk|start|give|format|try|include|avoid|don't|"
    r"do not|stop|explain|show|list|put|speak|sound|say|end|begin|skip|remove|check|call|run)\b", re.IGNORECASE)


def score_next_state(text: str, role: str = "user") -> int:
    """+1 progress, -1 correction or error, 0 ambiguous: the PRM's rubric as plain rules.

    Negative cues win over positive ones ("thanks, but please …" is a change request), as the PRM prompt
    says a request to change the output is negative feedback. A bare instruction with no thanks is a
    change request too; a tool result is positive unless it reports an error. A user message is read
    as the person typed it: OpenClaw's timestamp prefix, Runtime line and internal-context block are
    not part of it (`task.user_text`).
    """
    text = text.strip() if role == "tool" else user_text(text)
    if not text:
        return 0
    if role == "tool":
        return -1 if _TOOL_ERROR.search(text) else 1
    positive = bool(_POSITIVE.search(text))
    if _NEGATIVE.search(text) or (positive and _BUT.search(text) and extract_hint(text)):
        return -1
    if positive:
        return 1
    return -1 if extract_hint(text) else 0


def extract_hint(text: str) -> str:
    """The first instruction sentence of a user message, as an imperative ("" if there is none).

    "No, please answer formally and politely. How do I …?" → "Answer formally and politely.": lead-ins
    ("no,", "please", "could you", "I want you to") are dropped, the first letter is capitalised and
    the sentence ends with a period, the same shape as the pre-training's style instructions.
    OpenClaw's timestamp prefix and internal-context block are skipped (`task.user_text`).
    """
    for match in _SENTENCE.finditer(user_text(text)):
        sentence = match.group().strip()
        # The instruction may follow a clause: "Thanks, but please …", "Nice, instead use …".
        starts = [0, *(m.start() for m in _CLAUSE.finditer(sentence))]
        for start in starts:
            clause = _LEAD_INS.sub("", sentence[start:]).strip()
            if clause and _IMPERATIVE.match(clause):
                clause = clause.rstrip(".!?").strip()
                return clause[:1].upper() + clause[1:] + "."
    return ""


# --- reading the judge prompt --------------------------------------------------------------------------


def _section_pattern(template: str) -> tuple[re.Pattern[str], str]:
    """(header regex with a `role` group, the literal text that follows the next state) of a judge template."""
    before, after = template.split("{next_state}", 1)
    header = before.rsplit("\n\n", 1)[-1]  # "## Next state … [role: {role}]\n"
    head, tail = header.split("{role}", 1)
    closing = after.split("{", 1)[0]  # up to the first format field: literal in the rendered prompt
    return re.compile(re.escape(head) + r"(?P<role>[^\]\n]*)" + re.escape(tail)), closing


_PRM_SECTION = _section_pattern(PRM_USER)
_HINT_SECTION = _section_pattern(HINT_USER)


def read_judge_prompt(prompt: str) -> tuple[str, str, str] | None:
    """("prm" | "hint", role, next-state text) from a rendered judge prompt, or None if it is neither."""
    response_at = prompt.find("## Assistant")
    kind = "hint" if 0 <= prompt.find("[HINT_START]") < max(response_at, 0) else "prm"
    pattern, closing = _HINT_SECTION if kind == "hint" else _PRM_SECTION
    headers = list(pattern.finditer(prompt))
    if not headers:
        return None
    header = headers[-1]
    end = prompt.rfind(closing, header.end())
    body = prompt[header.end():end if end >= 0 else len(prompt)]
    return kind, header.group("role").strip(), body.strip()


_CONVERSATION = re.compile(r"## Conversation\n(?P<body>.*)\n## End of conversation", re.DOTALL)
_ROLE = re.compile(r"^### (?P<role>[a-z]+)\n", re.MULTILINE)


def read_extraction_prompt(prompt: str) -> list[tuple[str, str]] | None:
    """[(role, text)] of the conversation in an OEL experience-extraction prompt, or None if it is not one."""
    if EXPERIENCE_START not in prompt:
        return None
    found = _CONVERSATION.search(prompt)
    if found is None:
        return None
    body = found.group("body")
    heads = list(_ROLE.finditer(body))
    return [(h.group("role"), body[h.end():heads[k + 1].start() if k + 1 < len(heads) else len(body)].strip())
            for k, h in enumerate(heads)]


def experience_rules(conversation: list[tuple[str, str]]) -> list[str]:
    """The user's corrections as imperative rules, first occurrence kept: every user message after the
    first that scores -1 and carries an instruction ("No, please answer formally." → "Answer formally.")."""
    rules: list[str] = []
    users = [text for role, text in conversation if role == "user"]
    for text in users[1:]:
        rule = extract_hint(text) if score_next_state(text) < 0 else ""
        if rule and rule.lower() not in (r.lower() for r in rules):
            rules.append(rule)
    return rules


def extraction_reply(conversation: list[tuple[str, str]]) -> tuple[str, str]:
    rules = experience_rules(conversation)
    if not rules:
        return "The user made no correction to learn from. \\boxed{0}", "\\boxed{0}"
    block = f"{EXPERIENCE_START}\n" + "\n".join(f"- {r}" for r in rules) + "\n[EXPERIENCE_END]\n\\boxed{1}"
    return f"The user corrected the assistant.\n{block}", block


def judge_reply(prompt: str) -> tuple[str, str]:
    """(full reply, minimal reply) for a judge prompt; the minimal one fits a small token budget."""
    conversation = read_extraction_prompt(prompt)
    if conversation is not None:
        return extraction_reply(conversation)
    parsed = read_judge_prompt(prompt)
    if parsed is None:
        return "No next state found. \\boxed{0}", "\\boxed{0}"
    kind, role, state = parsed
    if kind == "hint":
        hint = extract_hint(state) if role != "tool" and score_next_state(state, role) < 0 else ""
        if hint:
            short = f"\\boxed{{1}}\n[HINT_START]{hint}[HINT_END]"
            return f"The user corrected the response. {short}", short
        return "No actionable hindsight. \\boxed{-1}", "\\boxed{-1}"
    score = score_next_state(state, role)
    reason = {1: "The next state shows progress.", -1: "The next state asks for a change or reports an error.",
              0: "The next state is ambiguous."}[score]
    return f"{reason} \\boxed{{{score}}}", f"\\boxed{{{score}}}"


# --- the core --------------------------------------------------------------------------------------------


class RuleJudgeModel:
    """An ``EngineModel`` that judges by rules and scores with an optional wrapped teacher core.

    Args:
        tokenizer: the judge prompt's tokenizer (decodes prompt ids, encodes the reply).
        teacher: the core that answers ``score`` (teacher log-probs), e.g. a ``TorchModel`` of the
            frozen initial policy; without one, ``score`` raises.
        context_length: judge prompts carry the long PRM instructions; the teacher only ever scores
            policy-sized prompts, so the limit here is the judge's, not the teacher's.
    """

    def __init__(self, tokenizer: Any, teacher: EngineModel | None = None, *, context_length: int = 131072):
        self.tokenizer = tokenizer
        self.teacher = teacher
        self._context_length = context_length
        self._eos = teacher.eos_token_ids if teacher is not None else frozenset([tokenizer.eos_token_id])
        self._weight_version = "default"
        self.calls = 0

    @property
    def vocab_size(self) -> int:
        return self.teacher.vocab_size if self.teacher is not None else len(self.tokenizer)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def weight_version(self) -> str:
        return self.teacher.weight_version if self.teacher is not None else self._weight_version

    def reply_ids(self, prompt_ids: Sequence[int], budget: int) -> list[int]:
        """The reply as canonical ids; the minimal form when the full one would not fit `budget`."""
        prompt = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        full, short = judge_reply(prompt)
        ids = self.tokenizer.encode(full, add_special_tokens=False)
        return ids if len(ids) < budget else self.tokenizer.encode(short, add_special_tokens=False)

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> AsyncGenerator[TokenStep, None]:
        """The rule verdict's ids, then eos repeated (the server stops at the first one)."""
        self.calls += 1
        ids = self.reply_ids(prompt_ids, sampling.max_new_tokens)
        eos = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id in self._eos else min(self._eos)
        for i in range(sampling.max_new_tokens):
            token = ids[i] if i < len(ids) else eos
            top = ((0.0, token),) if sampling.top_logprobs_num else ()
            yield TokenStep(token, 0.0, top, self.weight_version)
            await asyncio.sleep(0)  # let concurrent votes interleave, as in a batching engine

    async def score(self, ids: Sequence[int], start: int, top_k: int) -> InputScores:
        if self.teacher is None:
            raise RuntimeError("RuleJudgeModel has no teacher core: teacher log-probs (OPD / combine) need "
                               "RuleJudgeModel(tokenizer, teacher=<EngineModel of the frozen policy>)")
        return await self.teacher.score(ids, start, top_k)

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None) -> None:
        """Passed to the teacher; the rules have no weights. (The frozen teacher is normally never updated.)"""
        if self.teacher is not None:
            await self.teacher.update_weights_from_disk(model_path, weight_version)
        elif weight_version is not None:
            self._weight_version = weight_version

    def flush_cache(self) -> None:
        if self.teacher is not None:
            self.teacher.flush_cache()
