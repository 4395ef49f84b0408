"""``openclaw-rl users --url``: list or delete a running deployment's users through its proxy, and verify.

Stage: operator tool → proxy (``GET /v1/users``, ``DELETE /v1/users/{user}``, ``users/deletion.py``). A
deletion is verified twice after the proxy's own scan: the user must be gone from the proxy's list, and,
where this machine sees the run's files (``--run-dir`` / ``--spool-dir`` / ``--ckpt-dir``), from a scan of
them here.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx

from openclaw_rl.errors import CommandError

from .store import RunDirs, scan


def _call(http: httpx.Client, method: str, url: str) -> dict[str, Any]:
    try:
        resp = http.request(method, url)
    except httpx.HTTPError as exc:
        raise CommandError(f"proxy unreachable at {url}: {exc}") from None
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if resp.status_code != 200:
        message = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
        raise CommandError(f"{method} {url}: {resp.status_code} {message or resp.text[:300]}")
    return body


def remote_users(url: str, api_key: str, delete: str | None, *, as_json: bool, dirs: RunDirs | None) -> int:
    base = url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=600, headers=headers, trust_env=False) as http:
        if not delete:
            rows = _call(http, "GET", f"{base}/v1/users")["data"]
            for row in rows:
                print(json.dumps(row) if as_json else
                      f"{row['user']}\t{row['turns']}\t{row['samples']} ({row['trained_samples']}, "
                      f"{row['samples_waiting']})\t{row['adapter_version'] or 'base'}")
            return 0
        done = _call(http, "DELETE", f"{base}/v1/users/{quote(delete, safe='/')}")
        listed = [r["user"] for r in _call(http, "GET", f"{base}/v1/users")["data"]]
    here = scan(dirs).get(delete) if dirs is not None else None
    print(json.dumps(done) if as_json else
          f"deleted {delete}: " + ", ".join(f"{k} {v}" for k, v in done["removed"].items()))
    problems = []
    if done.get("remaining"):
        problems.append(f"the proxy's scan finds {done['remaining']} items: {done.get('remaining_detail')}")
    if delete in listed:
        problems.append("the proxy still lists the user")
    if here is not None and here.total:
        problems.append(f"{here.total} items remain in the files here")
    if problems:
        print(f"NOT verified: {'; '.join(problems)}")
        return 1
    print(f"verified: nothing of {delete} remains (the proxy's scan and list"
          + (", and the files here" if dirs is not None else "") + ")")
    return 0
