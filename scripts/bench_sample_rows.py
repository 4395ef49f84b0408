"""The spool writer's cost of ``TrainingSample.to_row`` for each sample kind, in-process: rl, OPD token-level
(teacher log-probs), OPD top-K (``--topk``), OPD with ``teacher_source trainer`` (the hinted prompt's ids) and
combine's rl-only branch, built as the scorers build them (``distillation_sample``, ``trainer_signal`` with a
stub renderer whose ids are the turn's plus ``--hint`` ids) from turns of ``--history`` prompt ids and
``--reply`` sampled tokens. Prints the best of ``--repeat`` µs per ``to_row`` call (and per ``from_turn``) for
each kind. To compare two versions, run a copy of it in the other tree (it imports the tree it sits in).
A benchmark: nothing is asserted.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import timeit
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openclaw_combine.scorer import CombineScorer  # noqa: E402
from openclaw_opd.scorer import HintedJudgement, distillation_sample  # noqa: E402
from openclaw_opd.teacher import TeacherSignal, trainer_signal  # noqa: E402
from openclaw_rl.samples import TrainingSample  # noqa: E402
from openclaw_rl.turns import Generation, Turn  # noqa: E402


class StubRenderer:
    """Stands for ``ChatRenderer``: the turn's prompt ids with ``hint`` ids before the generation prompt, as a list
    and, as ``ChatRenderer.render_ids`` makes it whether asked or not, an ``array("i")``."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def render(self, messages: Any, tools: Any = None, with_array: bool = False, **_: Any) -> Any:
        ids = list(self.ids)
        ids_array = array("i", ids)
        return ("", ids, ids_array) if with_array else ("", ids)


def builders(ns: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(0)
    prompt = [rng.randrange(ns.vocab) for _ in range(ns.history)]
    turn = Turn(session_key="default\x1fs", session_id="s", index=1, messages=[{"role": "user", "content": "x"}],
                tools=None, sampling_temperature=1.0, prompt_ids=array("i", prompt), epoch="e")
    r = ns.reply
    turn.generation = Generation(array("i", [rng.randrange(ns.vocab) for _ in range(r)]),
                                 array("d", [-rng.random() * 4 for _ in range(r)]), "x" * (4 * r), "stop", "v")
    teacher = [-rng.random() * 4 for _ in range(r)]
    k = ns.topk
    topk_lp = [sorted((-rng.random() * 8 for _ in range(k)), reverse=True) for _ in range(r)]
    topk_ids = [[rng.randrange(ns.vocab) for _ in range(k)] for _ in range(r)]
    renderer = StubRenderer(prompt[:-3] + [rng.randrange(ns.vocab) for _ in range(ns.hint)] + prompt[-3:])

    def judged(signal: TeacherSignal) -> HintedJudgement:
        return HintedJudgement(None, None, hint="h", teacher=signal)

    combine = CombineScorer.__new__(CombineScorer)
    combine.opd = SimpleNamespace(distill_topk=k)
    return {
        "rl": lambda: TrainingSample.from_turn(turn, kind="rl", reward=1.0, metadata={"judge_votes": [1, 1, 1]}),
        "opd token": lambda: distillation_sample(turn, judged(TeacherSignal(list(teacher), [1] * r)), "opd", 1.0),
        f"opd top-{k}": lambda: distillation_sample(turn, judged(TeacherSignal(
            list(teacher), [1] * r, [list(x) for x in topk_lp], [list(x) for x in topk_ids])), "opd", 1.0),
        "opd trainer": lambda: distillation_sample(turn, judged(trainer_signal(turn, "h", renderer)), "opd", 1.0),
        f"combine rl top-{k}": lambda: combine._rl_only(turn, 1.0),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--history", type=int, default=8150, help="prompt ids of the turn")
    p.add_argument("--hint", type=int, default=80, help="ids the hint adds to the teacher's prompt")
    p.add_argument("--reply", type=int, default=64)
    p.add_argument("--topk", type=int, default=4)
    p.add_argument("--vocab", type=int, default=151643)
    p.add_argument("--number", type=int, default=200)
    p.add_argument("--repeat", type=int, default=7)
    ns = p.parse_args()
    import openclaw_rl

    print(f"tree {Path(openclaw_rl.__file__).resolve().parents[1]}, load {os.getloadavg()[0]:.2f}")
    for name, build in builders(ns).items():
        samples = [build() for _ in range(ns.number)]
        row = min(timeit.repeat(lambda nxt=iter(samples * ns.repeat).__next__: nxt().to_row(), number=ns.number,
                                repeat=ns.repeat)) / ns.number
        made = min(timeit.repeat(build, number=ns.number, repeat=ns.repeat)) / ns.number
        assert not math.isnan(row)
        print(f"{name:18s} to_row {row * 1e6:7.1f} µs   build {made * 1e6:7.1f} µs")
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
