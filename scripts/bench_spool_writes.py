"""The spool writer's own CPU per turn, in-process (issue #33 item 2): the spool calls the writer thread makes for
two-turn sessions, one transaction per session as ``Spool.batch`` runs them, timed with ``time.thread_time``.

Per session: turn 1's waiting row (``save_turn``), its next state (``save_next_state``), turn 2's waiting row,
then turn 1's sample with its settle (``put``) and turn 2's drop (``put`` with no samples): the writes of
``scripts/bench_turn_cpu.py``'s sessions without the proxy around them. Samples are built by
``TrainingSample.from_turn`` from turns of ``--history`` prompt ids drawn below ``--vocab`` (4,102: the bench's
tiny tokenizer; 151,643: Qwen's) and ``--reply`` sampled tokens. Prints µs of CPU per turn for ``--runs`` runs
and the bytes each sample row holds. To compare two versions, run a copy of it in the other tree (it imports
the tree it sits in).
A benchmark: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openclaw_rl import codec  # noqa: E402
from openclaw_rl.samples import TrainingSample  # noqa: E402
from openclaw_rl.spool import Spool  # noqa: E402
from openclaw_rl.turns import Generation, Turn  # noqa: E402


def turn(rng: random.Random, key: str, index: int, history: int, vocab: int, reply: int) -> Turn:
    t = Turn(session_key=key, session_id=key, index=index, messages=None, tools=None, sampling_temperature=1.0,
             prompt_ids=array("i", [rng.randrange(vocab) for _ in range(history + 80 * index)]), epoch="e")
    t.generation = Generation(array("i", [rng.randrange(vocab) for _ in range(reply)]),
                              array("d", [-rng.random() * 4 for _ in range(reply)]), "x" * (4 * reply), "stop", "v")
    return t


def run(ns: argparse.Namespace, seed: int) -> tuple[float, int]:
    rng = random.Random(seed)
    sessions = []
    for s in range(ns.sessions):
        key = f"default\x1fs{seed}-{s}"
        t1, t2 = turn(rng, key, 1, ns.history, ns.vocab, ns.reply), turn(rng, key, 2, ns.history, ns.vocab, ns.reply)
        sample = TrainingSample.from_turn(t1, kind="rl", reward=1.0, metadata={"judge_votes": [1, 1, 1]})
        sessions.append((key, t1, t2, sample))
    with tempfile.TemporaryDirectory(prefix="bench-spool-writes-") as tmp:
        spool = Spool(tmp, sync=ns.sync)
        start = time.thread_time()
        for key, t1, t2, sample in sessions:
            with spool.batch():
                spool.save_turn((key, "e", 1), codec.dumps_str(t1.to_record(arrays=False)), t1.array_bytes())
                spool.save_next_state((key, "e", 1), '{"role":"user","content":"ok"}')
                spool.save_turn((key, "e", 2), codec.dumps_str(t2.to_record(arrays=False)), t2.array_bytes())
                spool.put([sample], settled=(key, "e", 1))
                spool.put([], settled=(key, "e", 2))
        cpu = time.thread_time() - start
        row = spool.live_bytes() // ns.sessions
        spool.close()
    return cpu / (2 * ns.sessions) * 1e6, row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=300)
    p.add_argument("--history", type=int, default=8150, help="prompt ids of a session's first turn")
    p.add_argument("--vocab", type=int, default=4102)
    p.add_argument("--reply", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--sync", default="full", choices=("full", "normal"))
    ns = p.parse_args()
    import openclaw_rl

    print(f"tree {Path(openclaw_rl.__file__).resolve().parents[1]}, load {os.getloadavg()[0]:.2f}")
    for i in range(ns.runs):
        us, row = run(ns, i)
        print(f"run {i}: {us:.0f} µs of CPU a turn, {row} bytes a sample as the cap counts it, "
              f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
