"""Which user a request belongs to: the API key, or a trusted key's ``X-User-Id`` header.

Stage: client → **proxy (user)** → sessions. A user is the API key's namespace (``Authenticator``: a
short hash of the key, ``default`` without keys). A deployment where one key serves many people (a chat
front-end holding the key) names the person in a header, ``X-User-Id`` by default; the header is honoured
only from keys listed as trusted (``openclaw_proxy_trusted_user_keys``), so an ordinary key cannot claim
to be someone else, and the user becomes ``<key namespace>/<user id>``. The user is the namespace of the
session key (``<user>\\x1f<session id>``), so every turn, sample, record and dashboard line already
carries it (``user_of``), and per-user adapters (``openclaw_rl.users.adapters``) are chosen by it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence

from openclaw_rl.errors import BadRequest

USER_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}")
"""What a header may name: 1-64 characters, no separators, no control characters."""
USER_SEPARATOR = "/"


def key_namespace(key: str) -> str:
    """The namespace ``Authenticator`` gives a bearer key (its SHA-256, first 12 hex digits)."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def user_of(session_key: str) -> str:
    """The user of a session key (``<user>\\x1f<session id>``, see serving.py)."""
    return session_key.partition("\x1f")[0]


def owner_key_of(user: str) -> str:
    """The key namespace a user belongs to (itself for a plain key's user)."""
    return user.partition(USER_SEPARATOR)[0]


class UserResolver:
    """The user of a request from its key's namespace and headers."""

    def __init__(self, trusted_keys: Sequence[str] = (), header: str = "x-user-id"):
        self.trusted = frozenset(key_namespace(k) for k in trusted_keys)
        self.header = header.lower()

    def user(self, namespace: str, headers: Mapping[str, str]) -> str:
        """`namespace` itself unless it is a trusted key's and the request names a user (a malformed name: 400).
        The header from an untrusted key is ignored: it cannot move the request into another user's data."""
        if namespace not in self.trusted:
            return namespace
        value = next((v for k, v in headers.items() if k.lower() == self.header), None)
        if value is None or value == "":
            return namespace
        if not USER_ID_PATTERN.fullmatch(value):
            raise BadRequest(f"{self.header}: expected 1-64 characters of letters, digits and _.@+- "
                             "(starting with a letter or digit)", param=self.header)
        return f"{namespace}{USER_SEPARATOR}{value}"
