"""Does the policy learn from OpenClaw conversations? Replay OpenClaw's recorded request shape through
``openclaw-rl local``'s stack (proxy, embedded engine, rule judge, trainer) with a scripted user who
corrects the answer style, and report the preferred-style rate before and after.

    python scripts/openclaw_replay_learning.py --interactions 48 --batch-size 4 --max-steps 8

Two figures, both on OpenClaw-shaped requests (tests/data/openclaw-golden's system prompt, tools,
Runtime line, timestamps and internal-context block):
* replies: the scripted user's uninstructed requests answered in the preferred style, first window vs
  last window (sampled, so noisy with few interactions; a later reply of a session may follow a
  correction still in its history);
* openings: the first reply of each session (no correction before it), first vs last window of sessions;
* exact: the probability that the reply opens in the preferred style, averaged over `--probes` fresh
  OpenClaw-shaped first requests, for the served model before and for the trained checkpoint after.
* held-out: `--heldout-n` sampled replies to each of conversation_A's four recorded requests (the
  person's real words, never replayed), before and after: the share in the preferred style and the
  share in any style (replies that drift off the format count against both).

    python scripts/openclaw_replay_learning.py --evaluate CHECKPOINT [CHECKPOINT ...]

prints only the held-out figures of existing checkpoints (e.g. runs/openclaw-replay/checkpoints/step-*).
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "data" / "openclaw-golden" / "conversation_B.jsonl"
HELD_OUT = REPO / "tests" / "data" / "openclaw-golden" / "conversation_A.jsonl"


def exact_preferred(model_dir: Path, shape: object, probes: int, style: str) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openclaw_rl.embedded.openclaw_golden import golden_prompt_ids
    from openclaw_rl.embedded.openclaw_replay import shaped_prompts
    from openclaw_rl.embedded.pretrain import opener_probabilities

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = [golden_prompt_ids(tok, body) for body in shaped_prompts(shape, probes)]
    return opener_probabilities(model, tok, ids)[style]


def instruction_probes(shape: object, probes: int, style: str) -> dict[str, list[dict]]:
    """Request bodies in `shape` whose reply opener says whether the model follows an instruction inside
    OpenClaw's prompt: `plain` (a fresh request), `corrected` (a reply in another style, then the scripted
    user's "No, please …" correction) and `hinted` (the fresh request as the OPD teacher scores it: the
    hint appended to the last user message, OpenClaw's internal-context block)."""
    import random

    from openclaw_opd.teacher import enhanced_messages
    from openclaw_rl.embedded import task
    from openclaw_rl.embedded.openclaw_golden import flatten_messages
    from openclaw_rl.embedded.openclaw_replay import shaped_prompts, timestamped

    rng = random.Random(1)
    plain = shaped_prompts(shape, probes)
    corrected, hinted = [], []
    for body in plain:
        system, first, context = body["messages"]
        request = task.request_by_text(first["content"])
        other = rng.choice([s for s in task.STYLE_NAMES if s != style])
        turns = [first, {"role": "assistant", "content": task.answer(other, request, rng)},
                 {"role": "user", "content": timestamped(task.correction(style, request.text), 1_795_000_100)}]
        corrected.append({**body, "messages": [system, *turns, context]})
        hinted.append({**body, "messages": enhanced_messages(flatten_messages(body["messages"]),
                                                             task.STYLES[style].instruction)})
    return {"plain": plain, "corrected": corrected, "hinted": hinted}


def exact_instructed(model_dir: Path, shape: object, probes: int, style: str) -> dict[str, float]:
    """The exact probability of `style`'s opener for each of `instruction_probes`' prompt kinds."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openclaw_rl.embedded.openclaw_golden import golden_prompt_ids
    from openclaw_rl.embedded.pretrain import opener_probabilities

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return {kind: opener_probabilities(model, tok, [golden_prompt_ids(tok, b) for b in bodies])[style]
            for kind, bodies in instruction_probes(shape, probes, style).items()}


def heldout_replies(model_dir: Path, n: int, style: str, seed: int) -> dict:
    """Sampled replies to the held-out recorded requests (conversation_A: the person's real words, never
    replayed): the share in `style` and the share with any style, as OpenClaw would show them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openclaw_rl.embedded.openclaw_golden import recorded_bodies, reply_styles

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    styles = [s for i, (name, body) in enumerate(recorded_bodies(HELD_OUT.parent))
              if name.startswith(HELD_OUT.name)
              for s, _ in reply_styles(model, tok, body, n, seed=seed * 1000 + i)]
    return {"replies": len(styles), "preferred": sum(s == style for s in styles) / max(len(styles), 1),
            "styled": sum(s is not None for s in styles) / max(len(styles), 1)}


def replay(ns: argparse.Namespace) -> dict:
    from openclaw_rl.embedded.local import LocalConfig, run_local
    from openclaw_rl.embedded.openclaw_replay import OpenClawShape, run_openclaw_replay
    from openclaw_rl.embedded.simulate import drive_simulation
    from openclaw_rl.embedded.tiny_model import ensure_tiny_model
    from openclaw_rl.servers import free_port

    started = time.monotonic()
    shape = OpenClawShape.from_recording(Path(ns.recording), ns.line)
    openclaw_model = ns.model == "openclaw"
    model_dir = ensure_tiny_model(ns.preset, seed=ns.seed, openclaw=openclaw_model, log=print)
    before = exact_preferred(model_dir, shape, ns.probes, ns.preferred_style) if ns.probes else None
    held_before = heldout_replies(model_dir, ns.heldout_n, ns.preferred_style, ns.seed) if ns.heldout_n else None
    out_dir = Path(ns.out_dir)
    cfg = LocalConfig(mode=ns.mode, preset=ns.preset, seed=ns.seed, port=free_port(), out_dir=str(out_dir),
                      rollout_batch_size=ns.batch_size, lr=ns.lr, kl_coef=ns.kl_coef, center_rewards=ns.center_rewards,
                      max_steps=ns.max_steps, save_every=1,
                      max_new_tokens=ns.max_new_tokens, preferred_style=ns.preferred_style,
                      openclaw_model=openclaw_model)
    users = functools.partial(drive_simulation, run=run_openclaw_replay, shape=shape, interactions=ns.interactions,
                              concurrency=ns.concurrency, preferred_style=ns.preferred_style, seed=ns.seed,
                              turns_per_session=ns.turns, window=ns.window)
    report = run_local(cfg, progress=ns.progress, users=users)
    checkpoints = sorted((out_dir / "checkpoints").glob("step-*"))
    after = (exact_preferred(checkpoints[-1], shape, ns.probes, ns.preferred_style)
             if ns.probes and checkpoints else None)
    held_after = (heldout_replies(checkpoints[-1], ns.heldout_n, ns.preferred_style, ns.seed)
                  if ns.heldout_n and checkpoints else None)
    return {"recording": f"{Path(ns.recording).name}#{ns.line}", "mode": ns.mode, "model": ns.model,
            "preferred_style": ns.preferred_style, "steps": report.steps, "interactions": report.interactions,
            "reply_rate_first_window": report.baseline_rate, "reply_rate_last_window": report.final_rate,
            "opening_rate_first_window": report.opening_rate_first, "opening_rate_last_window": report.opening_rate_last,
            "exact_preferred_before": before, "exact_preferred_after": after,
            "heldout_before": held_before, "heldout_after": held_after,
            "logprob_abs_diff": report.logprob_abs_diff, "seconds": round(time.monotonic() - started, 1),
            "local_report": asdict(report)}


def build_parser() -> argparse.ArgumentParser:
    """The command line (the test parses its own flags with it, so it always gets every setting)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recording", default=str(GOLDEN), help="an OpenClaw golden .jsonl (its request shape is replayed)")
    p.add_argument("--line", type=int, default=0, help="which recorded request gives the shape")
    p.add_argument("--mode", default="rl")
    p.add_argument("--model", choices=("openclaw", "plain"), default="openclaw")
    p.add_argument("--preset", default="h128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preferred-style", default="formal")
    p.add_argument("--interactions", type=int, default=48)
    p.add_argument("--turns", type=int, default=4, help="scripted-user turns per OpenClaw session")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--kl-coef", type=float, default=0.0, help="KL to the initial weights (0: none)")
    p.add_argument("--center-rewards", action="store_true",
                   help="subtract the batch mean reward (GRPO normalization; keeps the reply format)")
    p.add_argument("--max-steps", type=int, default=0, help="0: until the replay ends")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--probes", type=int, default=3, help="OpenClaw-shaped prompts for the exact probability")
    p.add_argument("--heldout-n", type=int, default=16,
                   help="sampled replies per held-out recorded request (conversation_A, 4 requests); 0: skip")
    p.add_argument("--evaluate", nargs="*", default=None, metavar="MODEL_DIR",
                   help="only print the held-out figures of these checkpoints (no replay)")
    p.add_argument("--instructed", action="store_true",
                   help="with --evaluate: also the exact opener probability after a correction and with the "
                        "OPD teacher's hint inside OpenClaw's prompt (--probes prompts each)")
    p.add_argument("--out-dir", default="runs/openclaw-replay")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def main() -> None:
    ns = build_parser().parse_args()
    fmt = lambda v: "n/a" if v is None else f"{v:.0%}"  # noqa: E731
    if ns.evaluate is not None:
        shape = None
        if ns.instructed:
            from openclaw_rl.embedded.openclaw_replay import OpenClawShape

            shape = OpenClawShape.from_recording(Path(ns.recording), ns.line)
        for model_dir in ns.evaluate:
            if shape is not None:
                probs = exact_instructed(Path(model_dir), shape, ns.probes, ns.preferred_style)
                print(f"{model_dir}: exact '{ns.preferred_style}' opener probability "
                      + ", ".join(f"{kind} {fmt(v)}" for kind, v in probs.items()), flush=True)
            if not ns.heldout_n:
                continue
            held = heldout_replies(Path(model_dir), ns.heldout_n, ns.preferred_style, ns.seed)
            print(f"{model_dir}: held-out replies {fmt(held['preferred'])} '{ns.preferred_style}', "
                  f"{fmt(held['styled'])} styled (of {held['replies']})", flush=True)
        return
    # SIGTERM stops the replay like Ctrl-C: training stops, the after-figures of the last checkpoint are still taken
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    result = replay(ns)
    Path(ns.out_dir).mkdir(parents=True, exist_ok=True)
    (Path(ns.out_dir) / "replay.json").write_text(json.dumps(result, indent=2) + "\n")
    held = [result["heldout_before"], result["heldout_after"]]
    print(f"OpenClaw replay ({result['mode']}, {result['recording']}): {result['interactions']} interactions, "
          f"{result['steps']} steps in {result['seconds']:.0f}s; preferred '{ns.preferred_style}' replies "
          f"{fmt(result['reply_rate_first_window'])} -> {fmt(result['reply_rate_last_window'])} (first/last "
          f"{ns.window}); sessions' first replies {fmt(result['opening_rate_first_window'])} -> "
          f"{fmt(result['opening_rate_last_window'])}; exact opener probability {fmt(result['exact_preferred_before'])} -> "
          f"{fmt(result['exact_preferred_after'])}; held-out sampled replies in '{ns.preferred_style}' "
          f"{fmt(held[0] and held[0]['preferred'])} -> {fmt(held[1] and held[1]['preferred'])} (styled "
          f"{fmt(held[0] and held[0]['styled'])} -> {fmt(held[1] and held[1]['styled'])})")


if __name__ == "__main__":
    main()
