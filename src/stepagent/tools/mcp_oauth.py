"""Per-user OAuth for MCP servers (``"auth": "oauth"``), split so a queue can wait for the person.

The flow is the MCP authorization flow, built from the ``mcp`` SDK's pieces over ``httpx2``: discovery
(the 401's ``WWW-Authenticate`` ``resource_metadata`` → protected-resource metadata → authorization-server
metadata, with the SDK's fallback URLs), dynamic client registration or the configured ``client_id``,
PKCE (S256) and a random single-use ``state``. It is cut in two at the browser:

- :func:`begin_sign_in` (the tool runner, on a call for owner O with no usable token or a 401) keeps a
  :class:`PendingSignIn` under the state (sealed, one hour) and returns the authorization URL. The
  runner sends the thread an ``oauth_required`` notice and ends the run: nothing waits.
- :func:`complete_sign_in` (the API's ``GET /v1/oauth/callback``) finds the pending sign-in by its
  state, exchanges the code with the PKCE verifier, stores the tokens, and sends the thread the
  :class:`~stepagent.messages.OAuthComplete` input that re-dispatches the waiting call through the
  thread's outbox (``core/sign_in.py``). Its steps are recorded on the pending sign-in (``exchanged``,
  then ``resumed``), so a retried callback after a crash finishes the same sign-in and a replayed one
  is refused; the resume message's id is fixed per sign-in round, so the call is resumed at most once.

What it guarantees:

- **Tokens per owner and server, sealed at rest.** The owner is the thread tree's user (the root
  metadata's ``user_id``, which the HTTP API sets from the JWT subject), else the root thread id
  (:func:`owner_of`). Tokens, client registrations and pending sign-ins are kept in the state store's
  key/value cache, sealed by a :class:`~stepagent.tools.token_cipher.Cipher` under their own key (KMS in
  AWS, AES-GCM locally); the keys are digests, so neither a user id nor a state appears in one.
- **Refreshed before use.** An expired access token is refreshed (``refresh_token`` grant) before the
  call; a refresh that fails, or a 401 to a token, drops the tokens and asks the person again.
- **Never shown.** Nothing here logs, returns or sends a token; only the authorization URL (which holds
  no secret but the single-use state) and the server's name leave this module.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import urlencode, urljoin, urlparse

from stepagent.messages import InputMessage, OAuthComplete
from stepagent.tools.mcp_config import McpServer
from stepagent.tools.token_cipher import Cipher, SealBroken

log = logging.getLogger(__name__)

#: Where the HTTP API receives the browser's redirect (appended to its public base URL).
CALLBACK_PATH = "/v1/oauth/callback"
#: How long a sign-in may take before its link stops working.
SIGN_IN_TTL_S = 3600.0
#: How long unused tokens and client registrations are kept.
GRANT_TTL_S = 180 * 24 * 3600.0
#: An access token this close to its expiry is refreshed first (seconds).
EXPIRY_MARGIN_S = 30.0


class KeyValue(Protocol):
    """The state store's key/value cache (``StateStore.cache_get`` / ``cache_put``)."""

    async def cache_get(self, key: str) -> str | None: ...

    async def cache_put(self, key: str, value: str, expires_at: float) -> None: ...


class SignInError(Exception):
    """A sign-in that cannot go on; the message is written for the person (or the model)."""


class SignInRefused(SignInError):
    """The callback's request is not a sign-in this deployment is waiting for (a 400)."""


@dataclass(frozen=True, slots=True)
class OAuthServices:
    """What the flow needs: the key/value store, the cipher, the redirect URI (the API's public base URL
    + :data:`CALLBACK_PATH`; ``None``: sign-ins cannot be offered), a clock, the HTTP timeout."""

    store: KeyValue
    cipher: Cipher
    redirect_uri: str | None
    clock: Callable[[], float] = time.time
    http_timeout: float = 30.0


def redirect_uri_of(api_url: str | None) -> str | None:
    """The callback URL of the API whose public base URL is ``api_url``."""
    return None if not api_url else api_url.rstrip("/") + CALLBACK_PATH


def owner_of(user_id: str | None, thread_stack: Sequence[str]) -> str:
    """Whose tokens a call uses: the tree's user, else its root thread."""
    return user_id if user_id else f"thread:{thread_stack[0]}"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:40]


def _server_id(server: McpServer) -> str:
    return _digest(server.name, str(server.url))


def token_key(server: McpServer, owner: str) -> str:
    """Where ``owner``'s sealed tokens for ``server`` are kept (a digest: no user id in the key)."""
    return f"mcp-oauth-token#{_digest(_server_id(server), owner)}"


def sign_in_key(state: str) -> str:
    """Where the pending sign-in of ``state`` is kept (a digest: the state itself is never stored)."""
    return f"mcp-oauth-sign-in#{_digest(state)}"


def call_key(thread_id: str, tool_call_id: str) -> str:
    """How many sign-ins of call ``tool_call_id`` have completed (the next round is one more)."""
    return f"mcp-oauth-call#{thread_id}#{tool_call_id}"


def _client_key(server: McpServer, issuer: str, redirect_uri: str) -> str:
    return f"mcp-oauth-client#{_digest(_server_id(server), issuer, redirect_uri)}"


# ---- kept values ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Grant:
    """A user's tokens for one server, with what a refresh needs."""

    token: Any  # mcp.shared.auth.OAuthToken
    expires_at: float | None
    client: Any  # mcp.shared.auth.OAuthClientInformationFull
    token_endpoint: str
    resource: str | None

    def to_json(self) -> str:
        return json.dumps(
            {
                "token": self.token.model_dump(mode="json", exclude_none=True),
                "expires_at": self.expires_at,
                "client": self.client.model_dump(mode="json", exclude_none=True),
                "token_endpoint": self.token_endpoint,
                "resource": self.resource,
            }
        )

    @classmethod
    def from_json(cls, raw: str) -> Grant:
        from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

        value = json.loads(raw)
        return cls(
            token=OAuthToken.model_validate(value["token"]),
            expires_at=value.get("expires_at"),
            client=OAuthClientInformationFull.model_validate(value["client"]),
            token_endpoint=value["token_endpoint"],
            resource=value.get("resource"),
        )


@dataclass(slots=True)
class PendingSignIn:
    """A sign-in the person has been sent to: everything the callback needs to finish it."""

    verifier: str
    owner: str
    server: str
    server_url: str
    thread_id: str
    tool_call_id: str
    call_id: str | None
    redirect_uri: str
    round: int
    client: dict[str, Any]
    token_endpoint: str
    resource: str | None
    resume: dict[str, Any] | None = None
    status: Literal["pending", "exchanged", "resumed"] = "pending"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({name: getattr(self, name) for name in self.__dataclass_fields__})

    @classmethod
    def from_json(cls, raw: str) -> PendingSignIn:
        value = json.loads(raw)
        return cls(**{name: value[name] for name in cls.__dataclass_fields__ if name in value})


async def _put_sealed(services: OAuthServices, key: str, plaintext: str, ttl: float) -> None:
    sealed = await services.cipher.seal(plaintext.encode(), key)
    await services.store.cache_put(key, sealed, time.time() + ttl)


async def _get_sealed(services: OAuthServices, key: str) -> str | None:
    raw = await services.store.cache_get(key)
    if not raw:
        return None
    try:
        return (await services.cipher.open(raw, key)).decode()
    except SealBroken:
        log.warning("a kept OAuth value does not open with this deployment's key; it is ignored")
        return None


async def _drop(services: OAuthServices, key: str) -> None:
    await services.store.cache_put(key, "", time.time())


# ---- tokens --------------------------------------------------------------------------------------------------


async def usable_token(services: OAuthServices, server: McpServer, owner: str) -> str | None:
    """``owner``'s access token for ``server``, refreshed first when it has expired; ``None`` when there
    is none or the refresh failed (the tokens are dropped: the person signs in again)."""
    key = token_key(server, owner)
    raw = await _get_sealed(services, key)
    if raw is None:
        return None
    grant = Grant.from_json(raw)
    if grant.expires_at is None or services.clock() < grant.expires_at - EXPIRY_MARGIN_S:
        return str(grant.token.access_token)
    if not grant.token.refresh_token:
        await _drop(services, key)
        return None
    refreshed = await _refresh(services, server, grant)
    if refreshed is None:
        await _drop(services, key)
        return None
    await _put_sealed(services, key, refreshed.to_json(), GRANT_TTL_S)
    return str(refreshed.token.access_token)


async def drop_tokens(services: OAuthServices, server: McpServer, owner: str) -> None:
    """Forget ``owner``'s tokens for ``server`` (the server refused them)."""
    await _drop(services, token_key(server, owner))


def _token_auth(client: Any, data: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The token request's client authentication, as the SDK's flow adds it."""
    from mcp.client.auth.oauth2 import OAuthContext
    from mcp.shared.auth import OAuthClientMetadata

    context = OAuthContext(
        server_url="",
        client_metadata=OAuthClientMetadata(redirect_uris=None),
        storage=None,  # type: ignore[arg-type]  # only prepare_token_auth is used
        redirect_handler=None,
        callback_handler=None,
    )
    context.client_info = client
    return context.prepare_token_auth(data, {"Content-Type": "application/x-www-form-urlencoded"})


async def _token_request(services: OAuthServices, url: str, client: Any, data: dict[str, str]) -> Any:
    """POST a token request; the SDK's ``OAuthToken``, or ``None`` when the server refused it."""
    import httpx2
    from mcp.client.auth.utils import handle_token_response_scopes

    body, headers = _token_auth(client, data)
    async with httpx2.AsyncClient(timeout=services.http_timeout) as http:
        response = await http.post(url, data=body, headers=headers)
        if response.status_code not in (200, 201):
            await response.aread()
            log.warning(
                "the token endpoint refused a %s request (%s)", data["grant_type"], response.status_code
            )
            return None
        return await handle_token_response_scopes(response)


async def _refresh(services: OAuthServices, server: McpServer, grant: Grant) -> Grant | None:
    data = {
        "grant_type": "refresh_token",
        "refresh_token": str(grant.token.refresh_token),
        "client_id": str(grant.client.client_id),
    }
    if grant.resource:
        data["resource"] = grant.resource
    try:
        token = await _token_request(services, grant.token_endpoint, grant.client, data)
    except Exception as error:  # the authorization server is unreachable or answers nonsense
        log.warning("refreshing a token for MCP server %r failed: %s", server.name, type(error).__name__)
        return None
    if token is None:
        return None
    if token.refresh_token is None:  # RFC 6749 §6: the server may keep the old refresh token
        token.refresh_token = grant.token.refresh_token
    return Grant(token, _expiry(services, token), grant.client, grant.token_endpoint, grant.resource)


def _expiry(services: OAuthServices, token: Any) -> float | None:
    return None if token.expires_in is None else services.clock() + float(token.expires_in)


# ---- the first half: the tool runner sends the person to sign in ---------------------------------------------


async def next_round(services: OAuthServices, thread_id: str, tool_call_id: str) -> int:
    """The number of this call's next sign-in (the same for a redelivered run of the same dispatch)."""
    raw = await services.store.cache_get(call_key(thread_id, tool_call_id))
    return (int(json.loads(raw)["done"]) if raw else 0) + 1


async def _discover(http: Any, server: McpServer, challenge: str | None) -> tuple[Any, Any]:
    """(protected-resource metadata or ``None``, authorization-server metadata or ``None``)."""
    import httpx2
    from mcp.client.auth.utils import (
        build_oauth_authorization_server_metadata_discovery_urls,
        build_protected_resource_metadata_discovery_urls,
        create_oauth_metadata_request,
        extract_resource_metadata_from_www_auth,
        handle_auth_metadata_response,
        handle_protected_resource_response,
    )

    url = str(server.url)
    hint = None
    if challenge:
        hint = extract_resource_metadata_from_www_auth(
            httpx2.Response(401, headers={"WWW-Authenticate": challenge})
        )
    prm = None
    for candidate in build_protected_resource_metadata_discovery_urls(hint, url):
        prm = await handle_protected_resource_response(
            await http.send(create_oauth_metadata_request(candidate))
        )
        if prm is not None:
            break
    issuer = str(prm.authorization_servers[0]) if prm is not None and prm.authorization_servers else None
    asm = None
    for candidate in build_oauth_authorization_server_metadata_discovery_urls(issuer, url):
        go_on, asm = await handle_auth_metadata_response(
            await http.send(create_oauth_metadata_request(candidate))
        )
        if asm is not None or not go_on:
            break
    return prm, asm


def _resource(server: McpServer, prm: Any) -> str:
    from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url

    resource = resource_url_from_server_url(str(server.url))
    if prm is not None and prm.resource is not None:
        advertised = str(prm.resource)
        if check_resource_allowed(requested_resource=resource, configured_resource=advertised):
            resource = advertised
    return resource


async def _client(
    services: OAuthServices, http: Any, server: McpServer, asm: Any, scope: str | None, redirect_uri: str
) -> Any:
    """The configured client, a registration kept from an earlier sign-in, or a new registration."""
    from mcp.client.auth.utils import create_client_registration_request, handle_registration_response
    from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata

    if server.client_id is not None:
        return OAuthClientInformationFull(
            client_id=server.client_id, redirect_uris=[redirect_uri], token_endpoint_auth_method="none"
        )
    issuer = str(asm.issuer) if asm is not None else str(server.url)
    key = _client_key(server, issuer, redirect_uri)
    kept = await _get_sealed(services, key)
    if kept is not None:
        return OAuthClientInformationFull.model_validate_json(kept)
    metadata = OAuthClientMetadata(
        redirect_uris=[redirect_uri],
        client_name="stepagent",
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",
        scope=scope,
    )
    parsed = urlparse(str(server.url))
    request = create_client_registration_request(asm, metadata, f"{parsed.scheme}://{parsed.netloc}")
    client = await handle_registration_response(await http.send(request))
    await _put_sealed(services, key, client.model_dump_json(exclude_none=True), GRANT_TTL_S)
    return client


async def begin_sign_in(
    services: OAuthServices,
    server: McpServer,
    owner: str,
    *,
    thread_id: str,
    tool_call_id: str,
    call_id: str | None,
    round_no: int,
    challenge: str | None,
    resume: Mapping[str, Any] | None,
) -> str:
    """Prepare a sign-in (see the module docstring) and return the URL the person opens."""
    import httpx2
    from mcp.client.auth.oauth2 import PKCEParameters
    from mcp.client.auth.utils import get_client_metadata_scopes

    redirect_uri = services.redirect_uri
    if redirect_uri is None:
        raise SignInError(
            f"MCP server '{server.name}' needs the user to sign in, but no callback URL is configured "
            "(set STEPAGENT_API_URL to the HTTP API's public base URL)"
        )
    async with httpx2.AsyncClient(timeout=services.http_timeout) as http:
        prm, asm = await _discover(http, server, challenge)
        scope = " ".join(server.scopes) if server.scopes else None
        if scope is None:
            hint = None
            if challenge:
                from mcp.client.auth.utils import extract_scope_from_www_auth

                hint = extract_scope_from_www_auth(
                    httpx2.Response(401, headers={"WWW-Authenticate": challenge})
                )
            scope = get_client_metadata_scopes(hint, prm, asm)
        client = await _client(services, http, server, asm, scope, redirect_uri)
    parsed = urlparse(str(server.url))
    base = f"{parsed.scheme}://{parsed.netloc}"
    authorize = str(asm.authorization_endpoint) if asm is not None else urljoin(base, "/authorize")
    token_endpoint = str(asm.token_endpoint) if asm is not None else urljoin(base, "/token")
    resource = _resource(server, prm)
    pkce = PKCEParameters.generate()
    state = secrets.token_urlsafe(32)
    params = {
        "response_type": "code",
        "client_id": str(client.client_id),
        "redirect_uri": redirect_uri,
        "state": state,
        "code_challenge": pkce.code_challenge,
        "code_challenge_method": "S256",
        "resource": resource,
    }
    if scope:
        params["scope"] = scope
    pending = PendingSignIn(
        verifier=pkce.code_verifier,
        owner=owner,
        server=server.name,
        server_url=str(server.url),
        thread_id=thread_id,
        tool_call_id=tool_call_id,
        call_id=call_id,
        redirect_uri=redirect_uri,
        round=round_no,
        client=client.model_dump(mode="json", exclude_none=True),
        token_endpoint=token_endpoint,
        resource=resource,
        resume=dict(resume) if resume is not None else None,
    )
    await _put_sealed(services, sign_in_key(state), pending.to_json(), SIGN_IN_TTL_S)
    return f"{authorize}?{urlencode(params)}"


# ---- the second half: the API's callback ---------------------------------------------------------------------


Send = Callable[[InputMessage, str], Awaitable[None]]


def resume_id(pending: PendingSignIn) -> str:
    """The logical id of the message that resumes the call: one per call and round, whichever link of
    that round the person used and however often the callback is retried."""
    return f"{pending.tool_call_id}-signed-in-{pending.round}"


async def complete_sign_in(
    services: OAuthServices,
    state: str | None,
    code: str | None,
    error: str | None,
    send: Send,
) -> tuple[str, bool]:
    """Finish the sign-in ``state`` names and resume its call: ``(server name, signed in?)``. Raises
    :class:`SignInRefused` for an unknown, expired or used state, :class:`SignInError` when the code
    does not exchange."""
    from mcp.shared.auth import OAuthClientInformationFull

    if not state:
        raise SignInRefused("the sign-in link is incomplete: it has no 'state'")
    key = sign_in_key(state)
    raw = await _get_sealed(services, key)
    if raw is None:
        raise SignInRefused("this sign-in is unknown or has expired; ask the agent again")
    pending = PendingSignIn.from_json(raw)
    if pending.status == "resumed":
        raise SignInRefused(f"this sign-in to {pending.server} was already used")
    signed_in = error is None
    if signed_in and pending.status == "pending":
        if not code:
            raise SignInRefused("the sign-in link is incomplete: it has no 'code'")
        client = OAuthClientInformationFull.model_validate(pending.client)
        data = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": pending.redirect_uri,
            "client_id": str(client.client_id),
            "code_verifier": pending.verifier,
        }
        if pending.resource:
            data["resource"] = pending.resource
        token = await _token_request(services, pending.token_endpoint, client, data)
        if token is None:
            raise SignInError(f"{pending.server} did not accept the sign-in; ask the agent again")
        grant = Grant(token, _expiry(services, token), client, pending.token_endpoint, pending.resource)
        server = McpServer(name=pending.server, url=pending.server_url)
        await _put_sealed(services, token_key(server, pending.owner), grant.to_json(), GRANT_TTL_S)
        pending.status = "exchanged"
        await _put_sealed(services, key, pending.to_json(), SIGN_IN_TTL_S)
    done = json.dumps({"done": pending.round})
    await services.store.cache_put(
        call_key(pending.thread_id, pending.tool_call_id), done, time.time() + GRANT_TTL_S
    )
    message = InputMessage(
        content=OAuthComplete(
            tool_call_id=pending.tool_call_id,
            outcome="signed_in" if signed_in else "declined",
            server=pending.server,
            round=pending.round,
            resume=pending.resume,
        ),
        group_id=pending.thread_id,
        id=resume_id(pending),
    )
    await send(message, resume_id(pending))
    pending.status = "resumed"
    await _put_sealed(services, key, pending.to_json(), SIGN_IN_TTL_S)
    return pending.server, signed_in
