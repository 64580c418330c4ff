"""aioboto3 session and client factories that honour the settings' endpoint (moto, LocalStack).

One session per process; clients are async context managers bound to the running event loop, so a
long-lived process (a Lambda container, the local stack) opens them once and keeps them.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import aioboto3
from botocore.config import Config

from stepagent.aws.settings import Settings

# Standard retry mode with a few attempts: transient AWS errors are retried by botocore first, then by
# the queue redelivering the record.
_CONFIG = Config(retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=5, read_timeout=30)


def aws_session(settings: Settings) -> aioboto3.Session:
    """The aioboto3 session for the settings' region (``us-east-1`` when none is set)."""
    return aioboto3.Session(region_name=settings.region or "us-east-1")


def client(session: aioboto3.Session, service: str, settings: Settings) -> AbstractAsyncContextManager[Any]:
    """An aioboto3 client for ``service``; ``AWS_ENDPOINT_URL`` (moto, LocalStack) applies to all of them."""
    kwargs: dict[str, Any] = {"config": _CONFIG}
    if settings.endpoint_url:
        kwargs["endpoint_url"] = settings.endpoint_url
    return session.client(service, **kwargs)  # type: ignore[no-any-return]
