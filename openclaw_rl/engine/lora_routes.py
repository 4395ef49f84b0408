"""SGLang's LoRA routes on the embedded engine: ``/load_lora_adapter`` and ``/unload_lora_adapter``.

Stage: engine server → adapters. The per-request choice (``lora_path``) is the torch core's
(``adapters.py``); these routes only load, replace and unload what it serves, answering in SGLang's shape.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from openclaw_rl.engine.protocol import compact_json


async def lora_route(model: Any, request: Request, *, load: bool) -> Response:
    """SGLang's ``/load_lora_adapter`` (``lora_name``, ``lora_path``: a PEFT adapter directory) and
    ``/unload_lora_adapter`` (``lora_name``). ``weight_version`` (this engine's addition) labels the
    adapter's tokens, as ``/update_weights_from_disk`` labels the base model's."""
    from openclaw_rl.engine.adapters import read_adapter

    def answer(ok: bool, message: str = "", status: int = 200) -> Response:
        names = getattr(model, "adapter_names", lambda: None)() or []
        return Response(compact_json({"success": ok, "error_message": message,
                                      "loaded_adapters": {n: n for n in names}}),
                        status_code=status, media_type="application/json")

    if getattr(model, "adapter_names", lambda: None)() is None:
        return answer(False, "LoRA is not enabled on this engine.", 400)
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = None
    name = body.get("lora_name") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        return answer(False, "lora_name is required.", 400)
    try:
        if not load:
            await asyncio.to_thread(model.unload_adapter, name)
            return answer(True)
        path, version = body.get("lora_path"), body.get("weight_version") or "default"
        if not isinstance(path, str) or not path:
            return answer(False, "lora_path is required.", 400)
        state = await asyncio.to_thread(read_adapter, path)
        await asyncio.to_thread(model.load_adapter, name, state, str(version))
    except KeyError:
        return answer(False, f"LoRA adapter {name} is not loaded.", 400)
    except (OSError, ValueError) as exc:
        return answer(False, f"{type(exc).__name__}: {exc}", 400)
    return answer(True)
