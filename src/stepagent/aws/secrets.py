"""Secrets read at cold start: the RAP callback key, the model provider's API key, the OTLP headers.

Guarantees:

- A deployed stack refers to its secrets by id, never by value: ``STEPAGENT_CALLBACK_SECRET_ID`` and
  ``STEPAGENT_PROVIDER_API_KEY_ID`` name a Secrets Manager secret (name or ARN; its ``SecretString``) or an
  SSM SecureString parameter (``ssm:<name>`` or a parameter ARN, read decrypted).
- Each secret is read once per process, when the runtime is built (cold start), and kept in memory only;
  nothing is written back to the environment.
- A secret that cannot be read, or is empty, fails start with one
  :class:`~stepagent.errors.ConfigurationError` naming the variable and what AWS said.
- The plain values (``STEPAGENT_CALLBACK_SECRET``; the provider's ``ANTHROPIC_API_KEY``/``OPENAI_API_KEY``)
  still work, for local use; setting ``STEPAGENT_CALLBACK_SECRET`` together with its ``_ID`` is an error,
  since which one wins would be a guess.
"""

from __future__ import annotations

import dataclasses
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from stepagent.aws.clients import AwsSession, client
from stepagent.aws.settings import Settings
from stepagent.errors import ConfigurationError

if TYPE_CHECKING:  # the types-aiobotocore stubs: a development dependency, never imported at run time
    from types_aiobotocore_secretsmanager import SecretsManagerClient
    from types_aiobotocore_ssm import SSMClient


def _is_ssm(secret_id: str) -> bool:
    return secret_id.startswith("ssm:") or (secret_id.startswith("arn:") and ":ssm:" in secret_id)


def _ssm_name(secret_id: str) -> str:
    # GetParameter takes a name or an ARN; only the ``ssm:`` prefix is ours.
    return secret_id.removeprefix("ssm:")


class _SecretReader:
    """Reads secrets with one client per service, opened on first use and kept until :meth:`aclose`
    (the worker may read two secrets from the same service at cold start)."""

    def __init__(self, session: AwsSession, settings: Settings) -> None:
        self._session, self._settings = session, settings
        self._ssm: SSMClient | None = None
        self._secrets: SecretsManagerClient | None = None
        self._stack = AsyncExitStack()

    async def _ssm_client(self) -> SSMClient:
        if self._ssm is None:
            self._ssm = await self._stack.enter_async_context(client(self._session, "ssm", self._settings))
        return self._ssm

    async def _secrets_client(self) -> SecretsManagerClient:
        if self._secrets is None:
            opened = client(self._session, "secretsmanager", self._settings)
            self._secrets = await self._stack.enter_async_context(opened)
        return self._secrets

    async def read(self, variable: str, secret_id: str) -> str:
        """The value of ``secret_id`` (see the module docstring for the forms); ``variable`` names the
        setting in errors."""
        try:
            if _is_ssm(secret_id):
                ssm = await self._ssm_client()
                parameter = await ssm.get_parameter(Name=_ssm_name(secret_id), WithDecryption=True)
                value = str(parameter.get("Parameter", {}).get("Value") or "")
            else:
                secrets = await self._secrets_client()
                secret = await secrets.get_secret_value(SecretId=secret_id)
                value = str(secret.get("SecretString") or "")
        except Exception as error:
            raise ConfigurationError(f"{variable}={secret_id!r} could not be read: {error}") from None
        if not value.strip():
            raise ConfigurationError(f"{variable}={secret_id!r} is empty")
        return value.strip()

    async def aclose(self) -> None:
        await self._stack.aclose()


async def resolve_secrets(settings: Settings, session: AwsSession) -> Settings:
    """``settings`` with ``callback_secret`` and ``provider_api_key`` filled in from their ids."""
    if settings.callback_secret_id and settings.callback_secret:
        raise ConfigurationError("set only one of STEPAGENT_CALLBACK_SECRET and STEPAGENT_CALLBACK_SECRET_ID")
    if not settings.callback_secret_id and not settings.provider_api_key_id:
        return settings
    reader = _SecretReader(session, settings)
    try:
        if settings.callback_secret_id:
            value = await reader.read("STEPAGENT_CALLBACK_SECRET_ID", settings.callback_secret_id)
            settings = dataclasses.replace(settings, callback_secret=value)
        if settings.provider_api_key_id:
            value = await reader.read("STEPAGENT_PROVIDER_API_KEY_ID", settings.provider_api_key_id)
            settings = dataclasses.replace(settings, provider_api_key=value)
    finally:
        await reader.aclose()
    return settings


async def read_secret(settings: Settings, session: AwsSession, variable: str, secret_id: str) -> str:
    """One secret's value (the forms and errors of the module docstring), e.g. the OTLP exporter's
    headers named by ``STEPAGENT_OTLP_HEADERS_SECRET_ID``."""
    reader = _SecretReader(session, settings)
    try:
        return await reader.read(variable, secret_id)
    finally:
        await reader.aclose()


def provider_environment(settings: Settings, environ: dict[str, str]) -> dict[str, str] | None:
    """The environment for :func:`~stepagent.providers.factory.make_provider` when the API key came from a
    secret (its usual variable set in a copy of ``environ``), else ``None`` (use the process environment)."""
    if not settings.provider_api_key:
        return None
    provider = (settings.model or "").partition(":")[0]
    names = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
    if provider not in names:
        raise ConfigurationError(
            f"STEPAGENT_PROVIDER_API_KEY_ID is set, but STEPAGENT_MODEL={settings.model!r} takes no API key "
            "(only anthropic: and openai: models do)"
        )
    return {**environ, names[provider]: settings.provider_api_key}
