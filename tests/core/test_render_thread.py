"""Where a prompt is rendered (``serving.INLINE_RENDER_BYTES``): a small request on the event loop (a hop
to the render thread costs more CPU than its render), a large one on the render thread, so that a long
prompt never holds the loop."""

from __future__ import annotations

import threading

import httpx

from openclaw_rl.serving import INLINE_RENDER_BYTES


def test_small_bodies_render_on_the_loop_and_large_ones_on_the_render_thread(policy_server, make_proxy):
    proxy, url = make_proxy(policy_server.url)
    service = proxy.service
    seen: list[tuple[str, int]] = []
    prepare = service._prepare

    def spy(req, cache_key):  # noqa: ANN001, ANN202 - the method's own signature
        out = prepare(req, cache_key)
        seen.append((threading.current_thread().name, len(out[2])))
        return out

    service._prepare = spy
    words = "lorem ipsum dolor sit amet " * (INLINE_RENDER_BYTES // 27 + 8)
    small = {"model": "policy", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
    large = {"model": "policy", "messages": [{"role": "user", "content": words}], "max_tokens": 8}
    with httpx.Client(trust_env=False, timeout=60) as client:
        for i, body in enumerate((small, large)):
            r = client.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-Id": f"s{i}"})
            assert r.status_code in (200, 400), r.text
    (small_thread, small_ids), (large_thread, large_ids) = seen
    assert not small_thread.startswith("openclaw-render")
    assert large_thread.startswith("openclaw-render") and large_ids > small_ids
