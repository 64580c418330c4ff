"""An OAuth-protected MCP server you can run next to stepagent: its own authorization server (dynamic
client registration, PKCE, refresh tokens, revocation) and a streamable-HTTP MCP endpoint, built with the
``mcp`` SDK's server-side auth (``mcp.server.auth``).

Run it::

    python examples/oauth_mcp_server.py --port 8765

and point stepagent at it::

    STEPAGENT_MCP_SERVERS='[{"name": "notes", "url": "http://127.0.0.1:8765/mcp", "auth": "oauth"}]'

Its tool ``my_notes`` answers with the notes of whoever signed in. The sign-in page is automatic: it
signs the person in as ``--user`` (``alice`` by default) and sends the browser straight back to
stepagent's callback; ``--deny`` makes it answer ``access_denied`` instead, as a person refusing would.

Listing the tools needs no sign-in (stepagent lists them once at start, before any user is known); every
``tools/call`` needs a user's access token, and without one the server answers 401 with
``WWW-Authenticate: Bearer resource_metadata=...``, which starts the discovery.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.middleware.bearer_auth import RequireAuthMiddleware
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.applications import Starlette

NOTES = {"alice": ["buy milk", "call Bob"], "bob": ["fix the roof"]}


@dataclass
class NotesAuthority:
    """An in-memory authorization server: who signs in (``user``), whether they consent (``consent``),
    how long an access token lives (``token_ttl`` seconds), and every code and token it issued."""

    user: str = "alice"
    consent: bool = True
    token_ttl: int = 3600
    clients: dict[str, OAuthClientInformationFull] = field(default_factory=dict)
    codes: dict[str, AuthorizationCode] = field(default_factory=dict)
    access: dict[str, AccessToken] = field(default_factory=dict)
    refresh: dict[str, RefreshToken] = field(default_factory=dict)
    #: Grants made at the token endpoint: ``authorization_code`` / ``refresh_token``, in order.
    grants: list[str] = field(default_factory=list)
    #: Every access and refresh token ever issued (revoked and rotated ones too).
    issued: list[str] = field(default_factory=list)

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        # The "login page": the person is ``self.user`` and answers at once.
        if not self.consent:
            return construct_redirect_uri(str(params.redirect_uri), error="access_denied", state=params.state)
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or ["notes"],
            expires_at=time.time() + 300,
            client_id=str(client.client_id),
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
            subject=self.user,
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    def _issue(
        self, client_id: str, scopes: list[str], subject: str | None, resource: str | None
    ) -> OAuthToken:
        access, refresh = "at-" + secrets.token_urlsafe(24), "rt-" + secrets.token_urlsafe(24)
        self.issued += [access, refresh]
        expires = int(time.time()) + self.token_ttl
        self.access[access] = AccessToken(
            token=access,
            client_id=client_id,
            scopes=scopes,
            expires_at=expires,
            resource=resource,
            subject=subject,
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource, subject=subject
        )
        return OAuthToken(
            access_token=access,
            token_type="Bearer",
            expires_in=self.token_ttl,
            refresh_token=refresh,
            scope=" ".join(scopes),
        )

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)  # single use
        self.grants.append("authorization_code")
        return self._issue(
            str(client.client_id),
            authorization_code.scopes,
            authorization_code.subject,
            authorization_code.resource,
        )

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        self.refresh.pop(refresh_token.token, None)  # rotated
        self.grants.append("refresh_token")
        return self._issue(
            str(client.client_id),
            scopes or refresh_token.scopes,
            refresh_token.subject,
            refresh_token.resource,
        )

    async def load_access_token(self, token: str) -> AccessToken | None:
        return self.access.get(token)

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def revoke_all(self) -> None:
        """Every token issued so far stops working (a person disconnecting the app, an admin's revocation)."""
        self.access.clear()
        self.refresh.clear()

    def expire_access_tokens(self) -> None:
        """Every access token issued so far has expired (refresh tokens still work)."""
        for token in self.access.values():
            token.expires_at = 0


class ListWithoutSignIn:
    """ASGI: the MCP endpoint's ``tools/call`` needs a bearer token (the SDK's ``RequireAuthMiddleware``);
    every other request (discovery, handshake, ``tools/list``) reaches the server without one."""

    def __init__(self, protected: RequireAuthMiddleware) -> None:
        self.protected = protected
        self.open = protected.app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.open(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        try:
            method = json.loads(body).get("method")
        except (ValueError, AttributeError):
            method = None
        target = self.protected if method == "tools/call" else self.open
        await target(scope, replay, send)


def build(base_url: str, authority: NotesAuthority | None = None) -> tuple[Starlette, NotesAuthority]:
    """The server's ASGI app for ``base_url`` (where it is reached, e.g. ``http://127.0.0.1:8765``)."""
    authority = authority or NotesAuthority()
    server = MCPServer(
        "notes",
        auth_server_provider=authority,
        auth=AuthSettings(
            issuer_url=base_url,  # type: ignore[arg-type]
            resource_server_url=f"{base_url}/mcp",  # type: ignore[arg-type]
            client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=["notes"]),
            revocation_options=RevocationOptions(enabled=True),
            validate_token_resource=False,
        ),
    )

    @server.tool()
    def my_notes() -> str:
        """The signed-in user's notes."""
        token = get_access_token()
        subject = token.subject if token is not None else None
        return f"notes of {subject}: " + "; ".join(NOTES.get(str(subject), []))

    app = server.streamable_http_app()
    for route in app.router.routes:
        endpoint = getattr(route, "endpoint", None)
        if isinstance(endpoint, RequireAuthMiddleware):
            route.app = ListWithoutSignIn(endpoint)  # type: ignore[attr-defined]
    return app, authority


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--user", default="alice", help="who signs in (alice or bob)")
    parser.add_argument("--deny", action="store_true", help="answer every sign-in with access_denied")
    args = parser.parse_args()
    app, _ = build(f"http://127.0.0.1:{args.port}", NotesAuthority(user=args.user, consent=not args.deny))
    uvicorn.run(app, host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
