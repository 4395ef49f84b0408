"""``openclaw-rl engine``: serve a Hugging Face checkpoint with SGLang's native API on CPU.

Stage: command line → **serve** → ``make_engine_app(TorchModel)`` under uvicorn. It stands in for
``python -m sglang.launch_server`` where SGLang cannot run (no GPU), for the policy, judge or teacher.
It only wires pieces together; torch, transformers and uvicorn are imported when a server starts,
so building the CLI parser stays cheap.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_PORT = 30000  # SGLang's default


def build_engine_app(model_path: str, *, max_batch: int = 8, served_model_name: str | None = None,
                     context_length: int | None = None, seed: int = 0,
                     incremental_streaming_output: bool = False, stream_interval: int = 1,
                     prefix_cache_entries: int = 4, max_lora_rank: int = 0) -> Any:
    """The engine app over ``TorchModel.from_pretrained(model_path)``, ready for any ASGI server."""
    from transformers import AutoTokenizer

    from openclaw_rl.engine.app import make_engine_app
    from openclaw_rl.engine.torch_core import TorchModel

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    core = TorchModel.from_pretrained(model_path, max_batch=max_batch, context_length=context_length, seed=seed,
                                      tokenizer_vocab_size=len(tokenizer), prefix_cache_entries=prefix_cache_entries)
    if max_lora_rank:  # SGLang's --enable-lora --max-lora-rank: per-user adapters (engine/adapters.py)
        from openclaw_rl.engine.adapters import lora_config

        core.enable_lora(lora_config(max_lora_rank, 2 * max_lora_rank))
    # SGLang's default served model name is the model path.
    return make_engine_app(core, tokenizer, served_model_name=served_model_name or model_path, model_path=model_path,
                           incremental_streaming_output=incremental_streaming_output, stream_interval=stream_interval)


def serve_engine(model_path: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, max_batch: int = 8,
                 served_model_name: str | None = None, context_length: int | None = None, seed: int = 0,
                 log_level: str = "warning", incremental_streaming_output: bool = False,
                 stream_interval: int = 1, prefix_cache_entries: int = 4, max_lora_rank: int = 0) -> None:
    """Load ``model_path`` and serve it until interrupted (blocking)."""
    import uvicorn

    app = build_engine_app(model_path, max_batch=max_batch, served_model_name=served_model_name,
                           context_length=context_length, seed=seed,
                           incremental_streaming_output=incremental_streaming_output, stream_interval=stream_interval,
                           prefix_cache_entries=prefix_cache_entries,
                           max_lora_rank=max_lora_rank)
    if host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("the engine has no authentication, like SGLang; %s exposes it beyond this machine", host)
    logger.info("openclaw-rl engine: %s on http://%s:%d (max batch %d)", model_path, host, port, max_batch)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)


def cmd_engine(ns: argparse.Namespace) -> int:
    serve_engine(ns.model, ns.host, ns.port, max_batch=ns.max_batch, served_model_name=ns.served_model_name,
                 context_length=ns.context_length, seed=ns.seed,
                 incremental_streaming_output=ns.incremental_streaming_output, stream_interval=ns.stream_interval,
                 prefix_cache_entries=ns.prefix_cache_entries,
                 max_lora_rank=ns.max_lora_rank)
    return 0


def register_engine_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``engine`` to the ``openclaw-rl`` subcommands (``fn`` takes the parsed namespace)."""
    p = subparsers.add_parser("engine", help="serve a HF checkpoint with SGLang's /generate API on CPU")
    p.add_argument("--model", required=True, help="checkpoint directory (config, safetensors, tokenizer)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded together")
    p.add_argument("--served-model-name", default=None, help="default: the model path, as SGLang")
    p.add_argument("--context-length", type=int, default=None, help="default: max_position_embeddings")
    p.add_argument("--seed", type=int, default=0, help="seeds requests without a sampling_seed")
    p.add_argument("--incremental-streaming-output", action="store_true",
                   help="stream chunks hold only new text/ids/log-probs (SGLang's flag of the same name)")
    p.add_argument("--stream-interval", type=int, default=1,
                   help="tokens per stream event when a request sets none (SGLang's flag; a request's "
                        "sampling_params.stream_interval wins)")
    p.add_argument("--prefix-cache-entries", type=int, default=4,
                   help="recent prompts whose KV is kept for prefix reuse (0: none)")
    p.add_argument("--max-lora-rank", type=int, default=0,
                   help="> 0: serve LoRA adapters of this rank (alpha 2 x rank, every linear layer) next to the base, "
                        "loaded by /load_lora_adapter and chosen per request by lora_path (SGLang's --enable-lora)")
    p.set_defaults(fn=cmd_engine)
    return p
