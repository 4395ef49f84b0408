"""Typed settings for every stage, loaded from one flat key space.

The same keys come from three places, highest precedence first: the CLI / the YAML that Slime's
``--custom-config-path`` loads onto ``args`` (keys prefixed ``openclaw_``), upstream OpenClaw-RL's
environment variables (``PORT``, ``PRM_M``, …), and Slime's own flags (``--prm-m``,
``--rollout-temperature``, …). Each field's comment says what the value *does*. ``load_settings``
rejects unknown ``openclaw_*`` keys so a typo in a config file fails loudly instead of being ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .config_values import coerce, declared_optional, is_null
from .modes import MODES, resolve

PREFIX = "openclaw_"


@dataclass
class ProxySettings:
    host: str = "127.0.0.1"  # bind address; anything but loopback needs an API key or allow_insecure_bind
    port: int = 30000
    api_keys: list[str] = field(default_factory=list)  # bearer keys; each is its own session namespace
    allow_insecure_bind: bool = False  # permit a non-loopback bind without any API key (trusted LANs only)
    advertise_host: str = ""  # the address clients and other nodes reach this proxy at ("": found, see address.py)
    served_model_name: str = "openclaw-policy"  # `model` reported to clients and used when they send none
    policy_url: str = "http://127.0.0.1:30010"  # SGLang (or the embedded engine) serving the policy; several
    # engines comma-separated (a YAML list too): each session stays on one (engines.py), or one sglang-router URL
    policy_api_key: str = ""  # sent to the policy backend as a bearer token when set
    tokenizer: str = ""  # HF tokenizer dir of the policy; renders the chat template exactly as trained
    request_timeout_s: float = 600.0  # a policy call slower than this becomes a 504 (--policy-timeout)
    connect_timeout_s: float = 5.0
    max_body_bytes: int = 8 * 1024 * 1024  # larger request bodies get 413
    max_response_bytes: int = 64 * 1024 * 1024  # a policy /generate answer, one of its stream events, or a
    # stream's content beyond this is cut off: 502, the turn dropped (capped.py); 0 = no cap
    max_messages: int = 10_000  # requests with more messages get 400 before anything is rendered
    context_length: int = 0  # the policy's context in tokens; 0 = learn it from the server (/v1/models)
    header_timeout_s: float = 10.0  # a connection must send a complete request head within this, or is closed
    body_timeout_s: float = 60.0  # a request body must arrive completely within this, or 408
    max_connections: int = 2048  # open client connections beyond this are closed at once (fd protection)
    max_connections_per_client: int = 512  # per client address (IPv6: per /64); 0 = no limit (behind a
    # reverse proxy, where every client has its address)
    reserved_connections: int = 128  # the last free slots go only to addresses below the mean per address
    # (one address, or a few at their limit, cannot take them); 0 = no reserve
    probe_interval_s: float = 10.0  # how often /healthz's view of the policy and judge is refreshed
    max_header_bytes: int = 64 * 1024  # larger request heads are refused with 400 by the HTTP parser
    max_new_tokens: int = 2048  # used when the client sends neither max_tokens nor max_completion_tokens
    max_new_tokens_cap: int = 8192  # client values above this are clamped (Slime's rollout-max-response-len)
    rollout_temperature: float | None = 1.0  # main-line turns sample at this temperature so rollout
    # log-probs match the trainer's; None lets the client's temperature through (upstream behaviour)
    reasoning_parser: str = "auto"  # auto: the family detected from the tokenizer (chat_format.py), else qwen3
    tool_parser: str = "auto"  # auto, or qwen25 / hermes / mistral / none (SGLang's names)
    enable_thinking: bool | None = None  # passed to the chat template when set
    pause_mode: str = "reject"  # while weights sync: "reject" (503 + Retry-After, upstream) or "hold"
    pause_hold_s: float = 60.0  # "hold": the longest a request waits for submission to reopen
    session_ttl_s: float = 900.0  # idle sessions are flushed (last turn without next_state) and evicted
    max_sessions: int = 100_000  # beyond this, the least recently used idle session is flushed early
    identity: list[str] = field(default_factory=lambda: [
        "explicit", "affinity", "prompt_cache_key", "openclaw_runtime", "prefix"])  # strongest first
    turn_classifier: str = "auto"  # "auto" (OpenClaw-aware heuristics), "all_main", "tools_only"
    record_dir: str = ""  # JSONL conversation + judge records when set
    rate_limit_per_min: int = 0  # per API key; 0 = unlimited
    trusted_user_keys: list[str] = field(default_factory=list)  # keys whose user header names the user
    # (one key for many people, docs/users.md); from any other key the header is ignored
    user_header: str = "x-user-id"  # the header a trusted key names its user with
    admin_keys: list[str] = field(default_factory=list)  # keys that may delete any user (DELETE /v1/users/..)
    per_user_adapters: bool = False  # each user's requests use that user's LoRA adapter once it exists
    stream_interval: int = 8  # streamed /generate calls ask SGLang for one event per this many tokens
    # (sampling_params.stream_interval; the first token and the finish come at once); 0 = send nothing,
    # the server's --stream-interval applies. See docs/deployment.md "Stream interval".
    stream_gather_ms: float = 50.0  # a streamed reply's tokens that arrive within this long of a client write go out
    # in the next write, together (the first and the last never wait); longer: less CPU per token, coarser updates


@dataclass
class JudgeSettings:
    url: str = ""  # SGLang server of the judge/teacher; empty disables PRM (see README: no learning signal)
    api: str = "sglang"  # "sglang" (/generate) or "openai" (/v1/chat/completions; votes only, no teacher)
    api_key: str = ""
    model: str = ""  # model name for api=openai
    tokenizer: str = ""  # judge's chat template; empty = the policy tokenizer
    votes: int = 3  # m: judge calls per turn; the majority wins, ties and all-failed score 0
    temperature: float = 0.6
    max_new_tokens: int = 4096
    timeout_s: float = 120.0  # a vote slower than this counts as failed
    concurrency: int = 32  # judge/teacher calls in flight at once
    context_length: int = 0  # the judge's context in tokens; 0 = learn it from the server (/v1/models)
    # before its first call, and again from a context-length 400 (then the call is retried, clamped)
    retry_attempts: int = 5  # tries per judge/teacher call failing for a reason that can pass (unreachable,
    # 5xx, timeout), the first included; 1 = no retry. The turn waits, durable, meanwhile.
    retry_max_s: float = 300.0  # no retry starts this long after a call's first attempt; then judge_failed
    retry_backoff_s: float = 1.0  # wait before the first retry; doubles each time, at most 30 s
    max_response_bytes: int = 64 * 1024 * 1024  # a judge or teacher answer beyond this is cut off and the
    # call fails (a failed vote, a failed teacher call); 0 = no cap


@dataclass
class SpoolSettings:
    dir: str = ""  # where finished samples persist; empty = a temp dir (lost on exit; tests only)
    max_bytes: int = 4 * 1024**3  # live (unacknowledged) sample bytes beyond which new samples wait in memory
    max_overflow: int = 10_000  # samples held in memory while the spool is full; beyond, new turns get 503
    sync: str = "full"  # SQLite synchronous: "full" (a committed sample survives a power loss) or "normal"
    # (opt-in: survives a crash of the proxy process, not of the machine; no fsync per commit)


@dataclass
class RLSettings:
    keep_masked_samples: bool = False  # upstream enqueues score-0 turns with loss_mask 0 (they fill
    # batch slots and dilute the loss); we count them as excluded instead. True = upstream behaviour.
    at_least_one: bool = True  # a session's first judged turn is trained even when it scored 0


@dataclass
class OPDSettings:
    distill_topk: int = 0  # K>0 also fetches the teacher's top-K log-probs for the top-K loss
    eval_mode: bool = False  # also run PRM votes to report rollout/prm_eval_score (OPENCLAW_EVAL_MODE)
    min_hint_chars: int = 10  # hints this short or shorter are rejected, as upstream
    teacher_concurrency: int = 3  # teacher log-prob calls in flight at once (within judge.concurrency)
    # which hint's teacher signal a sample keeps, for opd and combine alike (openclaw_opd/selection.py):
    # longest (upstream's single hint), shortest, sequence_optimal, token_optimal (OPENCLAW_TOPK_HINT_SELECTION)
    hint_selection: str = "longest"
    max_hint_candidates: int = 3  # candidates scored by sequence_/token_optimal (OPENCLAW_TOPK_MAX_CAND)
    # which ids the top-K loss compares: teacher (its top-K) or overlap (those also in the student's top-K);
    # see openclaw_opd/loss.py (OPENCLAW_TOPK_SUBSET_MODE)
    distill_subset: str = "teacher"
    # a teacher server apart from the judge (openclaw_opd/teacher_server.py); empty: the judge is the teacher
    teacher_url: str = ""  # TEACHER_URL: SGLang /generate for the teacher log-probs only
    teacher_api_key: str = ""  # TEACHER_API_KEY
    teacher_tokenizer: str = ""  # TEACHER_MODEL_PATH: its tokenizer, compared with the policy's at start
    # where the teacher log-probs are computed (OPENCLAW_COMBINE_OPD_TEACHER_SOURCE, upstream PR #85): server (the
    # judge's or teacher_url's /generate, stored in the sample) or trainer (the sample stores the hinted prompt ids,
    # a frozen teacher copy in the trainer scores them; openclaw_rl/embedded/frozen_teacher.py)
    teacher_source: str = "server"
    teacher_checkpoint: str = ""  # trainer source: the teacher's checkpoint (empty: the initial policy weights)


HINT_SELECTIONS = ("longest", "shortest", "sequence_optimal", "token_optimal")  # OPDSettings.hint_selection
DISTILL_SUBSETS = ("teacher", "overlap", "student")  # OPDSettings.distill_subset (openclaw_opd.loss reads the same list)
COMBINE_LOSSES = ("ppo", "topk_select")  # CombineSettings.loss
TEACHER_SOURCES = ("server", "trainer")  # OPDSettings.teacher_source
TRAINER_TEACHER_MODES = ("opd", "combine", "oel")  # the modes whose teacher can run in the trainer (frozen_teacher.py)
# upstream's spellings of OPENCLAW_COMBINE_OPD_TEACHER_SOURCE (combine_loss.py, prm_teacher_postprocess.py)
TEACHER_SOURCE_ALIASES = {"inference": "server", "infer": "server", "sglang": "server", "rollout": "server",
                          "megatron": "trainer", "mcore": "trainer", "ref": "trainer"}


def teacher_source_name(value: str) -> str:
    """``server`` or ``trainer`` from ours or upstream's spelling (case and spaces ignored); raises otherwise."""
    v = str(value).strip().lower()
    v = TEACHER_SOURCE_ALIASES.get(v, v)
    if v not in TEACHER_SOURCES:
        raise ValueError(f"openclaw_opd_teacher_source (OPENCLAW_COMBINE_OPD_TEACHER_SOURCE): {value!r} is not one of "
                         f"{', '.join(TEACHER_SOURCES)} (upstream's inference/megatron are accepted too)")
    return v


@dataclass
class CombineSettings:
    w_rl: float = 1.0  # weight of the GRPO advantage
    w_opd: float = 1.0  # weight of the teacher−student advantage
    # ppo: one PPO loss on w_opd*(teacher - old) + w_rl*A_grpo (openclaw_combine/loss.py); topk_select:
    # w_rl*GRPO + w_opd*PPO surrogate over the teacher's top-K ids (openclaw_combine/topk_select.py, upstream
    # PR #109), which needs openclaw_opd_distill_topk > 0
    loss: str = "ppo"
    topk_adv_diff_clip: float = 1.0  # topk_select: |teacher - old| clip per id, 0 = none (OPENCLAW_TOPK_ADV_DIFF_CLIP)


def _mode_sections() -> dict[str, Any]:
    return {name: resolve(m.settings)() for name, m in MODES.items() if m.settings}


@dataclass
class Settings:
    mode: str = "rl"
    proxy: ProxySettings = field(default_factory=ProxySettings)
    judge: JudgeSettings = field(default_factory=JudgeSettings)
    spool: SpoolSettings = field(default_factory=SpoolSettings)
    # one section per mode of the registry (openclaw_rl.modes), read as settings.rl, settings.opd, …
    modes: dict[str, Any] = field(default_factory=_mode_sections)

    def __getattr__(self, name: str) -> Any:  # only called for names that are not fields
        sections = self.__dict__.get("modes") or {}
        if name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or mode section {name!r}")

    def sections(self) -> dict[str, Any]:
        """Every settings section by its key prefix: proxy, judge, spool, then one per mode."""
        return {"proxy": self.proxy, "judge": self.judge, "spool": self.spool, **self.modes}

    def validate(self) -> Settings:
        p, j = self.proxy, self.judge
        if not 0 <= p.port <= 65535:  # 0: any free port (in-process proxies, tests)
            raise ValueError(f"openclaw_proxy_port: expected a TCP port 0-65535 (0 = any free port), got {p.port}")
        for i, key in enumerate([*p.api_keys, *p.admin_keys]):
            if not key or not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
                which, n = ("api", i) if i < len(p.api_keys) else ("admin", i - len(p.api_keys))
                raise ValueError(f"openclaw_proxy_{which}_keys: key #{n + 1} is empty or contains whitespace, control or "
                                 "non-ASCII characters (an unset $KEY expands to an empty key); refusing to start")
        positive = {"openclaw_proxy_request_timeout_s": p.request_timeout_s, "openclaw_proxy_max_body_bytes":
                    p.max_body_bytes, "openclaw_proxy_max_messages": p.max_messages, "openclaw_proxy_header_timeout_s":
                    p.header_timeout_s, "openclaw_proxy_body_timeout_s": p.body_timeout_s,
                    "openclaw_proxy_max_connections": p.max_connections, "openclaw_proxy_max_sessions": p.max_sessions,
                    "openclaw_judge_timeout_s": j.timeout_s, "openclaw_spool_max_bytes": self.spool.max_bytes}
        for key, value in positive.items():
            if not value > 0:
                raise ValueError(f"{key}: expected a positive number, got {value}")
        for key, value in {"openclaw_proxy_max_response_bytes": p.max_response_bytes,
                           "openclaw_judge_max_response_bytes": j.max_response_bytes}.items():
            if value < 0:
                raise ValueError(f"{key}: expected a number of bytes (0 = no cap), got {value}")
        if not 0 <= p.stream_gather_ms < float("inf"):
            raise ValueError(f"openclaw_proxy_stream_gather_ms: expected finite milliseconds >= 0, got "
                             f"{p.stream_gather_ms}")
        if p.stream_interval < 0:
            raise ValueError(f"openclaw_proxy_stream_interval: expected 0 (the server's default) or a number of "
                             f"tokens >= 1, got {p.stream_interval}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if j.votes < 1:
            raise ValueError("judge votes (openclaw_judge_votes / PRM_M) must be >= 1")
        if not 0 <= j.temperature < float("inf"):
            raise ValueError(f"openclaw_judge_temperature (PRM_TEMPERATURE): expected a number >= 0, got {j.temperature}")
        if j.max_new_tokens < 1:
            raise ValueError(f"openclaw_judge_max_new_tokens (PRM_MAX_NEW_TOKENS): expected >= 1, got {j.max_new_tokens}")
        if j.retry_attempts < 1:
            raise ValueError(f"openclaw_judge_retry_attempts: expected >= 1 (1 = no retry), got {j.retry_attempts}")
        if not 0 < j.retry_max_s < float("inf"):
            raise ValueError(f"openclaw_judge_retry_max_s: expected a positive number of seconds, got {j.retry_max_s}")
        if not 0 <= j.retry_backoff_s < float("inf"):
            raise ValueError(f"openclaw_judge_retry_backoff_s: expected a number of seconds >= 0, got "
                             f"{j.retry_backoff_s}")
        if self.opd.teacher_concurrency < 0:
            raise ValueError("openclaw_opd_teacher_concurrency (OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY): expected 0 "
                             f"(no limit) or more, got {self.opd.teacher_concurrency}")
        if self.opd.hint_selection not in HINT_SELECTIONS:
            raise ValueError(f"openclaw_opd_hint_selection (OPENCLAW_TOPK_HINT_SELECTION): unknown rule "
                             f"{self.opd.hint_selection!r}; one of {', '.join(HINT_SELECTIONS)}")
        if self.opd.distill_subset not in DISTILL_SUBSETS:
            raise ValueError(f"openclaw_opd_distill_subset (OPENCLAW_TOPK_SUBSET_MODE): {self.opd.distill_subset!r} "
                             f"is not one of {', '.join(DISTILL_SUBSETS)}")
        policy_urls = [u.strip() for u in p.policy_url.split(",")]
        if not all(u.lower().startswith(("http://", "https://")) for u in policy_urls) or \
                len(set(policy_urls)) != len(policy_urls):
            raise ValueError("openclaw_proxy_policy_url: expected http(s)://host:port, or several such URLs "
                             f"(distinct, comma-separated), got {p.policy_url!r}")
        if self.opd.teacher_url and not self.opd.teacher_url.lower().startswith(("http://", "https://")):
            raise ValueError(f"openclaw_opd_teacher_url (TEACHER_URL): expected http(s)://host:port, got "
                             f"{self.opd.teacher_url!r}")
        self._validate_teacher_source()
        if self.opd.distill_subset == "student" and self.opd.teacher_source != "trainer":
            raise ValueError("openclaw_opd_distill_subset (OPENCLAW_TOPK_SUBSET_MODE) student: the teacher's log-probs "
                             "at the student's top-K need the teacher inside the trainer (openclaw_opd_teacher_source: "
                             "trainer, --teacher-source trainer): a teacher server returns its own top-K only (overlap "
                             "is the part of the student's subset it knows exactly)")
        if self.opd.max_hint_candidates < 1:
            raise ValueError("openclaw_opd_max_hint_candidates (OPENCLAW_TOPK_MAX_CAND): expected >= 1, got "
                             f"{self.opd.max_hint_candidates}")
        if self.combine.loss not in COMBINE_LOSSES:
            raise ValueError(f"openclaw_combine_loss: {self.combine.loss!r} is not one of {', '.join(COMBINE_LOSSES)}")
        if self.mode == "combine" and self.combine.loss == "topk_select" and self.opd.distill_topk < 1:
            raise ValueError("openclaw_combine_loss: topk_select trains on the teacher's top-K: set "
                             "openclaw_opd_distill_topk (--distill-topk) to K >= 1 (upstream: 4)")
        if not 0 <= self.combine.topk_adv_diff_clip < float("inf"):
            raise ValueError("openclaw_combine_topk_adv_diff_clip (OPENCLAW_TOPK_ADV_DIFF_CLIP): expected a number "
                             f">= 0 (0: no clip), got {self.combine.topk_adv_diff_clip}")
        t = p.rollout_temperature
        if t is not None and not 0 <= t < float("inf"):
            raise ValueError(f"openclaw_proxy_rollout_temperature (ROLLOUT_TEMPERATURE): expected a number >= 0, got {t}")
        from .parsers import REASONING_PARSERS, TOOL_PARSERS  # parsers imports the chat formats, not config

        if p.tool_parser not in TOOL_PARSERS:
            raise ValueError(f"openclaw_proxy_tool_parser (TOOL_CALL_PARSER): unknown parser {p.tool_parser!r}; "
                             f"one of {', '.join(sorted(TOOL_PARSERS))}")
        if p.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"openclaw_proxy_reasoning_parser: unknown parser {p.reasoning_parser!r}; one of "
                             f"{', '.join(sorted(REASONING_PARSERS))}")
        if p.max_connections_per_client < 0:
            raise ValueError("openclaw_proxy_max_connections_per_client: expected 0 (no limit) or more, got "
                             f"{p.max_connections_per_client}")
        if not 0 <= p.reserved_connections < p.max_connections:
            raise ValueError(f"openclaw_proxy_reserved_connections: expected 0 (none) up to less than "
                             f"openclaw_proxy_max_connections ({p.max_connections}), got {p.reserved_connections}")
        if self.spool.sync not in ("full", "normal"):
            raise ValueError(f"openclaw_spool_sync must be 'full' or 'normal', not {self.spool.sync!r}")
        if p.pause_mode not in ("reject", "hold"):
            raise ValueError("openclaw_proxy_pause_mode must be 'reject' or 'hold'")
        if p.turn_classifier not in ("auto", "all_main", "tools_only"):
            raise ValueError("openclaw_proxy_turn_classifier must be auto, all_main or tools_only")
        if j.api not in ("sglang", "openai"):
            raise ValueError("openclaw_judge_api must be 'sglang' or 'openai'")
        if MODES[self.mode].needs_teacher and j.url and j.api != "sglang":
            raise ValueError(f"mode {self.mode} needs teacher log-probs: set openclaw_judge_api: sglang")
        if not is_loopback(p.host) and not p.api_keys and not p.allow_insecure_bind:
            raise ValueError(f"refusing to bind {p.host} without an API key: anyone who reaches the port "
                             "could inject training data. Set --api-key, or --allow-insecure-bind to opt out.")
        return self


    def _validate_teacher_source(self) -> None:
        o = self.opd
        o.teacher_source = teacher_source_name(o.teacher_source)
        if o.teacher_source != "trainer":
            if o.teacher_checkpoint:
                raise ValueError("openclaw_opd_teacher_checkpoint is the in-trainer teacher's checkpoint: set "
                                 "openclaw_opd_teacher_source: trainer too (or leave it empty)")
            return
        if MODES[self.mode].needs_teacher and self.mode not in TRAINER_TEACHER_MODES:
            raise ValueError(f"openclaw_opd_teacher_source: trainer is built for modes {', '.join(TRAINER_TEACHER_MODES)}, "
                             f"not {self.mode}")
        if o.teacher_url:
            raise ValueError("openclaw_opd_teacher_source: trainer computes the teacher log-probs in the trainer; "
                             "openclaw_opd_teacher_url (TEACHER_URL) names a teacher server: set one or the other")
        if o.hint_selection in ("sequence_optimal", "token_optimal"):
            raise ValueError(f"openclaw_opd_hint_selection: {o.hint_selection} scores every candidate hint with the "
                             "teacher in the proxy, which teacher_source: trainer does not call; use longest or "
                             "shortest (or teacher_source: server)")


def is_loopback(host: str) -> bool:
    """A loopback address (127.0.0.0/8 in any IPv4 spelling such as ``127.1``, ``::1``, ``::ffff:127.0.0.1``)
    or ``localhost``; a name that merely starts with ``127.`` (``127.example.com``) is a public host and
    needs an API key like any other."""
    name = host.strip("[]").lower()
    if name in ("localhost", "localhost."):
        return True
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        try:  # the C library's IPv4 forms (127.1, 0x7f.1): numeric parts only, so never a host name
            addr = ipaddress.IPv4Address(socket.inet_aton(name))
        except OSError:
            return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool(addr.is_loopback or (mapped is not None and mapped.is_loopback))


# upstream environment variables → flat keys (values are parsed by the field's type)
ENV_FALLBACKS = {
    "HOST": "proxy_host", "PORT": "proxy_port", "SGLANG_API_KEY": "proxy_api_keys",
    "SERVED_MODEL_NAME": "proxy_served_model_name", "PRM_M": "judge_votes",
    "OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY": "opd_teacher_concurrency", "OPENCLAW_EVAL_MODE": "opd_eval_mode",
    "OPENCLAW_COMBINE_W_RL": "combine_w_rl", "OPENCLAW_COMBINE_W_OPD": "combine_w_opd",
    "TOOL_CALL_PARSER": "proxy_tool_parser", "PRM_TEMPERATURE": "judge_temperature",
    "PRM_MAX_NEW_TOKENS": "judge_max_new_tokens",
    "PRM_API_KEY": "judge_api_key",  # bearer key of an external judge (scripts/run_*.sh PRM_URL=...)
    "OPENCLAW_STREAM_INTERVAL": "proxy_stream_interval", "OPENCLAW_STREAM_GATHER_MS": "proxy_stream_gather_ms",
    "OPENCLAW_TOPK_HINT_SELECTION": "opd_hint_selection", "OPENCLAW_TOPK_MAX_CAND": "opd_max_hint_candidates",
    "OPENCLAW_TOPK_SUBSET_MODE": "opd_distill_subset", "OPENCLAW_TOPK_ADV_DIFF_CLIP": "combine_topk_adv_diff_clip",
    "OPENCLAW_TOPK_K": "opd_distill_topk", "OPENCLAW_COMBINE_LOSS": "combine_loss",
    "TEACHER_URL": "opd_teacher_url", "TEACHER_MODEL_PATH": "opd_teacher_tokenizer",
    "TEACHER_API_KEY": "opd_teacher_api_key",  # bearer key of a separate teacher server
    "OPENCLAW_COMBINE_OPD_TEACHER_SOURCE": "opd_teacher_source",  # upstream PR #85 (its values are accepted)
    "PROXY_ADVERTISE_HOST": "proxy_advertise_host",  # where a proxy bound to 0.0.0.0 says it can be reached
}

# Slime flags (attributes of Slime's args) → flat keys, lowest precedence
SLIME_FALLBACKS = {
    "prm_m": "judge_votes", "prm_temperature": "judge_temperature", "prm_max_new_tokens": "judge_max_new_tokens",
    "prm_model_path": "judge_tokenizer", "distill_topk": "opd_distill_topk", "hf_checkpoint": "proxy_tokenizer",
    "rollout_temperature": "proxy_rollout_temperature", "rollout_max_response_len": "proxy_max_new_tokens_cap",
}


def flat_keys() -> set[str]:
    keys = {"mode"}
    for section, obj in Settings().sections().items():
        keys |= {f"{section}_{f.name}" for f in dataclasses.fields(obj)}
    return keys


# keys whose empty YAML value (``openclaw_proxy_api_keys:``) is refused instead of keeping the default:
# it is what a template with an unset variable renders, and the default would mean no authentication
NO_EMPTY_VALUE = frozenset({"proxy_api_keys"})


def _optional_type(settings: Settings, key: str) -> type | None:
    """The declared type inside ``X | None`` for the optional settings field ``key``, else None. A field
    whose default is None (``enable_thinking``) would otherwise take a raw string: "false" would then
    switch thinking on, being a non-empty string."""
    if key == "mode":
        return None
    section, _, name = key.partition("_")
    return declared_optional(type(getattr(settings, section)), name)


PATH_KEYS = frozenset({"proxy_tokenizer", "judge_tokenizer", "spool_dir", "proxy_record_dir"})
"""Settings that name a directory: a leading ``~`` expands (YAML, flags and Slime's args alike)."""


def _apply(settings: Settings, key: str, value: Any, source: str = "settings") -> None:
    if key == "mode":
        settings.mode = str(value)
        return
    section, _, name = key.partition("_")
    obj = getattr(settings, section)
    optional = _optional_type(settings, key)
    if key == "proxy_policy_url" and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        value = ",".join(value)  # several engines (engines.py)
    if key in PATH_KEYS and isinstance(value, str):
        value = os.path.expanduser(value)  # configs/*.yaml keep their spool under ~, outside the repository
    try:
        if optional is not None and is_null(value):
            setattr(obj, name, None)
        else:
            setattr(obj, name, coerce(value, optional() if optional is not None else getattr(obj, name), key))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: {PREFIX}{key}: {e}, got {value!r:.80}") from None


def load_settings(values: Mapping[str, Any] | None = None, *, env: Mapping[str, str] | None = None,
                  slime_args: Any = None, sources: Mapping[str, str] | None = None) -> Settings:
    """Build validated settings. ``values`` holds flat keys, with or without the ``openclaw_`` prefix;
    ``sources`` names where a raw key came from (a file, a flag) for error messages."""
    sources = sources or {}
    settings = Settings()
    known = flat_keys()
    if slime_args is not None:
        for attr, key in SLIME_FALLBACKS.items():
            v = getattr(slime_args, attr, None)
            if v is not None:
                _apply(settings, key, v, f"Slime flag --{attr.replace('_', '-')}")
        if getattr(slime_args, "sglang_router_ip", None) and getattr(slime_args, "sglang_router_port", None):
            settings.proxy.policy_url = f"http://{slime_args.sglang_router_ip}:{slime_args.sglang_router_port}"
        if getattr(slime_args, "prm_router_ip", None) and getattr(slime_args, "prm_router_port", None):
            settings.judge.url = f"http://{slime_args.prm_router_ip}:{slime_args.prm_router_port}"
    env = os.environ if env is None else env
    for var, key in ENV_FALLBACKS.items():
        if env.get(var, "") != "":
            _apply(settings, key, env[var], f"environment variable {var}")
    if env.get("OPENCLAW_RECORD_ENABLED") == "1" and env.get("OPENCLAW_RECORD_FILE"):
        settings.proxy.record_dir = str(Path(env["OPENCLAW_RECORD_FILE"]).parent or ".")
    merged: dict[str, Any] = {}
    if slime_args is not None:  # None there is a flag nobody set (argparse's default), never a choice
        merged.update({k: v for k, v in vars(slime_args).items() if k.startswith(PREFIX) and v is not None})
    merged.update(values or {})
    unknown = []
    for raw_key, value in merged.items():
        key = raw_key[len(PREFIX):] if raw_key.startswith(PREFIX) else raw_key
        if key not in known:
            unknown.append(raw_key)
            continue
        if value is None and key in NO_EMPTY_VALUE:
            raise ValueError(f"{sources.get(raw_key, 'settings')}: {PREFIX}{key}: empty value (an unset ${{KEY}} in "
                             "a templated file?); write [] for no keys, refusing to start without authentication")
        if value is None and _optional_type(settings, key) is None:
            continue  # an empty YAML value keeps the default; on an optional field, null unsets it
        _apply(settings, key, value, sources.get(raw_key, "settings"))
    if unknown:
        names = [PREFIX + k for k in sorted(known)]
        hints = [f"{k} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(
            PREFIX + k.removeprefix(PREFIX), names, n=1)) else k for k in sorted(unknown)]
        raise ValueError(f"unknown openclaw setting(s): {', '.join(hints)}; known keys: {', '.join(names)}")
    return settings.validate()


def load_yaml(path: str | Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"{path}: cannot read the config file: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{path}: malformed YAML{where}: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of openclaw_* keys, got a {type(data).__name__}")
    return data
