"""The HTTP API as one ASGI application built from the environment, for Lambda (and any ASGI server).

On Lambda the AWS Lambda Web Adapter layer runs it under uvicorn (``handlers/api_run.sh``) and relays the
Function URL's requests to it, streaming the responses (``AWS_LWA_INVOKE_MODE=response_stream``), so an
event stream reaches the browser as it is written. The settings (``STEPAGENT_*``, the auth settings of
:mod:`stepagent.api.auth`) are read and the AWS clients opened at the first request (a configuration error
answers 500 with one clear message and is retried at the next request; the chat page is served
without them, so the adapter's readiness check passes), then kept for the life of the
process. ``none`` auth is refused here: a Function URL is never a loopback address. So is a missing
callback secret (``STEPAGENT_CALLBACK_SECRET_ID``): every instance must sign and verify resume tokens with
the same key (:mod:`stepagent.api.keys`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from stepagent.api.app import SECURITY_HEADERS, STATIC_PATHS, ApiState, build_app, static
from stepagent.api.auth import ApiAuthSettings, Verifier
from stepagent.api.keys import keys_for
from stepagent.api.policy import ApiPolicy
from stepagent.api.quotas import ApiLimits
from stepagent.aws.oauth_setup import open_oauth
from stepagent.client import Client
from stepagent.errors import ConfigurationError


class LambdaApi:
    """An ASGI app that builds the real one at its first request."""

    def __init__(self) -> None:
        self._app: Any = None
        self._lock = asyncio.Lock()
        self._client: Client | None = None
        self._opened = contextlib.AsyncExitStack()  # the KMS client of MCP sign-ins, kept with the app

    async def _build(self) -> Any:
        async with self._lock:
            if self._app is None:
                auth = ApiAuthSettings.from_env(os.environ)
                if auth.mode != "jwt":
                    raise ConfigurationError(
                        "STEPAGENT_API_AUTH must be jwt on Lambda (none is loopback only)"
                    )
                policy = ApiPolicy.from_env(os.environ)
                limits = ApiLimits.from_env(os.environ)
                client = await Client().open()
                try:
                    keys = await keys_for(client.settings, required=True)
                    # MCP sign-ins' callback: the template's KMS key (none: the callback says so).
                    oauth = await open_oauth(client.settings, client.state, self._opened, required=False)
                except BaseException:
                    await client.close()
                    raise
                self._client = client
                self._app = build_app(
                    ApiState(client, Verifier(auth), keys=keys, policy=policy, limits=limits, oauth=oauth)
                )
            return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return
        if scope["type"] == "http" and scope["path"] in STATIC_PATHS:
            # The page (and the adapter's readiness check, GET /) needs no settings: it answers even before
            # the API is configured.
            await static_app(scope, receive, send)
            return
        try:
            app = await self._build()
        except ConfigurationError as error:
            response = JSONResponse(
                {"error": {"code": "configuration", "message": f"the API is misconfigured: {error}"}},
                500,
                headers=SECURITY_HEADERS,
            )
            await response(scope, receive, send)
            return
        await app(scope, receive, send)


static_app = Starlette(routes=[Route(path, static, methods=["GET"]) for path in STATIC_PATHS])
app = LambdaApi()
