"""Deleting a user from a running deployment: ``DELETE /v1/users/{user}`` and ``GET /v1/users``.

Stage: operator → **proxy (user admin)** → sessions → writer → spool / journal / records / experience →
trainer → engine. The offline ``openclaw-rl users --delete`` needs the spool's writer lock, which a running
proxy holds; this route does the same deletion inside the proxy, each part by the one that owns it, so
the spool keeps one writer and nothing of the user is written back afterwards:

1. the session tracker (event loop) forgets the user's sessions: every turn not yet emitted, the ones
   still generating included, is counted and logged as a ``user_deleted`` drop; a judgement or generation
   still running finds its turn gone and keeps nothing (its client still gets its reply, unsaved);
2. the proxy's adapter directory stops naming the user's adapter, so their next request gets the base;
3. the spool writer's thread, after every write queued before it, deletes their samples (leased ones
   too), waiting turns and record lines, and the samples it holds in memory;
4. the journal's thread rewrites both journal files without their turn lines;
5. OEL's scorer deletes their experience; an extraction already running does not write it back;
6. each trainer hook (``PerUserTrainer.delete_user``, registered by ``local``/``train``) drops the adapter,
   its optimizer state and checkpoints, unloads it from the engine, and leaves the removed samples of a
   batch it already leased out of its steps;
7. a scan of the run's files (``users/store.scan``) says what remains (0, unless the user came back).

Who may delete: an admin key (``openclaw_proxy_admin_keys``) any user; a trusted key
(``openclaw_proxy_trusted_user_keys``) the users it names (``<its namespace>/<id>``) and its own; any other
key gets 403, a missing or unknown key 401. An unknown user is a 404.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from openclaw_rl.errors import Forbidden, NotDurable, NotFound, Unauthorized
from openclaw_rl.metrics import log_safe

from .adapters import adapter_name
from .identity import owner_key_of
from .store import RunDirs, UserSummary, scan

log = logging.getLogger(__name__)

TrainerHook = Callable[[str, list[str]], dict[str, int]]
"""Deletes a user in a trainer: (user, ids of their samples in a leased batch) → counts removed. Runs on a
worker thread (it waits for a training step in progress)."""


@dataclass
class UserAdmin:
    admin_keys: list[str] = field(default_factory=list)
    ckpt_dir: Path | None = None  # the trainer's checkpoints (adapters under users/), scanned after a deletion
    trainer_hooks: list[TrainerHook] = field(default_factory=list)
    _busy: asyncio.Lock | None = None

    def is_admin(self, authorization: str | None) -> bool:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        found = False
        for key in self.admin_keys:  # every key compared: timing does not say which one matched
            found |= hmac.compare_digest(token.encode("latin-1", "replace"), key.encode())
        return found

    def lock(self) -> asyncio.Lock:
        if self._busy is None:
            self._busy = asyncio.Lock()
        return self._busy


def summary_row(u: UserSummary) -> dict[str, Any]:
    return {"user": u.user, "turns": u.turns, "samples": u.samples, "trained_samples": u.trained_samples,
            "samples_waiting": u.samples_waiting, "turns_waiting": u.turns_waiting, "adapter": u.adapter,
            "adapter_version": u.adapter_version, "last_activity": u.last_activity,
            "first_activity": u.first_activity, "record_lines": u.record_lines,
            "experience": u.experience, "adapter_checkpoints": len(u.paths)}


def run_dirs(proxy: Any) -> RunDirs:
    record = proxy.settings.proxy.record_dir
    return RunDirs(proxy.spool.dir, Path(record) if record else None, proxy.user_admin.ckpt_dir)


def caller_scope(proxy: Any, authorization: str | None) -> str | None:
    """None: an admin (every user); else the key namespace whose users the caller may see and delete.
    Raises 401 for a missing or unknown key, 403 for a key that is neither admin nor trusted."""
    if proxy.user_admin.is_admin(authorization):
        return None
    namespace = proxy.auth.identify(authorization)
    if namespace in proxy.users.trusted:
        return namespace
    if not proxy.auth.keys and not authorization:
        raise Unauthorized("managing users needs an admin key (openclaw_proxy_admin_keys) or a trusted key")
    raise Forbidden("only an admin key (openclaw_proxy_admin_keys) or a trusted key (for its own users) may "
                    "list or delete users")


def live_users(proxy: Any) -> set[str]:
    """Users the proxy holds something of in memory (sessions, a served adapter)."""
    users = {key.partition("\x1f")[0] for key in proxy.tracker.sessions}
    if proxy.service.adapters is not None:
        users.update(proxy.service.adapters.snapshot())
    return users


async def delete_user(proxy: Any, user: str) -> dict[str, Any]:
    """Remove everything of `user` from the running deployment (the module docstring says how)."""
    admin: UserAdmin = proxy.user_admin
    dirs = run_dirs(proxy)
    async with admin.lock():
        on_disk = await asyncio.to_thread(scan, dirs)
        if user not in on_disk and user not in live_users(proxy):
            raise NotFound(f"no data of user {user!r} here (GET /v1/users lists them)")
        deleted_at = time.time()  # what of the user is newer came after the deletion (they came back)
        removed: dict[str, int] = {"dropped_turns": proxy.tracker.delete_user(user)}
        if proxy.service.adapters is not None:
            proxy.service.adapters.unloaded(user)
        spool_done = proxy.writer.delete_user(user)  # queued now: after every write of the dropped turns
        journal_done = proxy.journal.delete_user(user) if proxy.journal is not None else None
        forget = getattr(proxy.tracker.scorer, "forget_user", None)
        if forget is not None:
            removed["experience"] = forget(user)
        elif (dirs.spool_dir / "experience.sqlite").exists():  # left by an earlier OEL run on this spool
            removed["experience"] = await asyncio.to_thread(_delete_experience, dirs.spool_dir, user)
        try:
            counts, leased = await asyncio.wrap_future(spool_done)
        except Exception as e:
            raise NotDurable(f"the spool could not delete {user}'s samples ({e}); nothing of the trainer was "
                             "touched: retry when /healthz says the spool is ok", headers={"Retry-After": "5"}) from None
        removed.update(counts)
        if journal_done is not None:
            try:
                removed["journal_lines"] = await asyncio.wrap_future(journal_done)
            except Exception as e:
                log.error("journal lines of %s not deleted: %s", log_safe(user), e)
        for hook in admin.trainer_hooks:
            for k, v in (await asyncio.to_thread(hook, user, leased)).items():
                removed[k] = removed.get(k, 0) + v
        after = (await asyncio.to_thread(scan, dirs)).get(user)
    remaining = summary_row(after) if after is not None else None
    log.warning("user %s deleted from the running deployment: %s; %s", log_safe(user),
                ", ".join(f"{k} {v}" for k, v in removed.items()),
                "nothing remains" if after is None or not after.total else f"{after.total} items remain")
    return {"deleted": user, "adapter": adapter_name(user), "deleted_at": deleted_at, "removed": removed,
            "remaining": 0 if after is None else after.total, "remaining_detail": remaining}


def _delete_experience(spool_dir: Path, user: str) -> int:
    from openclaw_oel.store import ExperienceStore, store_key

    store = ExperienceStore.beside(spool_dir)
    try:
        return int(store.delete(store_key(user)))
    finally:
        store.close()


async def list_users_as(proxy: Any, authorization: str | None) -> dict[str, Any]:
    """``GET /v1/users`` for the caller: every user for an admin key, a trusted key's own users."""
    scope = caller_scope(proxy, authorization)
    found = await asyncio.to_thread(scan, run_dirs(proxy))
    for user in live_users(proxy) - set(found):
        found[user] = UserSummary(user, adapter=adapter_name(user))
    rows = [summary_row(u) for u in sorted(found.values(), key=lambda u: u.user)
            if scope is None or owner_key_of(u.user) == scope]
    return {"object": "list", "data": rows}


async def delete_user_as(proxy: Any, user: str, authorization: str | None) -> dict[str, Any]:
    """``DELETE /v1/users/{user}`` for the caller (401/403 before anything is touched)."""
    scope = caller_scope(proxy, authorization)
    if scope is not None and owner_key_of(user) != scope:
        raise Forbidden("a trusted key may delete only its own users (<its namespace>/<id>)")
    return await delete_user(proxy, user)


def users_router(proxy: Any) -> APIRouter:
    """The routes of one process; ``serve --workers`` forwards the same calls to its owner (``workers/``)."""
    router = APIRouter()

    @router.get("/v1/users")
    async def list_users(request: Request) -> dict[str, Any]:
        return await list_users_as(proxy, request.headers.get("authorization"))

    @router.delete("/v1/users/{user:path}")
    async def delete(user: str, request: Request) -> dict[str, Any]:
        return await delete_user_as(proxy, user, request.headers.get("authorization"))

    return router
