"""``openclaw-rl users --url``: list or delete a running deployment's users through its proxy, and verify.

Stage: operator tool → proxy (``GET /v1/users``, ``DELETE /v1/users/{user}``, ``users/deletion.py``). A
deletion is verified twice after the proxy's own scan: the user must be gone from the proxy's list, and,
where this machine sees the run's files (``--run-dir`` / ``--spool-dir`` / ``--ckpt-dir``), from a scan of
them here. A user who keeps chatting is listed again at once: that passes only when all their listed
activity is newer than the deletion (``deleted_at``).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx

from openclaw_rl.errors import CommandError

from .deletion import summary_row
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


def newer_than(row: dict[str, Any], deleted_at: float) -> bool:
    """All a listed user holds is newer than `deleted_at`: journal lines from then on, or, with none yet, at
    most a turn waiting for its next state (the proxy's own scan right after the deletion found nothing)."""
    first = row["first_activity"]
    if first is not None:
        return first >= deleted_at
    return not (row["turns"] or row["samples_waiting"] or row["record_lines"] or row["experience"]
                or row["adapter_checkpoints"])


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
        again = next((r for r in _call(http, "GET", f"{base}/v1/users")["data"] if r["user"] == delete), None)
    here = scan(dirs).get(delete) if dirs is not None else None
    print(json.dumps(done) if as_json else
          f"deleted {delete}: " + ", ".join(f"{k} {v}" for k, v in done["removed"].items()))
    problems = []
    if done.get("remaining") and not newer_than(done["remaining_detail"], done["deleted_at"]):
        problems.append(f"the proxy's scan finds {done['remaining']} items: {done.get('remaining_detail')}")
    back = False
    for where, row in (("the proxy lists", again), ("the files here hold", None if here is None or not here.total
                                                       else summary_row(here))):
        if row is None:
            continue
        if newer_than(row, done["deleted_at"]):  # the user came back: all of what is listed is new
            back = True
        else:
            problems.append(f"{where} data of the user from before the deletion: {row}")
    if back and not problems:
        print(f"{delete} has come back since the deletion (listed again with only newer activity)")
    if problems:
        print(f"NOT verified: {'; '.join(problems)}")
        return 1
    print(f"verified: nothing of {delete} {'from before the deletion ' if back else ''}remains (the proxy's scan and list"
          + (", and the files here" if dirs is not None else "") + ")")
    return 0
