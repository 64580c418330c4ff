"""HMAC callback tokens: who may post a RAP callback for which (thread, tool call), and until when.

A RAP invocation carries ``callback_url`` = ``STEPAGENT_CALLBACK_URL`` plus ``?token=<token>``. The token is

    v2.<base64url(tool call id)>.<expiry>.<base64url(HMAC-SHA256(secret,
        ["stepagent-rap-callback/v2", thread, call, expiry]))>

where ``expiry`` is a Unix time in whole seconds (decimal).

Guarantees:

- A token is bound to exactly one (thread id, tool call id) pair and its expiry; they are MAC'd as a JSON
  array, so no choice of ids can make two different inputs produce the same MAC input, and the expiry
  cannot be moved without the secret.
- Verification recomputes the MAC and compares in constant time (:func:`hmac.compare_digest`); it never
  raises on garbage input, it returns ``None``.
- The call id is embedded (not secret, only authenticated) so callbacks that carry no call id of their own
  (``view_update``) can still be checked against the thread they name.
- The expiry is :data:`LIFETIME_S` (30 days) after the start of the UTC day the call was made on (whole
  days, so a re-sent invocation of the same call carries the same URL). A result, sign-in link or question
  must come back within it; the receiver also refuses those once the call is answered, and 30 days is
  how long the answered marker is kept, so the token never outlives the check. Subscription events and
  view updates are not held to the expiry: a subscription may run for months, and replaying its events is
  harmless (they are deduplicated, and ignored once the subscription ends).
- ``v1`` tokens (``v1.<call>.<MAC of ["stepagent-rap-callback/v1", thread, call]>``, no expiry), issued by
  earlier versions to calls still in flight, keep working: threads outlive releases. They get the same
  answered-call check, so a replay after the call finished is refused.

Rotating ``STEPAGENT_CALLBACK_SECRET`` invalidates every outstanding callback URL, including those of
live subscriptions.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

VERSION = "v2"
_DOMAIN = "stepagent-rap-callback/v2"
_DOMAIN_V1 = "stepagent-rap-callback/v1"
#: How long a callback URL is good for results, sign-in links and questions (see the module docstring).
LIFETIME_S = 30 * 86_400
_DAY_S = 86_400


@dataclass(frozen=True, slots=True)
class Grant:
    """What a valid token allows: callbacks for ``tool_call_id`` until ``expires_at`` (``None``: a v1
    token, which has no expiry)."""

    tool_call_id: str
    expires_at: int | None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, *fields: str | int) -> bytes:
    message = json.dumps(list(fields), ensure_ascii=False, separators=(",", ":"))
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).digest()


def expiry_for(now: float) -> int:
    """The expiry of a token issued at ``now``: :data:`LIFETIME_S` after the start of its UTC day."""
    return int(now // _DAY_S) * _DAY_S + LIFETIME_S


def callback_token(secret: str, thread_id: str, tool_call_id: str, *, expires_at: int | None = None) -> str:
    """The token that authorises callbacks for ``tool_call_id`` in ``thread_id`` until ``expires_at``
    (default: :func:`expiry_for` now)."""
    if not secret:
        raise ValueError("the callback secret must not be empty")
    expiry = expiry_for(time.time()) if expires_at is None else int(expires_at)
    mac = _mac(secret, _DOMAIN, thread_id, tool_call_id, expiry)
    return f"{VERSION}.{_b64(tool_call_id.encode())}.{expiry}.{_b64(mac)}"


def verify_token(secret: str, thread_id: str, token: str | None) -> Grant | None:
    """What ``token`` allows, if it is a valid token for ``thread_id`` (expired or not: the caller decides
    which callbacks the expiry applies to); else ``None``."""
    if not secret or not token:
        return None
    parts = token.split(".")
    try:
        if len(parts) == 4 and parts[0] == VERSION and parts[2].isdigit() and len(parts[2]) <= 12:
            tool_call_id, expiry = _unb64(parts[1]).decode(), int(parts[2])
            expected = _mac(secret, _DOMAIN, thread_id, tool_call_id, expiry)
            grant = Grant(tool_call_id, expiry)
        elif len(parts) == 3 and parts[0] == "v1":
            tool_call_id = _unb64(parts[1]).decode()
            expected = _mac(secret, _DOMAIN_V1, thread_id, tool_call_id)
            grant = Grant(tool_call_id, None)
        else:
            return None
        given = _unb64(parts[-1])
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    return grant if hmac.compare_digest(given, expected) else None


def well_formed(token: str | None) -> bool:
    """Whether ``token`` has the shape of a callback token (checked before a request body is read; the
    MAC needs the body's thread id)."""
    if not token or len(token) > 4096:
        return False
    parts = token.split(".")
    return (len(parts) == 4 and parts[0] == VERSION and parts[2].isdigit()) or (
        len(parts) == 3 and parts[0] == "v1"
    )


def callback_url_for(
    base_url: str, secret: str, thread_id: str, tool_call_id: str, *, now: float | None = None
) -> str:
    """``base_url`` with ``token`` added to its query (an existing ``token`` parameter is replaced)."""
    parts = urlsplit(base_url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "token"]
    expiry = expiry_for(time.time() if now is None else now)
    query.append(("token", callback_token(secret, thread_id, tool_call_id, expires_at=expiry)))
    return urlunsplit(parts._replace(query=urlencode(query)))
