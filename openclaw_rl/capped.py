"""Size caps on backend answers: a policy, judge or teacher server that sends more than its cap is cut off.

Stage: backend / judge → **capped** → SGLang. Without a cap a broken (or hostile) backend's 200 MB body
became ~1.3 GB of proxy memory (the bytes, their JSON decode, the text). Bodies are read through httpx's
streaming API (or rawstream's ``max_body``) and refused as soon as they pass the cap, never read whole
first; a streamed ``/generate`` is checked event by event (``StreamBudget``). Either way the call fails
as a backend error (``BackendResponseTooLarge``, a 502): the policy's turn is dropped and counted, a
judge vote or teacher call counts as failed.
"""

from __future__ import annotations

import httpx

from .errors import BackendResponseTooLarge


def too_large(what: str, detail: str, cap: int, setting: str) -> BackendResponseTooLarge:
    """``what: detail, over the cap of N bytes (setting)``, e.g. ``judge /generate: an answer of 5000000 bytes, …``."""
    return BackendResponseTooLarge(f"{what}: {detail}, over the cap of {cap} bytes ({setting})")


async def read_capped(resp: httpx.Response, cap: int, what: str, setting: str) -> bytes:
    """``resp``'s body, read chunk by chunk and refused once it passes ``cap`` bytes (0: no cap); a
    declared ``Content-Length`` over the cap is refused before any of the body is read."""
    if not cap:
        return await resp.aread()
    declared = resp.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise too_large(what, f"an answer of {int(declared)} bytes", cap, setting)
    body = bytearray()
    async for piece in resp.aiter_bytes():  # decoded: a compressed body is capped at its real size
        body += piece
        if len(body) > cap:
            raise too_large(what, f"an answer of more than {cap} bytes", cap, setting)
    return bytes(body)


class StreamBudget:
    """The caps of one streamed ``/generate``: no single event over ``cap`` bytes (nor an unfinished one
    already past it), and no more than ``cap`` bytes of content in all: the sum of the events of an
    incremental stream; for a cumulative stream, whose every event repeats all before it, the last
    event's size (its repeated bytes are bounded by the token budget, not by memory)."""

    def __init__(self, cap: int, what: str = "policy backend stream", setting: str = "openclaw_proxy_max_response_bytes"):
        self.cap, self.what, self.setting, self.total = cap, what, setting, 0

    def events(self, spans: list[tuple[int, int]], cumulative: bool) -> None:
        if not self.cap:
            return
        for start, end in spans:
            size = end - start
            if size > self.cap:
                raise too_large(self.what, f"an event of {size} bytes", self.cap, self.setting)
            self.total = size if cumulative else self.total + size
        if self.total > self.cap:
            raise too_large(self.what, f"events totalling {self.total} bytes", self.cap, self.setting)

    def unfinished(self, pending: int) -> None:
        """Bytes of an event whose end has not arrived yet."""
        if self.cap and pending > self.cap:
            raise too_large(self.what, f"an unfinished event of {pending} bytes", self.cap, self.setting)
