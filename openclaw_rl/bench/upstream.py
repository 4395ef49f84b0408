"""Run upstream OpenClaw-RL's proxy (``OpenClawAPIServer``) unmodified, for the side-by-side benchmark.

``python -m openclaw_rl.bench.upstream --checkout PATH …`` imports ``openclaw-rl/openclaw_api_server.py``
from a checkout of Gen-Verse/OpenClaw-RL with the Slime stub (``upstream_stub``) first on
``sys.path``, builds the ``args`` it reads (policy and PRM router addresses, PRM m), and serves it as
upstream does (uvicorn on a thread, HOST/PORT from the environment). Samples it submits are drained
from its queue and dropped, as a trainer would take them. Nothing of upstream is copied here: it is
run from the checkout given.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

STUB = Path(__file__).resolve().parent / "upstream_stub"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="upstream-proxy", description=__doc__.splitlines()[0])
    p.add_argument("--checkout", required=True, help="a Gen-Verse/OpenClaw-RL checkout")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--policy-url", required=True, help="http://127.0.0.1:PORT (serves /v1/chat/completions)")
    p.add_argument("--judge-url", default="", help="http://127.0.0.1:PORT (serves /generate); empty: PRM off")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--prm-m", type=int, default=3)
    p.add_argument("--record-file", default="", help="OPENCLAW_RECORD_FILE (records on when set)")
    ns = p.parse_args(argv)
    os.environ.update(HOST="127.0.0.1", PORT=str(ns.port), PRM_M=str(ns.prm_m))
    if ns.record_file:
        os.environ.update(OPENCLAW_RECORD_ENABLED="1", OPENCLAW_RECORD_FILE=ns.record_file)
    sys.path[:0] = [str(STUB), str(Path(ns.checkout) / "openclaw-rl")]
    import openclaw_api_server  # noqa: E402  (upstream's module, from the checkout)

    def host_port(url: str) -> tuple[str | None, int | None]:
        if not url:
            return None, None
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        return host, int(port)

    policy_ip, policy_port = host_port(ns.policy_url)
    prm_ip, prm_port = host_port(ns.judge_url)
    args = SimpleNamespace(hf_checkpoint=ns.tokenizer, sglang_router_ip=policy_ip, sglang_router_port=policy_port,
                           prm_enable=bool(ns.judge_url), prm_m=ns.prm_m, prm_router_ip=prm_ip,
                           prm_router_port=prm_port, prm_model_path=ns.tokenizer, prm_temperature=0.6,
                           prm_max_new_tokens=64)
    samples: queue.Queue = queue.Queue()
    enabled = threading.Event()
    enabled.set()
    server = openclaw_api_server.OpenClawAPIServer(args, samples, enabled)

    def drain() -> None:
        while True:
            samples.get()

    threading.Thread(target=drain, daemon=True).start()
    server.start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
