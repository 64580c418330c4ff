"""The local AWS stack: an embedded moto server (or LocalStack via ``AWS_ENDPOINT_URL``) with the same
tables, queues and bucket as ``template.yaml``.

Guarantees: resources come from the same definitions the template and ``stepagent infra create`` use
(:mod:`stepagent.aws.resources`, :mod:`stepagent.aws.queue_resources`); creation is idempotent; the
embedded server listens on 127.0.0.1 only and is given fake credentials, so nothing can reach real AWS.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

import botocore.session

from stepagent.aws.clients import aws_session, client
from stepagent.aws.queue_resources import ensure_queues_and_bucket
from stepagent.aws.resources import ensure_tables
from stepagent.aws.settings import Settings
from stepagent.errors import ConfigurationError

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "stepagent-local",
    "AWS_SECRET_ACCESS_KEY": "stepagent-local",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


@dataclass(slots=True)
class EmbeddedMoto:
    """A moto server on a free loopback port, for the lifetime of the process (or until ``stop``)."""

    url: str = ""
    _server: object | None = field(default=None, repr=False)

    def start(self) -> str:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError:
            raise ConfigurationError(
                "the embedded local stack needs moto: install stepagent with the 'local' extra "
                "(pip install 'stepagent[local]'), or point AWS_ENDPOINT_URL at LocalStack"
            ) from None
        # Its web server logs every request (werkzeug's access log, some 30 lines per command) unless its
        # logger was configured: quiet by default; `--debug-sdk` sets it to DEBUG first and keeps it.
        access_log = logging.getLogger("werkzeug")
        if access_log.level == logging.NOTSET:
            access_log.setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        self._server, self.url = server, f"http://{host}:{port}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()  # type: ignore[attr-defined]
            self._server = None


def use_fake_credentials() -> None:
    """Make every AWS client in this process talk to the local stack with throwaway credentials."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        os.environ.pop(name, None)
    os.environ.update(FAKE_CREDENTIALS)


async def create_resources(endpoint_url: str, prefix: str = "stepagent") -> dict[str, str]:
    """Create (or find) every table, queue and the bucket; return their ``STEPAGENT_*`` settings."""
    settings = Settings(endpoint_url=endpoint_url, region=os.environ.get("AWS_REGION", "us-east-1"))
    session = aws_session(settings)
    tables = {
        "STEPAGENT_CONVERSATION_TABLE": f"{prefix}-conversation",
        "STEPAGENT_STATE_TABLE": f"{prefix}-state",
    }
    async with client(session, "dynamodb", settings) as dynamodb:
        await ensure_tables(dynamodb, tables["STEPAGENT_CONVERSATION_TABLE"], tables["STEPAGENT_STATE_TABLE"])
    async with client(session, "sqs", settings) as sqs, client(session, "s3", settings) as s3:
        queues = await ensure_queues_and_bucket(sqs, s3, prefix=prefix, region=settings.region)
    return {**tables, **queues.env()}


async def infra_create(endpoint_url: str, prefix: str) -> int:
    """``stepagent infra create``: create the resources and print ``KEY=value`` settings lines."""
    print(f"creating tables, queues and bucket at {endpoint_url} ...", file=sys.stderr)
    if botocore.session.get_session().get_credentials() is None:
        raise ConfigurationError(
            "no AWS credentials found; moto and LocalStack accept any dummy keys: "
            "export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test"
        )
    env = await create_resources(endpoint_url, prefix)
    for key, value in env.items():
        print(f"{key}={value}")
    print(f"AWS_ENDPOINT_URL={endpoint_url}")
    return 0
