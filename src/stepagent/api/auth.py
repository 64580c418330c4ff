"""Who is calling the HTTP API: its settings, bearer-token verification, and local development tokens.

``STEPAGENT_API_AUTH`` = ``jwt`` (the default) or ``none``. With ``jwt`` every request carries
``Authorization: Bearer <JWT>``, verified by PyJWT:

- the signature, RS256 or ES256 only (a token naming any other algorithm — ``none``, ``HS256`` — is
  refused before any key is looked at), against the keys of ``STEPAGENT_JWT_JWKS_URL`` (cached by
  :class:`stepagent.api.jwks.KeyCache`: a token signed by a key it has not seen makes it fetch the set
  again, so a rotated key works at once, at most one refetch per :data:`JWKS_REFETCH_S`; the provider
  failing or hanging answers :class:`~stepagent.api.jwks.ProviderUnavailable`, a 503, never a 401) or the
  PEM public key ``STEPAGENT_JWT_PUBLIC_KEY`` (text or ``@path``; an RSA key under 2048 bits or an EC key
  on a curve other than P-256 is a configuration error);
- the token's ``alg`` must be the algorithm of the key it names (an RS256 token naming an EC key is a 401,
  not a crash), and an RSA key must have at least 2048 bits (RFC 7518 §3.3);
- ``iss`` = ``STEPAGENT_JWT_ISSUER`` and ``aud`` containing ``STEPAGENT_JWT_AUDIENCE`` (both required
  settings, both required claims), ``exp`` required, ``exp``/``nbf``/``iat`` with at most
  :data:`LEEWAY_S` seconds of clock skew;
- the subject is the claim ``STEPAGENT_JWT_OWNER_CLAIM`` (default ``sub``), a non-empty string.

With ``none`` nobody is asked who they are (every caller is :data:`ANONYMOUS`); it is refused unless the
server listens on a loopback address. Any failure is an :class:`Unauthorized` whose message says what was
wrong, never which key would have worked.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from stepagent.api.jwks import FETCH_TIMEOUT_S, MIN_RSA_BITS, KeyCache, KeyNotFound
from stepagent.errors import ConfigurationError

ALGORITHMS = ("RS256", "ES256")
LEEWAY_S = 60
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
    #: Seconds one fetch of the key set may take before the provider counts as unreachable.
    jwks_timeout_s: float = FETCH_TIMEOUT_S

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
        self.jwks = (
            KeyCache(settings.jwks_url, refetch_s=settings.jwks_refetch_s, timeout_s=settings.jwks_timeout_s)
            if settings.jwks_url
            else None
        )
        self._key: Any = None
        self._key_algorithm = ""
        if settings.public_key:
            self._key, self._key_algorithm = _public_key(settings.public_key)

    async def aclose(self) -> None:
        """Stop a key-set fetch in flight."""
        if self.jwks is not None:
            await self.jwks.aclose()

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
        key, algorithm = await self._signing_key(header)
        try:
            claims = jwt.decode(
                token,
                key,
                # Only the key's own algorithm: a token naming another one is refused, never tried.
                algorithms=[algorithm],
                audience=self.settings.audience,
                issuer=self.settings.issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iss", "aud"], "enforce_minimum_key_length": True},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the token has expired") from None
        except jwt.InvalidAudienceError:
            raise Unauthorized("the token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise Unauthorized("the token is from another issuer") from None
        except jwt.InvalidSignatureError:
            raise Unauthorized("the token's signature does not verify") from None
        except jwt.InvalidAlgorithmError:
            raise Unauthorized(f"the token's algorithm is not that of its key ({algorithm})") from None
        except (jwt.PyJWTError, TypeError, ValueError) as error:
            raise Unauthorized(f"the token is not valid: {error}") from None
        subject = claims.get(self.settings.owner_claim)
        if not isinstance(subject, str) or not subject:
            raise Unauthorized(f"the token has no {self.settings.owner_claim!r} claim naming its subject")
        return subject

    async def _signing_key(self, header: dict[str, Any]) -> tuple[Any, str]:
        """The key that must have signed a token with ``header``, and its algorithm."""
        if self.jwks is None:
            return self._key, self._key_algorithm
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise Unauthorized("the token names no signing key (its header has no 'kid')")
        try:
            key = await self.jwks.key(kid)
        except KeyNotFound:
            raise Unauthorized("no signing key of the identity provider has this token's 'kid'") from None
        return key, str(key.algorithm_name)


def _public_key(pem: str) -> tuple[Any, str]:
    """``STEPAGENT_JWT_PUBLIC_KEY`` loaded, with the one algorithm its tokens may use."""
    try:
        key = serialization.load_pem_public_key(pem.encode())
    except ValueError as error:
        raise ConfigurationError(f"STEPAGENT_JWT_PUBLIC_KEY is not a PEM public key: {error}") from None
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise ConfigurationError(
                f"STEPAGENT_JWT_PUBLIC_KEY is an RSA key of {key.key_size} bits: at least {MIN_RSA_BITS} "
                "are required (RFC 7518 section 3.3)"
            )
        return key, "RS256"
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return key, "ES256"
    raise ConfigurationError("STEPAGENT_JWT_PUBLIC_KEY must be an RSA key (RS256) or a P-256 EC key (ES256)")


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
