"""The API's own HMAC keys: what signs resume tokens and mints thread ids.

Every API instance of a deployment must hold the same keys (a stream resumed on another instance must
verify its token there), so they are derived from a secret the deployment already shares,
``STEPAGENT_CALLBACK_SECRET`` (or the secret ``STEPAGENT_CALLBACK_SECRET_ID`` names), with one HMAC-SHA256
per purpose and a label naming it (domain separation: a resume-token signature can never serve as an RAP
callback token, a minted id, or the other way round). The secret itself is never used as a key.

A process with no secret configured (``stepagent api`` or ``stepagent run --api`` on a laptop) makes random
keys of its own: its resume tokens are then valid only until it restarts. The Lambda app never does that:
it refuses to start without the secret (:func:`keys_for`, ``required``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from stepagent.aws.clients import aws_session
from stepagent.aws.secrets import read_secret
from stepagent.aws.settings import Settings
from stepagent.errors import ConfigurationError

_RESUME_LABEL = b"stepagent/api/resume-token/v1"
_THREAD_ID_LABEL = b"stepagent/api/thread-id/v1"


@dataclass(frozen=True, slots=True)
class ApiKeys:
    """The keys of one deployment's API (never logged, never sent)."""

    #: Signs resume tokens (the SSE ``id:``), so a client cannot name threads or positions of its own.
    resume: bytes
    #: Derives the thread id ``POST /v1/threads`` mints for an ``Idempotency-Key`` (so a retry gets the
    #: same id, and nobody without the key can compute it).
    thread_ids: bytes

    @classmethod
    def from_secret(cls, secret: str) -> ApiKeys:
        root = secret.encode()
        return cls(
            resume=hmac.new(root, _RESUME_LABEL, hashlib.sha256).digest(),
            thread_ids=hmac.new(root, _THREAD_ID_LABEL, hashlib.sha256).digest(),
        )

    @classmethod
    def generate(cls) -> ApiKeys:
        """Keys for this process only (a local server without a configured secret)."""
        return cls.from_secret(secrets.token_hex(32))

    def __repr__(self) -> str:
        return "ApiKeys(<hidden>)"


async def keys_for(settings: Settings, *, required: bool) -> ApiKeys:
    """The keys of ``settings``' callback secret (read from its id if need be); without one, random keys
    for this process, or a :class:`~stepagent.errors.ConfigurationError` when ``required``."""
    secret = settings.callback_secret
    if secret is None and settings.callback_secret_id:
        secret = await read_secret(
            settings, aws_session(settings), "STEPAGENT_CALLBACK_SECRET_ID", settings.callback_secret_id
        )
    if secret:
        return ApiKeys.from_secret(secret)
    if required:
        raise ConfigurationError(
            "the HTTP API needs STEPAGENT_CALLBACK_SECRET or STEPAGENT_CALLBACK_SECRET_ID: it signs the "
            "resume tokens of event streams with a key derived from it, the same on every instance"
        )
    return ApiKeys.generate()
