"""``openclaw-rl users``: list a run's users, or delete one user's every trace and verify it (a stopped run's
files directly; a running deployment through its proxy with ``--url``, ``users/remote.py``).

Stage: operator tool over ``users/store.py`` (spool, journal, records, experience, adapter checkpoints).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path
from typing import Any

from openclaw_rl.spool import SpoolLocked

from .store import RunDirs, UserSummary, delete_user, scan


def register_users_command(sub: Any) -> None:
    p = sub.add_parser("users", help="list users (samples, adapter version, last activity) or delete one user's data")
    p.add_argument("--run-dir", help="an `openclaw-rl local` output directory (spool/, records/, checkpoints/)")
    p.add_argument("--spool-dir", help="the proxy's spool directory (instead of --run-dir)")
    p.add_argument("--record-dir", help="the proxy's --record-dir, if it kept records")
    p.add_argument("--ckpt-dir", help="the trainer's checkpoint directory (adapters under users/)")
    p.add_argument("--delete", metavar="USER", help="remove the user's samples, waiting turns, journal lines, "
                   "records, experience and adapter checkpoints (the proxy must be stopped), then verify")
    p.add_argument("--url", help="a running proxy (http://host:port): list or delete through it "
                   "(GET/DELETE /v1/users), while it serves and trains")
    p.add_argument("--api-key", default=os.environ.get("OPENCLAW_ADMIN_KEY", ""),
                   help="with --url: an admin key (openclaw_proxy_admin_keys) or a trusted key (its own users); "
                        "default $OPENCLAW_ADMIN_KEY")
    p.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p.set_defaults(fn=cmd_users)


def run_dirs(ns: argparse.Namespace) -> RunDirs:
    if ns.run_dir:
        dirs = RunDirs.of_local_run(ns.run_dir)
    elif ns.spool_dir:
        dirs = RunDirs(Path(ns.spool_dir))
    else:
        raise ValueError("give --run-dir (a local run) or --spool-dir")
    return RunDirs(Path(ns.spool_dir) if ns.spool_dir else dirs.spool_dir,
                   Path(ns.record_dir) if ns.record_dir else dirs.record_dir,
                   Path(ns.ckpt_dir) if ns.ckpt_dir else dirs.ckpt_dir)


def _row(u: UserSummary) -> dict[str, Any]:
    return {"user": u.user, "turns": u.turns, "samples": u.samples, "trained_samples": u.trained_samples,
            "samples_waiting": u.samples_waiting, "turns_waiting": u.turns_waiting,
            "adapter": u.adapter, "adapter_version": u.adapter_version, "last_activity": u.last_activity,
            "record_lines": u.record_lines, "experience": u.experience}


def cmd_users(ns: argparse.Namespace) -> int:
    if ns.url:
        from .remote import remote_users

        return remote_users(ns.url, ns.api_key, ns.delete, as_json=ns.json, dirs=run_dirs(ns) if (
            ns.run_dir or ns.spool_dir) else None)
    dirs = run_dirs(ns)
    if not dirs.spool_dir.exists():
        raise FileNotFoundError(f"no spool directory at {dirs.spool_dir}")
    if ns.delete:
        known = scan(dirs)
        if ns.delete not in known:
            raise ValueError(f"no data of user {ns.delete!r} here (`openclaw-rl users` lists them)")
        try:
            removed, after = delete_user(dirs, ns.delete)
        except SpoolLocked as e:
            raise SpoolLocked(f"{e}. To delete a user while the deployment runs: openclaw-rl users --url "
                              f"http://PROXY --api-key ADMIN_KEY --delete {ns.delete}") from None
        print(json.dumps({"deleted": ns.delete, "removed": removed}) if ns.json else
              f"deleted {ns.delete}: " + ", ".join(f"{k} {v}" for k, v in removed.items()))
        if after.total:
            print(f"NOT verified: {after.total} items of {ns.delete} remain: {_row(after)}")
            return 1
        print(f"verified: nothing of {ns.delete} remains in {dirs.spool_dir}"
              + (f", {dirs.record_dir}" if dirs.record_dir else "") + (f", {dirs.ckpt_dir}" if dirs.ckpt_dir else ""))
        return 0
    users = sorted(scan(dirs).values(), key=lambda u: u.user)
    if ns.json:
        for u in users:
            print(json.dumps(_row(u)))
        return 0
    print("user\tturns\tsamples (trained, waiting)\tadapter version\tlast activity")
    for u in users:
        when = "-" if u.last_activity is None else datetime.datetime.fromtimestamp(
            u.last_activity, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(f"{u.user}\t{u.turns}\t{u.samples} ({u.trained_samples}, {u.samples_waiting})\t"
              f"{u.adapter_version or 'base'}\t{when}")
    return 0
