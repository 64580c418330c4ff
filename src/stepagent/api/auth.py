"""Who is calling the HTTP API: its settings, bearer-token verification, and local development tokens.

``STEPAGENT_API_AUTH`` = ``jwt`` (the default) or ``none``. With ``jwt`` every request carries
``Authorization: Bearer <JWT>``, verified by PyJWT:

- the signature, RS256 or ES256 only (a token naming any other algorithm — ``none``, ``HS256`` — is
  refused before any key is looked at), against the keys of ``STEPAGENT_JWT_JWKS_URL`` (fetched and cached
  by :class:`jwt.PyJWKClient`; a token signed by a key it has not seen makes it fetch the set again, so a
  rotated key works at once, at most one refetch per :data:`JWKS_REFETCH_S`) or the PEM public key
  ``STEPAGENT_JWT_PUBLIC_KEY`` (text or ``@path``);
- ``iss`` = ``STEPAGENT_JWT_ISSUER`` and ``aud`` containing ``STEPAGENT_JWT_AUDIENCE`` (both required
  settings, both required claims), ``exp`` required, ``exp``/``nbf``/``iat`` with at most
  :data:`LEEWAY_S` seconds of clock skew;
- the subject is the claim ``STEPAGENT_JWT_OWNER_CLAIM`` (default ``sub``), a non-empty string.

With ``none`` nobody is asked who they are (every caller is :data:`ANONYMOUS`); it is refused unless the
server listens on a loopback address. Any failure is an :class:`Unauthorized` whose message says what was
wrong, never which key would have worked.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from stepagent.errors import ConfigurationError

ALGORITHMS = ("RS256", "ES256")
LEEWAY_S = 60
JWKS_LIFESPAN_S = 300
JWKS_REFETCH_S = 10.0
ANONYMOUS = "local"
DEV_ISSUER = "stepagent-dev"
DEV_AUDIENCE = "stepagent-api"


class Unauthorized(Exception):
    """The request's credentials were missing or not valid (401)."""


@dataclass(frozen=True, slots=True)
class ApiAuthSettings:
    """The API's auth settings, read once at start."""

    mode: str = "jwt"
    jwks_url: str | None = None
    public_key: str | None = None
    issuer: str | None = None
    audience: str | None = None
    owner_claim: str = "sub"
    #: The shortest pause between two fetches of the key set that a token with an unknown key causes.
    jwks_refetch_s: float = JWKS_REFETCH_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ApiAuthSettings:
        mode = (environ.get("STEPAGENT_API_AUTH") or "jwt").strip().lower()
        if mode not in ("jwt", "none"):
            raise ConfigurationError(f"STEPAGENT_API_AUTH must be 'jwt' or 'none', not {mode!r}")
        key = environ.get("STEPAGENT_JWT_PUBLIC_KEY") or None
        if key is not None and key.startswith("@"):
            key = Path(key[1:]).read_text()
        settings = cls(
            mode=mode,
            jwks_url=environ.get("STEPAGENT_JWT_JWKS_URL") or None,
            public_key=key,
            issuer=environ.get("STEPAGENT_JWT_ISSUER") or None,
            audience=environ.get("STEPAGENT_JWT_AUDIENCE") or None,
            owner_claim=environ.get("STEPAGENT_JWT_OWNER_CLAIM") or "sub",
        )
        settings.check()
        return settings

    def check(self) -> None:
        if self.mode != "jwt":
            return
        if not (self.jwks_url or self.public_key):
            raise ConfigurationError(
                "STEPAGENT_API_AUTH=jwt needs STEPAGENT_JWT_JWKS_URL or STEPAGENT_JWT_PUBLIC_KEY "
                "(or STEPAGENT_API_AUTH=none on a loopback address, or `stepagent api --dev-token`)"
            )
        for name, value in (("STEPAGENT_JWT_ISSUER", self.issuer), ("STEPAGENT_JWT_AUDIENCE", self.audience)):
            if not value:
                raise ConfigurationError(f"STEPAGENT_API_AUTH=jwt needs {name}")


class Verifier:
    """Turns an ``Authorization`` header into the caller's subject (see the module docstring)."""

    def __init__(self, settings: ApiAuthSettings) -> None:
        self.settings = settings
        self._jwks = (
            jwt.PyJWKClient(
                settings.jwks_url,
                lifespan=JWKS_LIFESPAN_S,
                cooldown_duration=settings.jwks_refetch_s,
                timeout=10,
            )
            if settings.jwks_url
            else None
        )
        self._key: Any = (
            serialization.load_pem_public_key(settings.public_key.encode()) if settings.public_key else None
        )

    async def subject(self, authorization: str | None) -> str:
        """The caller's subject; :class:`Unauthorized` when the credentials do not hold."""
        if self.settings.mode == "none":
            return ANONYMOUS
        if not authorization:
            raise Unauthorized("this API needs an 'Authorization: Bearer <token>' header")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        token = token.strip()
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as error:
            raise Unauthorized(f"the bearer token is not a JWT: {error}") from None
        if header.get("alg") not in ALGORITHMS:
            raise Unauthorized(f"the token's algorithm must be one of {', '.join(ALGORITHMS)}")
        key = await self._signing_key(token)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=list(ALGORITHMS),
                audience=self.settings.audience,
                issuer=self.settings.issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the token has expired") from None
        except jwt.InvalidAudienceError:
            raise Unauthorized("the token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise Unauthorized("the token is from another issuer") from None
        except jwt.InvalidSignatureError:
            raise Unauthorized("the token's signature does not verify") from None
        except jwt.PyJWTError as error:
            raise Unauthorized(f"the token is not valid: {error}") from None
        subject = claims.get(self.settings.owner_claim)
        if not isinstance(subject, str) or not subject:
            raise Unauthorized(f"the token has no {self.settings.owner_claim!r} claim naming its subject")
        return subject

    async def _signing_key(self, token: str) -> Any:
        if self._jwks is None:
            return self._key
        jwks = self._jwks
        try:
            # PyJWKClient fetches with urllib (blocking): off the event loop.
            return (await asyncio.to_thread(jwks.get_signing_key_from_jwt, token)).key
        except jwt.PyJWKClientConnectionError as error:
            raise Unauthorized(f"the signing keys could not be fetched: {error}") from None
        except jwt.PyJWTError as error:
            raise Unauthorized(f"no signing key for this token: {error}") from None


@dataclass(frozen=True, slots=True)
class DevAuth:
    """A signing key made for one local server (``stepagent api --dev-token``): its settings and tokens."""

    private_pem: bytes
    public_pem: str

    @classmethod
    def generate(cls) -> DevAuth:
        private = ec.generate_private_key(ec.SECP256R1())
        private_pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        public_pem = (
            private.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )
        return cls(private_pem, public_pem)

    @property
    def settings(self) -> ApiAuthSettings:
        return ApiAuthSettings(
            mode="jwt", public_key=self.public_pem, issuer=DEV_ISSUER, audience=DEV_AUDIENCE
        )

    def token(self, subject: str = "dev", lifetime_s: int = 12 * 3600) -> str:
        now = int(time.time())
        claims = {
            "sub": subject,
            "iss": DEV_ISSUER,
            "aud": DEV_AUDIENCE,
            "iat": now,
            "exp": now + lifetime_s,
            "jti": str(uuid.uuid4()),
        }
        return jwt.encode(claims, self.private_pem, algorithm="ES256")
