"""A teacher server apart from the judge, and the check that it shares the policy's tokenizer.

Stage: proxy start-up → **teacher client** → mode scorer. By default the judge server is also the
teacher (upstream 0d034dd, and this project until now). ``openclaw_opd_teacher_url`` (``TEACHER_URL``,
``--teacher-url``) names another SGLang server for the teacher log-probs alone; the votes and hints
still come from the judge. Upstream's later answer (PR #85, ``OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=megatron``)
runs the teacher inside the trainer instead; this keeps it a server the proxy calls.

Why the same tokenizer: token-level OPD compares, token by token, ``log p_teacher(y_t | hinted prompt,
y_<t)`` with the student's ``log p(y_t | ...)`` for the *student's sampled ids* ``y``. The teacher is
handed those ids verbatim; under another vocabulary the same id is another string (or out of range), so
the "teacher log-prob" would score a different text, and the top-K loss would compare unrelated ids.
A teacher is refused at start-up when its tokenizer differs from the policy's: vocabulary (string → id),
added and special tokens. Its tokenizer is read from ``openclaw_opd_teacher_tokenizer`` if set, else
from the path the teacher server reports (``/model_info`` or ``/get_model_info``: ``tokenizer_path`` or
``model_path``) when that path exists here; when neither is available the check cannot run, which is
logged, and the per-call checks remain (every id in range, every scored entry the id sent).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import httpx

from openclaw_rl.config import Settings
from openclaw_rl.judge import JudgeClient

log = logging.getLogger(__name__)


def tokenizer_mismatch(policy: Any, teacher: Any) -> str | None:
    """Why two tokenizers do not map ids to the same strings (None if they do)."""
    pv, tv = policy.get_vocab(), teacher.get_vocab()
    if len(pv) != len(tv):
        return f"vocabulary of {len(tv)} tokens, the policy's has {len(pv)}"
    if pv != tv:
        token = next(t for t in sorted(pv) if tv.get(t) != pv[t])
        return f"token {token!r} is id {tv.get(token)} for the teacher and {pv[token]} for the policy"
    ps, ts = sorted(map(str, policy.all_special_tokens)), sorted(map(str, teacher.all_special_tokens))
    if ps != ts:
        return f"special tokens {ts} differ from the policy's {ps}"
    return None


def reported_tokenizer_path(http: httpx.Client, url: str, headers: dict[str, str] | None = None) -> str:
    """The tokenizer path the teacher server reports ("" if none, or the server cannot be reached)."""
    for path in ("/model_info", "/get_model_info"):
        try:
            r = http.get(url.rstrip("/") + path, headers=headers)
        except httpx.HTTPError:
            return ""
        if r.status_code == 200:
            try:
                info = r.json()
            except ValueError:
                return ""
            return str(info.get("tokenizer_path") or info.get("model_path") or "")
    return ""


def check_teacher_tokenizer(settings: Settings, policy_tokenizer: Any, *, load: Any,
                            http: httpx.Client | None = None) -> str:
    """Raise ValueError if the separate teacher's tokenizer differs from the policy's; returns the path
    that was compared ("" when none could be)."""
    o = settings.opd
    path, source = o.teacher_tokenizer, "openclaw_opd_teacher_tokenizer"
    if not path:
        headers = {"Authorization": f"Bearer {o.teacher_api_key}"} if o.teacher_api_key else None
        client = http or httpx.Client(timeout=10.0, trust_env=False)
        try:
            path, source = reported_tokenizer_path(client, o.teacher_url, headers), f"{o.teacher_url}/model_info"
        finally:
            if http is None:
                client.close()
        if not path or not os.path.isdir(path):
            log.warning("teacher %s: its tokenizer could not be compared with the policy's (%s); set "
                        "openclaw_opd_teacher_tokenizer (TEACHER_MODEL_PATH) to a local copy to check it at start",
                        o.teacher_url, f"it reports {path!r}, not a directory here" if path else "no model_info")
            return ""
    problem = tokenizer_mismatch(policy_tokenizer, load(path, "openclaw_opd_teacher_tokenizer"))
    if problem:
        raise ValueError(
            f"the teacher at {o.teacher_url} does not share the policy's tokenizer ({source}: {path}): {problem}. "
            "Token-level OPD scores the policy's sampled token ids under the teacher, so both models must use "
            "the same tokenizer; use a teacher of the policy's family, or leave openclaw_opd_teacher_url empty "
            "(the judge is the teacher)")
    return path


def build_teacher(http: httpx.AsyncClient, settings: Settings, policy_tokenizer: Any, *, load: Any,
                  on_vote: Any = None, on_retry: Any = None) -> JudgeClient | None:
    """The teacher's client when ``openclaw_opd_teacher_url`` is set (None: the judge is the teacher)."""
    o = settings.opd
    if not o.teacher_url:
        return None
    check_teacher_tokenizer(settings, policy_tokenizer, load=load)
    j = dataclasses.replace(settings.judge, url=o.teacher_url, api="sglang", api_key=o.teacher_api_key)
    return JudgeClient(http, j, tokenizer=policy_tokenizer, vocab_size=len(policy_tokenizer), on_vote=on_vote,
                       teacher_concurrency=o.teacher_concurrency, on_retry=on_retry)  # the proxy's pooled client: nothing to close
