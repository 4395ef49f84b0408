"""``openclaw-rl experience``: list, show and delete the OEL experience store beside a spool.

Stage: operator tool over the **experience store** (``store.py``); reads and deletes nothing else. A
key is a user's API key namespace (``default`` without keys), as ``--list`` prints it.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any

from .store import FILE_NAME, ExperienceStore


def register_experience_command(sub: Any) -> None:
    p = sub.add_parser("experience", help="list, show or delete OEL's per-user experience (beside the spool)")
    p.add_argument("--spool-dir", required=True, help="the proxy's spool directory")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="one line per key: key, rules, sessions, updated (default)")
    what.add_argument("--show", metavar="KEY", help="the key's rules, one a line")
    what.add_argument("--delete", metavar="KEY", help="forget the key's experience")
    p.add_argument("--json", action="store_true", help="JSON instead of text")
    p.set_defaults(fn=cmd_experience)


def cmd_experience(ns: argparse.Namespace) -> int:
    path = Path(ns.spool_dir) / FILE_NAME
    if not path.exists():
        raise FileNotFoundError(f"no experience store at {path} (the proxy writes it in mode oel)")
    store = ExperienceStore(path)
    try:
        if ns.delete:
            if not store.delete(ns.delete):
                raise ValueError(f"no experience under key {ns.delete!r}")
            print(f"deleted {ns.delete}")
            return 0
        if ns.show:
            entry = store.get(ns.show)
            if entry is None:
                raise ValueError(f"no experience under key {ns.show!r}")
            print(json.dumps({"key": entry.key, "rules": entry.rules, "sessions": entry.sessions,
                              "updated": entry.updated}) if ns.json else entry.text())
            return 0
        for e in store.entries():
            when = datetime.datetime.fromtimestamp(e.updated, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            print(json.dumps({"key": e.key, "rules": len(e.rules), "sessions": e.sessions, "updated": e.updated})
                  if ns.json else f"{e.key}\t{len(e.rules)} rules\t{e.sessions} sessions\t{when}")
        return 0
    finally:
        store.close()
