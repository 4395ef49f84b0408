"""The engine's FastAPI app: SGLang's native routes over an ``EngineService`` (``server.py``).

Stage: client (proxy, judge, teacher) → **engine app** (routes) → engine server (``EngineService``) → core.
Kept apart from the service so the request semantics (``server.py``) and the route table (here, with the
crash behaviour of a dead SGLang process) each read on their own.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from openclaw_rl.engine.lora_routes import lora_route
from openclaw_rl.engine.model import EngineModel
from openclaw_rl.engine.prefix_cache import prefix_counters
from openclaw_rl.engine.protocol import (
    FLUSH_CACHE_TEXT,
    GenerateRequest,
    UpdateWeightsFromDiskRequest,
    invalid_body,
    model_info_body,
    models_body,
    server_info_body,
)
from openclaw_rl.engine.server import EngineService, TokenizerLike, _drop_connection, json_response
from openclaw_rl.servers import RAW_SEND


class EngineApp(FastAPI):
    """A FastAPI app that can fail like a crashed SGLang process: once ``crashed``, the connection of
    every request is closed without a response."""

    def __init__(self, service: EngineService, **kwargs: Any):
        super().__init__(**kwargs)
        self.service = service

    @property
    def crashed(self) -> bool:
        return self.service.crashed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope.setdefault(RAW_SEND, send)  # BackgroundServer's shutdown guard may have set it
            if self.service.crashed:
                await _drop_connection(scope[RAW_SEND])
                return
        await super().__call__(scope, receive, send)


def make_engine_app(model: EngineModel, tokenizer: TokenizerLike, *, served_model_name: str, model_path: str,
                    crash_on_bad_ids: bool = True, max_total_num_tokens: int | None = None,
                    incremental_streaming_output: bool = False, stream_interval: int = 1,
                    refused_sampling_fields: frozenset[str] = frozenset()) -> EngineApp:
    """SGLang's native routes over ``model``. ``crash_on_bad_ids=False`` answers out-of-vocabulary
    ids with a 400 instead of dropping every connection from then on (``app.crashed``)."""
    service = EngineService(model, tokenizer, served_model_name=served_model_name, model_path=model_path,
                            crash_on_bad_ids=crash_on_bad_ids, max_total_num_tokens=max_total_num_tokens,
                            incremental_streaming_output=incremental_streaming_output,
                            stream_interval=stream_interval, refused_sampling_fields=refused_sampling_fields)
    app = EngineApp(service, title="openclaw-rl engine (SGLang-compatible)")

    @app.exception_handler(RequestValidationError)
    async def invalid_json(request: Request, exc: RequestValidationError) -> Response:
        return json_response(invalid_body(str(exc)), status_code=400)

    @app.post("/generate")
    async def generate(body: GenerateRequest, request: Request) -> Response:
        return await service.generate(body, request)

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200)  # empty body, no content-type, as SGLang

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def get_model_info() -> Response:
        return json_response(model_info_body(model_path=service.model_path, served_model_name=served_model_name,
                                             weight_version=service.reported_weight_version))

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info() -> Response:
        return json_response(server_info_body(model_path=service.model_path, served_model_name=served_model_name,
                                              context_length=model.context_length,
                                              max_total_num_tokens=service.max_total_num_tokens,
                                              incremental_streaming_output=service.incremental_streaming_output,
                                              stream_interval=service.stream_interval,
                                              prefix_cache=prefix_counters(model),
                                              max_lora_rank=getattr(getattr(model, "adapters", None), "config",
                                                                    SimpleNamespace(r=None)).r))

    @app.get("/v1/models")
    async def list_models() -> Response:
        return json_response(models_body(served_model_name=served_model_name, model_path=service.model_path,
                                         created=service.created, context_length=model.context_length))

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: UpdateWeightsFromDiskRequest) -> Response:
        return await service.update_weights(body)

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        return await lora_route(model, request, load=True)

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        return await lora_route(model, request, load=False)

    @app.api_route("/pause_generation", methods=["GET", "POST"])
    async def pause_generation(request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            body = {}
        mode = body.get("mode", "abort") if isinstance(body, dict) else "abort"
        if mode not in ("abort", "retract", "in_place"):
            return json_response({"error": f"unknown pause mode {mode!r}"}, status_code=400)
        service.set_paused(True, mode)
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    @app.api_route("/continue_generation", methods=["GET", "POST"])
    async def continue_generation() -> Response:
        service.set_paused(False)
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    @app.post("/release_memory_occupation")
    async def release_memory_occupation(request: Request) -> Response:
        # SGLang on CPU dies here (torch.cuda without a driver); a caller of it is a bug to surface.
        return await service.crash(request, "release_memory_occupation needs a GPU")

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        model.flush_cache()
        return Response(FLUSH_CACHE_TEXT)  # plain body without a content-type, as SGLang

    return app
