"""Shared by the HTTP API tests: signing keys, a JWKS endpoint on loopback, an SSE reader, the API on a
deployment-shaped stack."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from stepagent.api.auth import ApiAuthSettings
from stepagent.api.server import open_api
from stepagent.client import Client
from stepagent.tools.base import Tool
from tests.client.deployment import Deployment, deployment

ISSUER = "https://issuer.test"
AUDIENCE = "chat-app"


@dataclass
class Key:
    kid: str
    alg: str
    private: Any

    def jwk(self) -> dict[str, Any]:
        algorithm = jwt.algorithms.RSAAlgorithm if self.alg == "RS256" else jwt.algorithms.ECAlgorithm
        data: dict[str, Any] = json.loads(algorithm.to_jwk(self.private.public_key()))
        return {**data, "kid": self.kid, "alg": self.alg, "use": "sig"}

    def token(self, sub: str = "alice", **claims: Any) -> str:
        now = int(time.time())
        body = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600, **claims}
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, self.private, algorithm=self.alg, headers={"kid": self.kid})

    def pem(self) -> str:
        return (
            self.private.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )


def rsa_key(kid: str) -> Key:
    return Key(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))


def ec_key(kid: str) -> Key:
    return Key(kid, "ES256", ec.generate_private_key(ec.SECP256R1()))


@dataclass
class Jwks:
    """A JWKS endpoint on loopback whose keys a test can rotate; counts its fetches."""

    keys: list[Key]
    url: str = ""
    fetches: int = 0


@contextmanager
def jwks_server(keys: list[Key]) -> Iterator[Jwks]:
    jwks = Jwks(list(keys))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            jwks.fetches += 1
            body = json.dumps({"keys": [k.jwk() for k in jwks.keys]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    jwks.url = f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
    try:
        yield jwks
    finally:
        server.shutdown()
        server.server_close()


def jwt_settings(jwks_url: str) -> ApiAuthSettings:
    # No pause between key-set fetches: the rotation test needs the refetch at once.
    return ApiAuthSettings(mode="jwt", jwks_url=jwks_url, issuer=ISSUER, audience=AUDIENCE, jwks_refetch_s=0)


@dataclass
class Sse:
    """One parsed Server-Sent Event (``event``, ``id``, ``data`` as JSON) or a comment."""

    event: str | None = None
    id: str | None = None
    data: Any = None
    comment: str | None = None


@dataclass
class SseParser:
    buffer: str = ""
    events: list[Sse] = field(default_factory=list)

    def feed(self, text: str) -> list[Sse]:
        self.buffer += text
        out = []
        while "\n\n" in self.buffer:
            block, self.buffer = self.buffer.split("\n\n", 1)
            sse = Sse()
            data = []
            for line in block.split("\n"):
                if line.startswith(":"):
                    sse.comment = line[1:].strip()
                elif line.startswith("event:"):
                    sse.event = line[6:].strip()
                elif line.startswith("id:"):
                    sse.id = line[3:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
            if data:
                sse.data = json.loads("\n".join(data))
            out.append(sse)
        self.events.extend(out)
        return out


@dataclass
class ApiStack:
    deployment: Deployment
    client: Client
    url: str
    http: httpx.AsyncClient


@asynccontextmanager
async def api_stack(
    model: Any, auth: ApiAuthSettings, *, tools: Sequence[Tool] | None = None, **options: Any
) -> AsyncIterator[ApiStack]:
    """A deployment running ``model`` (with ``tools``), the API on a loopback port over it (``options``:
    :func:`open_api`'s), and an HTTP client."""
    async with AsyncExitStack() as stack:
        d = await stack.enter_async_context(deployment(model, tools=tools))
        client = await stack.enter_async_context(Client(d.settings, poll_interval=0.05))
        url = await stack.enter_async_context(open_api(client, auth, port=0, **options))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        yield ApiStack(d, client, url, http)


def new_thread(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
