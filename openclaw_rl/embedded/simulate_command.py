"""``openclaw-rl simulate``: drive a running proxy with the simulated users of ``simulate.py``.

Stage: **simulated user** (command line) → proxy. Separate from ``simulate.py`` because its job is the
person at the terminal: it takes the proxy URL in the form ``local`` and ``serve`` print it (with
``/v1``) or without, checks the proxy answers before any user starts, and turns a wrong URL, a stopped
proxy or a refused key into one line (a ``CommandError``), not an OpenAI-client traceback.
"""

from __future__ import annotations

import asyncio
from typing import Any

from openclaw_rl.embedded import task
from openclaw_rl.embedded.simulate import (
    SCENARIOS,
    ProblemOutcome,
    SimulationResult,
    proxy_base_url,
    run_llm_simulation,
    run_simulation,
)
from openclaw_rl.errors import CommandError

START_HINT = "start `openclaw-rl local` or `serve` first, and pass the URL it printed, e.g. http://127.0.0.1:30000/v1"


async def check_proxy(base_url: str, api_key: str, timeout_s: float = 10.0) -> None:
    """One ``GET /v1/models`` before any simulated user starts: a wrong URL, a stopped proxy or a refused
    key becomes a ``CommandError`` naming what to change (the users' own retries would wait out a
    connection error for ten minutes, as they do a weight sync)."""
    import httpx

    url = f"{base_url}/v1/models"
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as http:
            resp = await http.get(url, headers={"Authorization": f"Bearer {api_key}"})
    except httpx.HTTPError as exc:
        why = f"{type(exc).__name__}{f': {exc}' if str(exc) else ''}"
        raise CommandError(f"cannot reach the proxy at {base_url} ({why}); {START_HINT}") from None
    if resp.status_code in (401, 403):
        raise CommandError(f"the proxy at {base_url} refused the API key (HTTP {resp.status_code}): pass its key "
                           "with --api-key")
    if resp.status_code != 200:
        raise CommandError(f"GET {url} answered HTTP {resp.status_code}, so {base_url} is not the proxy's base "
                           f"URL; {START_HINT}")


def api_error_line(exc: BaseException) -> str:
    """An OpenAI-client error as one line: the URL and status with the server's message, or what failed."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        error = exc.body.get("error", exc.body) if isinstance(exc.body, dict) else None  # the client may unwrap it
        message = error.get("message") if isinstance(error, dict) else None
        return f"{exc.request.method} {exc.request.url} answered HTTP {exc.status_code}: {message or exc.message}"
    if isinstance(exc, openai.APIConnectionError):
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        return f"{exc.request.method} {exc.request.url}: {exc.message}{cause}"
    return f"{type(exc).__name__}: {exc}"


def register_simulate_command(subparsers: Any) -> None:
    """Add ``openclaw-rl simulate`` (scripted user by default, LLM user with ``--llm-user-url``)."""
    p = subparsers.add_parser("simulate", help="drive a running proxy with a simulated user and plot the learning curve")
    p.add_argument("--proxy-url", required=True,
                   help="the proxy's URL as `local`/`serve` print it (http://127.0.0.1:30000/v1), /v1 optional")
    p.add_argument("--api-key", default="x", help="the proxy's bearer key")
    p.add_argument("--interactions", type=int, default=200, help="policy calls in total (scripted user)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--preferred-style", default=task.DEFAULT_STYLE, choices=list(task.STYLES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--turns-per-session", type=int, default=4)
    p.add_argument("--window", type=int, default=20, help="moving-average window of the learning curve")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--plot", help="write the learning curve PNG here")
    p.add_argument("--llm-user-url", help="OpenAI-compatible endpoint that plays the user (enables the LLM user)")
    p.add_argument("--llm-user-model", default="default")
    p.add_argument("--llm-user-api-key", default="x")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="student")
    p.add_argument("--problems", type=int, default=5, help="LLM user: problems (sessions) to run")
    p.add_argument("--max-turns", type=int, default=8, help="LLM user: policy replies per problem")
    p.set_defaults(fn=cmd_simulate)


def cmd_simulate(ns: Any) -> int:
    import openai

    ns.proxy_url = proxy_base_url(ns.proxy_url)  # a ValueError: one line, exit code 2
    try:
        return asyncio.run(_command(ns))
    except openai.APIError as exc:  # the proxy (or the LLM user's endpoint) failed mid-run
        raise CommandError(api_error_line(exc)) from None


async def _command(ns: Any) -> int:
    await check_proxy(ns.proxy_url, ns.api_key)
    if ns.llm_user_url:
        return await _llm_command(ns)
    every = max(1, ns.interactions // 20)

    def progress(result: SimulationResult) -> None:
        done = len(result.interactions)
        if done % every == 0 or done == ns.interactions:
            curve = result.rate_curve()
            print(f"[{done}/{ns.interactions}] moving '{ns.preferred_style}' rate "
                  f"{curve[-1] if curve else 0.0:.0%} over {len(result.matches)} uninstructed replies", flush=True)

    result = await run_simulation(ns.proxy_url, interactions=ns.interactions, concurrency=ns.concurrency,
                                  preferred_style=ns.preferred_style, seed=ns.seed, api_key=ns.api_key,
                                  on_interaction=progress, turns_per_session=ns.turns_per_session,
                                  max_tokens=ns.max_tokens, window=ns.window)
    print(result.summary())
    if ns.plot:
        result.save_plot(ns.plot)
        print(f"learning curve written to {ns.plot}")
    return 0


async def _llm_command(ns: Any) -> int:
    from openai import AsyncOpenAI

    def progress(outcome: ProblemOutcome) -> None:
        status = "done" if outcome.completed else "not done"
        print(f"problem {outcome.index}: {status} after {outcome.turns} turns", flush=True)

    user_client = AsyncOpenAI(base_url=ns.llm_user_url, api_key=ns.llm_user_api_key, max_retries=2)
    try:
        outcomes = await run_llm_simulation(ns.proxy_url, user_client, ns.llm_user_model, scenario=ns.scenario,
                                            num_problems=ns.problems, max_turns=ns.max_turns,
                                            concurrency=ns.concurrency, api_key=ns.api_key, on_problem=progress)
    finally:
        await user_client.close()
    done = sum(o.completed for o in outcomes)
    print(f"{done}/{len(outcomes)} completed within the turn limit")
    return 0
