"""HMAC callback tokens: who may post a RAP callback for which (thread, tool call).

A RAP invocation carries ``callback_url`` = ``STEPAGENT_CALLBACK_URL`` plus ``?token=<token>``. The token is

    v1.<base64url(tool call id)>.<base64url(HMAC-SHA256(secret, ["stepagent-rap-callback/v1", thread, call]))>

Guarantees:

- A token is bound to exactly one (thread id, tool call id) pair; the pair is MAC'd as a JSON array, so no
  choice of ids can make two different pairs produce the same MAC input.
- Verification recomputes the MAC and compares in constant time (:func:`hmac.compare_digest`); it never
  raises on garbage input, it returns ``None``.
- The call id is embedded (not secret, only authenticated) so callbacks that carry no call id of their own
  (``view_update``) can still be checked against the thread they name.

Scope, as the RAP spec asks runtimes to document it: one callback URL per tool call, no expiry (a
subscription may send events for weeks). Replays of a genuine callback are harmless: dedup ids are stable
and results for an answered call are absorbed. Rotating ``STEPAGENT_CALLBACK_SECRET`` invalidates every
outstanding callback URL, including those of live subscriptions.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

VERSION = "v1"
_DOMAIN = "stepagent-rap-callback/v1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, thread_id: str, tool_call_id: str) -> bytes:
    message = json.dumps([_DOMAIN, thread_id, tool_call_id], ensure_ascii=False, separators=(",", ":"))
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).digest()


def callback_token(secret: str, thread_id: str, tool_call_id: str) -> str:
    """The token that authorises callbacks for ``tool_call_id`` in ``thread_id``."""
    if not secret:
        raise ValueError("the callback secret must not be empty")
    return f"{VERSION}.{_b64(tool_call_id.encode())}.{_b64(_mac(secret, thread_id, tool_call_id))}"


def verify_token(secret: str, thread_id: str, token: str | None) -> str | None:
    """The tool call id ``token`` was issued for, if it is a valid token for ``thread_id``; else ``None``."""
    if not secret or not token:
        return None
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != VERSION:
        return None
    try:
        tool_call_id = _unb64(parts[1]).decode()
        given = _unb64(parts[2])
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    if not hmac.compare_digest(given, _mac(secret, thread_id, tool_call_id)):
        return None
    return tool_call_id


def callback_url_for(base_url: str, secret: str, thread_id: str, tool_call_id: str) -> str:
    """``base_url`` with ``token`` added to its query (an existing ``token`` parameter is replaced)."""
    parts = urlsplit(base_url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "token"]
    query.append(("token", callback_token(secret, thread_id, tool_call_id)))
    return urlunsplit(parts._replace(query=urlencode(query)))
