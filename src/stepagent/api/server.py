"""Serving the HTTP API with uvicorn: ``stepagent api`` and ``stepagent run --api``.

:func:`open_api` serves on this event loop until the context exits and yields the URL. Without
authentication (``STEPAGENT_API_AUTH=none``) it refuses to listen on anything but a loopback address.
With ``dev_token`` it makes a signing key for this process only, accepts the tokens it signs (and only
those) and prints one — for trying the API and the chat page locally. The resume-token keys come from the
callback secret when one is configured (:mod:`stepagent.api.keys`), else are made for this process; the
metadata policy (``STEPAGENT_API_PROFILES``) is read from the environment by :func:`serve_api`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
from collections.abc import AsyncIterator, Mapping

from stepagent.api import DEFAULT_PORT
from stepagent.api.app import ApiState, build_app
from stepagent.api.auth import ApiAuthSettings, DevAuth, Verifier
from stepagent.api.keys import ApiKeys, keys_for
from stepagent.api.policy import ApiPolicy
from stepagent.api.quotas import ApiLimits
from stepagent.client import Client
from stepagent.errors import ConfigurationError
from stepagent.rap.server import is_loopback, serve_in_background
from stepagent.tools.mcp_oauth import OAuthServices

__all__ = ["DEFAULT_PORT", "auth_settings", "is_loopback", "open_api", "serve_api"]


def auth_settings(host: str, environ: Mapping[str, str] | None = None) -> ApiAuthSettings:
    """The auth settings of the environment, refused when they leave a non-loopback bind open."""
    settings = ApiAuthSettings.from_env(os.environ if environ is None else environ)
    if settings.mode == "none" and not is_loopback(host):
        raise ConfigurationError(
            f"STEPAGENT_API_AUTH=none serves everyone's conversations to anyone: it is allowed only on a "
            f"loopback address, not {host} (set STEPAGENT_API_AUTH=jwt and the STEPAGENT_JWT_* settings)"
        )
    return settings


@contextlib.asynccontextmanager
async def open_api(
    api_client: Client,
    auth: ApiAuthSettings,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    heartbeat_s: float | None = None,
    max_streams: int | None = None,
    keys: ApiKeys | None = None,
    policy: ApiPolicy | None = None,
    limits: ApiLimits | None = None,
    oauth: OAuthServices | None = None,
) -> AsyncIterator[str]:
    """Serve the API over the open ``api_client`` on ``host:port`` (0: a free port); yields its URL.
    ``policy`` defaults to none (no profile selectable), ``keys`` to those of the client's settings,
    ``limits`` (the per-subject quotas) to the environment's; ``max_streams`` overrides theirs. ``oauth``
    (MCP sign-ins' callback) defaults to what the client's settings configure (a KMS key or a state
    directory; neither: the callback says sign-ins are not configured)."""
    if auth.mode == "none" and not is_loopback(host):
        raise ConfigurationError(f"STEPAGENT_API_AUTH=none is allowed only on a loopback address, not {host}")
    if keys is None:
        keys = await keys_for(api_client.settings, required=False)
    limits = limits if limits is not None else ApiLimits.from_env(os.environ)
    if max_streams is not None:
        limits = dataclasses.replace(limits, max_open_streams=max_streams)
    verifier = Verifier(auth)
    async with contextlib.AsyncExitStack() as opened:
        if oauth is None and api_client.settings.state_table:
            from stepagent.aws.oauth_setup import open_oauth

            oauth = await open_oauth(api_client.settings, api_client.state, opened, required=False)
        state = ApiState(
            api_client, verifier, keys=keys, policy=policy or ApiPolicy(), limits=limits, oauth=oauth
        )
        if heartbeat_s is not None:
            state.heartbeat_s = heartbeat_s
        # The one embedded-server loop: it leaves Ctrl-C and SIGTERM to the program (bounded shutdown).
        try:
            async with serve_in_background(build_app(state), host, port, lifespan="off", backlog=4096) as url:
                yield url
        finally:
            await verifier.aclose()


async def serve_api(
    api_client: Client, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, dev_token: bool = False
) -> int:
    """``stepagent api``: serve until Ctrl-C (the client must be open)."""
    if dev_token:
        dev = DevAuth.generate()
        auth = dev.settings
    else:
        auth = auth_settings(host)
    policy = ApiPolicy.from_env(os.environ)
    async with open_api(api_client, auth, host=host, port=port, policy=policy) as url:
        print(f"stepagent api: {url} (chat page: {url}/)", file=sys.stderr)
        if dev_token:
            print("dev token (valid 12 h, for this process only):", file=sys.stderr)
            print(dev.token(), flush=True)
        elif auth.mode == "none":
            print(f"no authentication (STEPAGENT_API_AUTH=none): local only, on {host}", file=sys.stderr)
        print("Ctrl-C to stop", file=sys.stderr)
        await asyncio.Event().wait()
    return 0
