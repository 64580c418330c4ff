"""The OAuth services (:class:`~stepagent.tools.mcp_oauth.OAuthServices`) of a process, from its settings.

The cipher that seals users' tokens is KMS when ``STEPAGENT_OAUTH_KEY_ID`` names a key (AWS), else the
local AES-GCM key file of ``STEPAGENT_STATE_DIR`` (``stepagent run``, the embedded stack). A process that
calls an ``"auth": "oauth"`` MCP server with neither fails at start: tokens are never kept in the clear.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from stepagent.aws.clients import aws_session, client
from stepagent.aws.settings import Settings
from stepagent.errors import ConfigurationError
from stepagent.tools.mcp_oauth import KeyValue, OAuthServices, redirect_uri_of
from stepagent.tools.token_cipher import Cipher, LocalCipher


async def open_oauth(
    settings: Settings, store: KeyValue, stack: AsyncExitStack, *, session: Any = None, required: bool
) -> OAuthServices | None:
    """The services over ``store``; a KMS client, if one is needed, closes with ``stack``. Without a key
    setting: ``None``, or — when ``required`` — a ``ConfigurationError`` saying what to set."""
    cipher: Cipher
    if settings.oauth_key_id:
        kms = await stack.enter_async_context(client(session or aws_session(settings), "kms", settings))
        from stepagent.aws.kms_cipher import KmsCipher

        cipher = KmsCipher(kms, settings.oauth_key_id)
    elif settings.state_dir:
        cipher = LocalCipher.from_dir(Path(settings.state_dir))
    elif required:
        raise ConfigurationError(
            'an MCP server with "auth": "oauth" keeps each user\'s tokens encrypted: set STEPAGENT_OAUTH_KEY_ID '
            "(a KMS key) or STEPAGENT_STATE_DIR (a local key file; `stepagent run --state-dir DIR`)"
        )
    else:
        return None
    return OAuthServices(store=store, cipher=cipher, redirect_uri=redirect_uri_of(settings.api_url))
