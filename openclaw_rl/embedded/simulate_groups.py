"""Many simulated people on one deployment: groups of users with opposite hidden preferences.

Stage: **simulated users** → proxy → policy, as ``simulate.py``, but each session belongs to one of several
users, named by a trusted key's ``X-User-Id`` header (``users/identity.py``), and each user belongs to a
group with its own hidden preferred style (``formal:2,casual:2``: two users who want formal replies, two
who want casual ones). Sessions go to the users in turn, so the groups' traffic is interleaved on one run.
A shared model can at best please one group at a time; per-user adapters can please both
(``docs/users.md`` has the measured curves).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from openclaw_rl.embedded import task
from openclaw_rl.embedded.simulate import (
    Interaction,
    ScriptedUser,
    SimulationResult,
    _rate,
    chat_with_retry,
    moving_average,
    proxy_base_url,
    run_sessions,
)


def parse_groups(spec: str) -> list[tuple[str, int]]:
    """``"formal:2,casual:2"`` → [("formal", 2), ("casual", 2)] (a bare style means one user)."""
    groups = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        style, _, count = part.partition(":")
        if style not in task.STYLES:
            raise ValueError(f"--user-groups: unknown style {style!r}; choose from {list(task.STYLES)}")
        try:
            n = int(count or 1)
        except ValueError:
            raise ValueError(f"--user-groups: {part!r}: expected style:count") from None
        if n < 1:
            raise ValueError(f"--user-groups: {part!r}: a group needs at least one user")
        groups.append((style, n))
    if not groups:
        raise ValueError("--user-groups: no group given (e.g. formal:2,casual:2)")
    return groups


def group_users(groups: list[tuple[str, int]]) -> list[tuple[str, str]]:
    """(user id, preferred style) of every simulated user, group by group."""
    return [(f"{style}-{j}", style) for style, n in groups for j in range(n)]


@dataclass
class GroupSimulation:
    """Per group, a ``SimulationResult``; also the whole run's, for the step lines and the report."""

    groups: dict[str, SimulationResult]
    window: int = 20
    interactions: list[Interaction] = field(default_factory=list)
    users: dict[str, str] = field(default_factory=dict)  # user id -> preferred style
    seconds: float = 0.0

    @property
    def matches(self) -> list[bool]:
        return [i.matched for i in self.interactions if not i.instructed]

    def rate_curve(self, window: int | None = None) -> list[float]:
        return moving_average(self.matches, window or self.window)

    @property
    def first_window_rate(self) -> float:
        return _rate(self.matches[:self.window])

    @property
    def last_window_rate(self) -> float:
        return _rate(self.matches[-self.window:])

    def opening_rates(self) -> tuple[float, float]:
        opening = [i.matched for i in self.interactions if i.turn == 0]
        return _rate(opening[:self.window]), _rate(opening[-self.window:])

    def group_rates(self) -> dict[str, tuple[float, float]]:
        """Each group's preferred rate over its first and its last window of uninstructed replies."""
        return {style: (r.first_window_rate, r.last_window_rate) for style, r in self.groups.items()}

    def save_plot(self, path: str, title: str | None = None) -> None:
        plot_group_curves({"": self}, path, title=title)


def plot_group_curves(runs: dict[str, GroupSimulation], path: str, *, title: str | None = None) -> None:
    """Every run's every group's moving preferred rate, in one figure (x: the group's uninstructed replies)."""
    plot_group_panels({title or "each group's preferred-style rate (moving window)": runs}, path)


def plot_group_panels(panels: dict[str, dict[str, GroupSimulation]], path: str, *, title: str | None = None) -> None:
    """One panel per entry (e.g. per seed), each with every run's every group's moving preferred rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(len(panels), 2)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(8 * cols, 4.5 * rows), dpi=100, squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, (panel, runs) in zip(axes.flat, panels.items()):
        for i, (label, run) in enumerate(runs.items()):
            for style, result in run.groups.items():
                curve = result.rate_curve()
                name = f"{label}: {style} group" if label else f"{style} group"
                ax.plot(range(1, len(curve) + 1), curve, linestyle=styles[i % len(styles)], label=name)
        ax.axhline(0.9, color="green", linestyle=":", label="90%")
        ax.set(xlabel="the group's uninstructed replies", ylabel="replies in the group's preferred style",
               ylim=(0, 1.02), title=panel)
        ax.legend(loc="lower right", fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


async def run_group_simulation(base_url: str, *, groups: list[tuple[str, int]], interactions: int, concurrency: int,
                               seed: int = 0, api_key: str = "local", user_header: str = "X-User-Id",
                               on_interaction: Callable[[Any], None] | None = None, turns_per_session: int = 4,
                               model: str = "default", max_tokens: int = 64, window: int = 20,
                               timeout_s: float = 120.0) -> GroupSimulation:
    """Drive the proxy with the users of `groups`, their sessions interleaved (session k: user k mod N)."""
    from openai import AsyncOpenAI

    users = group_users(groups)
    sim = GroupSimulation({style: SimulationResult(style, window=window) for style, _ in groups}, window=window,
                          users=dict(users))
    started = time.monotonic()
    client = AsyncOpenAI(base_url=f"{proxy_base_url(base_url)}/v1", api_key=api_key, max_retries=0, timeout=timeout_s)

    async def session(index: int, turns: int) -> None:
        user_id, style = users[index % len(users)]
        sid = f"sim-{seed}-{index}"
        user = ScriptedUser(style, seed * 1_000_003 + index)
        result = sim.groups[style]
        messages: list[dict[str, str]] = [{"role": "user", "content": user.open()}]
        for turn in range(turns):
            headers = {"X-Session-Id": sid, user_header: user_id,
                       **({"X-Session-Done": "true"} if turn == turns - 1 else {})}
            completion = await chat_with_retry(client, model=model, messages=messages, max_tokens=max_tokens,
                                               extra_headers=headers)
            reply = completion.choices[0].message.content or ""
            next_message = result.judge_reply(user, sid, turn, reply)
            sim.interactions.append(result.interactions[-1])
            if on_interaction is not None:
                on_interaction(sim)
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": next_message}]

    try:
        await run_sessions(session, interactions, turns_per_session, concurrency)
    finally:
        await client.close()
    sim.seconds = time.monotonic() - started
    return sim
