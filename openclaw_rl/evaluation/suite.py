"""The held-out task suite of ``openclaw-rl eval``: people, homework and file edits, read from JSON.

Stage: **evaluation** (after the trainer; nothing here is trained on). The suites are data files in
``openclaw_rl/evaluation/suites/`` so that a project can add its own without code. Held-out means two
things, both checked by ``check_held_out`` (and a test): no request of a suite is a request the
simulated users of ``local --simulate`` send (``openclaw_rl.embedded.task.REQUESTS``), and every
conversation goes to the proxy as a side turn (``X-Turn-Type: side``), which it forwards but never
turns into a training sample, so evaluating against a live training proxy trains nothing either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from openclaw_rl.embedded import task

SUITES_DIR = Path(__file__).with_name("suites")
DEFAULT_SUITE = "default"


@dataclass(frozen=True, slots=True)
class Person:
    """A simulated person with a hidden answer-style preference and their own requests."""

    name: str
    preference: str
    seed: int
    requests: tuple[str, ...]
    about: str = ""


@dataclass(frozen=True, slots=True)
class Homework:
    question: str
    answer: str


@dataclass(frozen=True, slots=True)
class FileEdit:
    """A request to edit a file through the ``edit_file`` tool; the call must name these exact strings."""

    path: str
    old: str
    new: str
    request: str


@dataclass(frozen=True, slots=True)
class Suite:
    name: str
    people: tuple[Person, ...]
    homework: tuple[Homework, ...]
    file_edits: tuple[FileEdit, ...]
    about: str = ""

    def requests(self) -> list[str]:
        """Every first message the suite sends."""
        return ([r for p in self.people for r in p.requests] + [h.question for h in self.homework]
                + [e.request for e in self.file_edits])


def load_suite(name_or_path: str = DEFAULT_SUITE) -> Suite:
    """A suite by name (a file in ``suites/``) or by path to a JSON file of the same shape."""
    path = Path(name_or_path)
    if not path.suffix:
        path = SUITES_DIR / f"{name_or_path}.json"
    if not path.is_file():
        known = sorted(p.stem for p in SUITES_DIR.glob("*.json"))
        raise FileNotFoundError(f"no evaluation suite {name_or_path!r} (a JSON file, or one of {known})")
    raw = json.loads(path.read_text(encoding="utf-8"))
    try:
        people = tuple(Person(p["name"], p["preference"], int(p["seed"]), tuple(p["requests"]), p.get("about", ""))
                       for p in raw.get("people", ()))
        homework = tuple(Homework(h["question"], str(h["answer"])) for h in raw.get("homework", ()))
        edits = tuple(FileEdit(e["path"], e["old"], e["new"], e["request"]) for e in raw.get("file_edits", ()))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: malformed suite entry ({type(exc).__name__}: {exc})") from None
    for person in people:
        if person.preference not in task.STYLES:
            raise ValueError(f"{path}: person {person.name!r} prefers unknown style {person.preference!r}; "
                             f"choose one of {list(task.STYLES)}")
        if not person.requests:
            raise ValueError(f"{path}: person {person.name!r} has no requests")
    suite = Suite(raw.get("name", path.stem), people, homework, edits, raw.get("about", ""))
    check_held_out(suite)
    return suite


def training_requests() -> frozenset[str]:
    """The first messages of the simulated users that train (``local --simulate``, ``simulate``)."""
    return frozenset(r.text.strip().lower() for r in task.REQUESTS)


def check_held_out(suite: Suite) -> None:
    """Refuse a suite that asks anything the training users ask: its score would measure memory."""
    seen = training_requests()
    overlap = sorted({r for r in suite.requests() if r.strip().lower() in seen})
    if overlap:
        raise ValueError(f"suite {suite.name!r} is not held out: {len(overlap)} of its requests are training "
                         f"requests, e.g. {overlap[0]!r}")
