"""``openclaw-rl eval``: score checkpoints on the held-out suite, before vs after training.

Stage: **evaluation** (command line). Targets are evaluated one after another, the first being the
baseline (``--target untrained`` first, then the trained checkpoints); the report goes to ``--out``.

    openclaw-rl eval --target untrained --target rl=runs/local-rl --out runs/eval
    openclaw-rl eval --target after=http://127.0.0.1:30000/v1 --api-key KEY   # a served model, via its proxy
    openclaw-rl eval --through-openclaw --target untrained --conversations 2   # people talk to stock OpenClaw
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from openclaw_rl.errors import CommandError

from .report import EvalReport, TargetResult
from .runner import EvalOptions, evaluate_target, parse_target
from .suite import DEFAULT_SUITE, load_suite


def register_eval_command(subparsers: Any) -> None:
    p = subparsers.add_parser("eval", help="score checkpoints on a held-out suite of simulated people, homework "
                                           "and file edits (table + plot)", description=__doc__)
    p.add_argument("--target", action="append", default=[], metavar="[LABEL=]WHERE",
                   help="a checkpoint directory, a run or checkpoints directory (its newest step-*), `untrained` "
                        "(the tiny model), or a proxy URL; repeat it; the first is the baseline")
    p.add_argument("--suite", default=DEFAULT_SUITE, help="a suite name (openclaw_rl/evaluation/suites) or JSON path")
    p.add_argument("--out", default="runs/eval", help="report.json, report.md, report.png, transcripts.jsonl")
    p.add_argument("--conversations", type=int, default=EvalOptions.conversations,
                   help="conversations per person, and homework / file-edit requests each")
    p.add_argument("--turns", type=int, default=EvalOptions.turns, help="replies per conversation with a person")
    p.add_argument("--concurrency", type=int, default=EvalOptions.concurrency)
    p.add_argument("--max-tokens", type=int, default=EvalOptions.max_tokens)
    p.add_argument("--temperature", type=float, default=EvalOptions.temperature)
    p.add_argument("--api-key", default="x", help="the bearer key of a URL target's proxy")
    p.add_argument("--preset", default="h128", help="`untrained`: the tiny model's preset")
    p.add_argument("--seed", type=int, default=0, help="`untrained`: the tiny model's seed; the engine's sampling seed")
    p.add_argument("--user-url", default="", help="model-played people: an OpenAI-compatible endpoint writes "
                                                   "their messages after the first (default: scripted people)")
    p.add_argument("--user-model", default="default")
    p.add_argument("--user-api-key", default="x")
    p.add_argument("--judge-url", default="", help="style verdicts by a majority of votes of this OpenAI-compatible "
                                                    "model instead of the opener rule")
    p.add_argument("--judge-model", default="default")
    p.add_argument("--judge-api-key", default="x")
    p.add_argument("--judge-votes", type=int, default=3)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--through-openclaw", action="store_true",
                   help="each person turn and homework question is an `openclaw agent` turn of stock OpenClaw "
                        "(Node >= 24) whose provider is the target's proxy (as a side turn: never trained); file "
                        "edits are skipped; `untrained` is then the tiny model's OpenClaw variant")
    p.add_argument("--openclaw-bin", default="", help="--through-openclaw: the `openclaw` executable (default: "
                                                       "on PATH, else .openclaw-demo/ of scripts/openclaw_chat_demo.sh)")
    p.set_defaults(fn=cmd_eval)


class _Progress:
    """A line at every tenth of a target's replies: a CPU checkpoint on a busy machine takes minutes."""

    def __init__(self, label: str, expected: int):
        self.label, self.expected, self.done = label, expected, 0
        self.every = max(1, expected // 10)

    def __call__(self, _outcome: Any) -> None:
        self.done += 1
        if self.done % self.every == 0 and self.done < self.expected:
            print(f"  {self.label}: {self.done}/{self.expected} replies", flush=True)


def cmd_eval(ns: Any) -> int:
    import openai

    from openclaw_rl.embedded.simulate_command import api_error_line

    if not ns.target:
        raise CommandError("give at least one --target (e.g. --target untrained --target rl=runs/local-rl)")
    if ns.conversations < 1 or ns.turns < 1:
        raise ValueError("--conversations and --turns must be at least 1")
    suite = load_suite(ns.suite)
    install = None
    if ns.through_openclaw:
        from dataclasses import replace

        from .through_openclaw import MIN_NODE_MAJOR, find_openclaw

        install = find_openclaw(ns.openclaw_bin)
        if install is None:
            raise CommandError(f"--through-openclaw needs `openclaw` and Node >= {MIN_NODE_MAJOR} (--openclaw-bin, PATH, "
                               "or `bash scripts/openclaw_chat_demo.sh`, which installs both into .openclaw-demo/)")
        if suite.file_edits:
            print(f"--through-openclaw: the suite's {len(suite.file_edits)} file edits are skipped (they score the "
                  "suite's own edit_file tool; OpenClaw offers its own tools)", flush=True)
            suite = replace(suite, file_edits=())
    targets = [parse_target(spec, preset=ns.preset, seed=ns.seed, openclaw_model=ns.through_openclaw)
               for spec in ns.target]
    labels = [t.label for t in targets]
    if len(set(labels)) != len(labels):
        raise ValueError(f"two targets share a label ({labels}); name them LABEL=WHERE")
    clients: list[Any] = []
    opts = EvalOptions(conversations=ns.conversations, turns=ns.turns, concurrency=ns.concurrency,
                       max_tokens=ns.max_tokens, temperature=ns.temperature)
    if ns.user_url:
        opts.user_client, opts.user_model = openai.AsyncOpenAI(base_url=ns.user_url, api_key=ns.user_api_key), ns.user_model
        clients.append(opts.user_client)
    if ns.judge_url:
        from .people import VoteJudge

        judge_client = openai.AsyncOpenAI(base_url=ns.judge_url, api_key=ns.judge_api_key)
        clients.append(judge_client)
        opts.judge = VoteJudge(judge_client, ns.judge_model, ns.judge_votes)
    report = EvalReport(suite.name, [], settings={
        "conversations": ns.conversations, "turns": ns.turns, "max_tokens": ns.max_tokens,
        "temperature": ns.temperature, "people": "model-played" if ns.user_url else "scripted",
        "style_scoring": f"majority of {ns.judge_votes} judge votes" if ns.judge_url else "opener rule",
        **({"client": f"stock OpenClaw ({install.openclaw})"} if install else {})})
    expected = ns.conversations * (len(suite.people) * ns.turns + bool(suite.homework) + bool(suite.file_edits))
    for target in targets:
        print(f"evaluating {target.label} ({target.location}): {expected} replies ...", flush=True)
        started = time.monotonic()
        progress = _Progress(target.label, expected)
        try:
            outcomes = evaluate_target(target, suite, opts, api_key=ns.api_key, seed=ns.seed, on_outcome=progress,
                                       openclaw=install)
        except openai.APIError as exc:
            raise CommandError(f"{target.label}: {api_error_line(exc)}") from None
        result = TargetResult(target.label, target.location, outcomes, time.monotonic() - started)
        report.targets.append(result)
        print(f"  {len(outcomes)} scored replies in {result.seconds:.0f}s", flush=True)
        paths = report.write(Path(ns.out), plot=False)  # what is done so far survives an interrupted run
    paths = report.write(Path(ns.out), plot=not ns.no_plot)
    print(report.markdown())
    print("written: " + ", ".join(paths.values()))
    return 0
