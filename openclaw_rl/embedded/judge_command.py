"""``openclaw-rl judge``: the rule judge as a server of its own, for ``train`` or ``serve`` without a judge model.

Stage: proxy's ``JudgeClient`` → **this server** (``make_engine_app(RuleJudgeModel)``) → rule judge core.
``local`` runs the rule judge in-process; ``train`` against a CPU SGLang had nothing to point
``--judge-url`` at short of a second SGLang with a real judge model. This serves the same core over the
same HTTP protocol (SGLang's ``/generate``, ``/health``, ``/model_info``) the proxy's judge client
speaks, so ``openclaw-rl judge --model M --port 30020`` and ``train --judge-url http://127.0.0.1:30020``
make a judged CPU run. The judge prompts arrive as token ids, so ``--model`` must be the checkpoint (its
tokenizer) the proxy renders them with: the policy's, unless ``--judge-tokenizer`` says otherwise.
``--teacher`` also serves teacher log-probs (OPD, combine) from that checkpoint's frozen weights on CPU.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_PORT = 30020  # beside the policy server's 30010 in the README's examples


def build_judge_app(model: str, *, teacher: bool = False, seed: int = 0) -> Any:
    """The engine app over ``RuleJudgeModel`` with `model`'s tokenizer (and its frozen weights as teacher)."""
    from transformers import AutoTokenizer

    from openclaw_rl.embedded.rule_judge import RuleJudgeModel
    from openclaw_rl.engine.app import make_engine_app

    tokenizer = AutoTokenizer.from_pretrained(model)
    core = None
    if teacher:
        from openclaw_rl.engine.torch_core import TorchModel

        core = TorchModel.from_pretrained(model, seed=seed, tokenizer_vocab_size=len(tokenizer))
    return make_engine_app(RuleJudgeModel(tokenizer, teacher=core), tokenizer, served_model_name="rule-judge",
                           model_path=model)


def cmd_judge(ns: argparse.Namespace) -> int:
    import uvicorn

    from openclaw_rl.cli import ensure_port_free

    ensure_port_free(ns.host, ns.port, "--port")
    app = build_judge_app(ns.model, teacher=ns.teacher, seed=ns.seed)
    if ns.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("the judge has no authentication, like SGLang; %s exposes it beyond this machine", ns.host)
    host = f"[{ns.host}]" if ":" in ns.host else ns.host
    print(f"openclaw-rl judge: rule judge{' and teacher' if ns.teacher else ''} on http://{host}:{ns.port} "
          f"(give `train`/`serve` --judge-url http://{host}:{ns.port})", flush=True)
    uvicorn.run(app, host=ns.host, port=ns.port, log_level="warning", access_log=False)
    return 0


def register_judge_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``judge`` to the ``openclaw-rl`` subcommands."""
    p = subparsers.add_parser("judge", help="serve the rule judge (SGLang's /generate API) for train/serve on CPU",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="the checkpoint whose tokenizer renders the judge prompts (the policy's, as `train --model`)")
    p.add_argument("--teacher", action="store_true",
                   help="also answer teacher log-probs (opd, combine) with --model's frozen weights on CPU")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_judge)
    return p
