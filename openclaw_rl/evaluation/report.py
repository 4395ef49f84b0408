"""The report of ``openclaw-rl eval``: scores per task and target, as JSON, a markdown table and a plot.

Stage: evaluation → **report**. One row per task of the suite (each style preference apart, the
replies after a correction apart, homework, file edits), one column per target; every cell is the pass
rate with its 95% Wilson interval and n, and each target after the first carries its verdict against
the first (the baseline: put the untrained checkpoint first).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .people import Outcome, style_row
from .stats import Score, verdict, wilson

ROW_ORDER = ("first", "later", "instructed", "homework", "file_edit")


def row_title(key: str, subjects: list[str]) -> str:
    kind, _, pref = key.partition(":")
    who = ", ".join(sorted(subjects))
    if kind == "first":
        return f"'{pref}' preference, first reply ({who})"
    if kind == "later":
        return f"'{pref}' preference, later uninstructed replies ({who})"
    if kind == "instructed":
        return f"'{pref}' after a correction: instruction-following ({who})"
    if kind == "homework":
        return "arithmetic homework, ground truth"
    if kind == "file_edit":
        return "file edit through the edit_file tool"
    return key


def short_title(key: str) -> str:
    """The plot's tick label for a row."""
    kind, _, pref = key.partition(":")
    return {"first": f"'{pref}'\nfirst reply", "later": f"'{pref}'\nlater replies", "instructed": f"'{pref}' after\na correction",
            "homework": "arithmetic\nhomework", "file_edit": "file edit\n(tool call)"}.get(kind, key)


@dataclass
class TargetResult:
    label: str
    location: str
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    def scores(self) -> dict[str, Score]:
        by: dict[str, list[bool]] = {}
        for o in self.outcomes:
            by.setdefault(o.task, []).append(o.passed)
        return {k: wilson(sum(v), len(v)) for k, v in by.items()}


@dataclass
class EvalReport:
    suite: str
    targets: list[TargetResult]
    settings: dict[str, Any] = field(default_factory=dict)

    def rows(self) -> list[str]:
        keys = {o.task for t in self.targets for o in t.outcomes}
        def order(k: str) -> tuple[int, int, str]:
            kind, _, pref = k.partition(":")
            return (pref != "formal", ROW_ORDER.index(kind) if kind in ROW_ORDER else len(ROW_ORDER), k)

        return sorted(keys, key=order)

    def subjects(self, key: str) -> list[str]:
        return sorted({o.subject for t in self.targets for o in t.outcomes if o.task == key})

    def verdicts(self) -> dict[str, dict[str, str]]:
        """Per target after the first, per row: better / worse / no clear change against the first."""
        if not self.targets:
            return {}
        base = self.targets[0].scores()
        out: dict[str, dict[str, str]] = {}
        for t in self.targets[1:]:
            scores = t.scores()
            out[t.label] = {k: verdict(base[k], scores[k]) for k in self.rows() if k in base and k in scores}
        return out

    def as_json(self) -> dict[str, Any]:
        verdicts = self.verdicts()
        return {
            "suite": self.suite, "settings": self.settings,
            "targets": [{"label": t.label, "location": t.location, "seconds": round(t.seconds, 1),
                         "scores": {k: {"passed": s.passed, "total": s.total, "rate": s.rate, "ci95": [s.low, s.high]}
                                    for k, s in t.scores().items()},
                         "verdict_vs_baseline": verdicts.get(t.label, {})} for t in self.targets],
        }

    def markdown(self) -> str:
        verdicts = self.verdicts()
        head = "| task | " + " | ".join(f"`{t.label}`" for t in self.targets) + " |"
        lines = [head, "|---|" + "---|" * len(self.targets)]
        for key in self.rows():
            cells = []
            for i, t in enumerate(self.targets):
                score = t.scores().get(key)
                cell = score.text() if score else "n/a"
                mark = verdicts.get(t.label, {}).get(key) if i else None
                if mark in ("better", "worse"):
                    cell += f" **{mark}**"
                cells.append(cell)
            lines.append(f"| {row_title(key, self.subjects(key))} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def write(self, out: Path, plot: bool = True) -> dict[str, str]:
        """report.json, report.md, transcripts.jsonl and (with matplotlib) report.png under `out`."""
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "report.json", "markdown": out / "report.md", "transcripts": out / "transcripts.jsonl"}
        paths["json"].write_text(json.dumps(self.as_json(), indent=2) + "\n")
        paths["markdown"].write_text(f"# Evaluation on suite `{self.suite}`\n\nEach cell: pass rate [95% Wilson "
                                     f"interval] (n); **better**/**worse**: its interval and the first column's "
                                     f"do not overlap.\n\n{self.markdown()}")
        with paths["transcripts"].open("w") as f:
            for t in self.targets:
                for o in t.outcomes:
                    f.write(json.dumps({"target": t.label, **o.as_json()}) + "\n")
        if plot:
            try:
                self.save_plot(out / "report.png")
                paths["plot"] = out / "report.png"
            except ImportError:
                pass
        return {k: str(v) for k, v in paths.items()}

    @classmethod
    def from_transcripts(cls, path: Path, suite: str = "") -> EvalReport:
        """A report again from a run's ``transcripts.jsonl`` (the rows of a person's replies recomputed
        from their turn, so transcripts written before the first/later split read the same way)."""
        targets: dict[str, TargetResult] = {}
        for line in path.read_text().splitlines():
            raw = json.loads(line)
            label = raw.pop("target")
            kind, _, pref = raw["task"].partition(":")
            if kind in ("style", "first", "later"):
                raw["task"] = style_row(pref, raw["turn"], False)
            targets.setdefault(label, TargetResult(label, "")).outcomes.append(Outcome(**raw))
        return cls(suite, list(targets.values()))

    def save_plot(self, path: Path) -> None:
        """Grouped bars: one group per task, one bar per target, the 95% interval as error bars."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.rows()
        width = 0.8 / max(1, len(self.targets))
        fig, ax = plt.subplots(figsize=(min(13.0, max(7.0, 0.25 * len(rows) * len(self.targets) + 3)), 4.5), dpi=100)
        for i, t in enumerate(self.targets):
            scores = t.scores()
            xs = [r + (i - (len(self.targets) - 1) / 2) * width for r in range(len(rows))]
            rates = [scores[k].rate if k in scores else 0.0 for k in rows]
            err = [[max(0.0, scores[k].rate - scores[k].low) if k in scores else 0.0 for k in rows],
                   [max(0.0, scores[k].high - scores[k].rate) if k in scores else 0.0 for k in rows]]
            ax.bar(xs, rates, width, yerr=err, capsize=3, label=t.label)
        ax.set_xticks(range(len(rows)), [short_title(k) for k in rows], fontsize=8)
        ax.set(ylabel="pass rate (95% Wilson interval)", ylim=(0, 1.05), title=f"openclaw-rl eval, suite '{self.suite}'")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
