"""The single source of truth for stepagent's AWS resource definitions (DynamoDB tables for now).

What it guarantees:

- :func:`conversation_table_definition` and :func:`state_table_definition` return ``CreateTable`` keyword
  arguments; the local stack, ``stepagent infra create`` and the SAM template derive from them, so every
  environment has the same key schema (``pk``/``sk`` strings), on-demand billing and, for the state table,
  TTL on :data:`STATE_TTL_ATTRIBUTE`.
- :func:`ensure_tables` is idempotent: it creates what is missing, waits until the tables are ``ACTIVE``,
  enables TTL if it is not already on, and fails with a :class:`~stepagent.errors.ConfigurationError` if a
  table of that name exists with a different key schema.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from stepagent.errors import ConfigurationError, StoreError

if TYPE_CHECKING:  # the types-aiobotocore stubs: a development dependency, never imported at run time
    from types_aiobotocore_dynamodb import DynamoDBClient
    from types_aiobotocore_dynamodb.type_defs import (
        DescribeTableOutputTypeDef,
        DescribeTimeToLiveOutputTypeDef,
    )

#: Attribute holding the epoch-seconds expiry of TTL'd state items (processed/answered markers).
STATE_TTL_ATTRIBUTE = "expires_at"

_KEY_SCHEMA = [
    {"AttributeName": "pk", "KeyType": "HASH"},
    {"AttributeName": "sk", "KeyType": "RANGE"},
]
_ATTRIBUTES = [
    {"AttributeName": "pk", "AttributeType": "S"},
    {"AttributeName": "sk", "AttributeType": "S"},
]
# Tables become ACTIVE within seconds on AWS and instantly on moto/LocalStack; this bounds the wait.
_ACTIVE_TIMEOUT_S = 300.0
_POLL_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class TableDefinition:
    """One table: its ``CreateTable`` arguments and, if it has one, its TTL attribute."""

    create_kwargs: dict[str, Any]
    ttl_attribute: str | None = None

    @property
    def name(self) -> str:
        return str(self.create_kwargs["TableName"])


def _table_kwargs(table_name: str) -> dict[str, Any]:
    return {
        "TableName": table_name,
        "KeySchema": [dict(key) for key in _KEY_SCHEMA],
        "AttributeDefinitions": [dict(attr) for attr in _ATTRIBUTES],
        "BillingMode": "PAY_PER_REQUEST",
    }


def conversation_table_definition(table_name: str) -> dict[str, Any]:
    """``CreateTable`` kwargs for the conversation table (thread heads, rows, summaries)."""
    return _table_kwargs(table_name)


def state_table_definition(table_name: str) -> dict[str, Any]:
    """``CreateTable`` kwargs for the state table; TTL on :data:`STATE_TTL_ATTRIBUTE` is set separately
    (CreateTable cannot enable TTL), see :func:`table_definitions`."""
    return _table_kwargs(table_name)


def table_definitions(conversation_table: str, state_table: str) -> list[TableDefinition]:
    """Both tables with their TTL settings, in creation order."""
    return [
        TableDefinition(conversation_table_definition(conversation_table)),
        TableDefinition(state_table_definition(state_table), ttl_attribute=STATE_TTL_ATTRIBUTE),
    ]


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _check_schema(definition: TableDefinition, description: DescribeTableOutputTypeDef) -> None:
    table = description.get("Table", {})
    found = sorted((k["AttributeName"], k["KeyType"]) for k in table.get("KeySchema", []))
    wanted = sorted((k["AttributeName"], k["KeyType"]) for k in definition.create_kwargs["KeySchema"])
    if found != wanted:
        raise ConfigurationError(
            f"DynamoDB table {definition.name!r} exists with key schema {found}; stepagent needs {wanted}"
        )


def _ttl_enabled(description: DescribeTimeToLiveOutputTypeDef) -> bool:
    status = description.get("TimeToLiveDescription", {}).get("TimeToLiveStatus")
    return status in ("ENABLED", "ENABLING")


def _ttl_request(definition: TableDefinition) -> dict[str, Any]:
    return {
        "TableName": definition.name,
        "TimeToLiveSpecification": {"Enabled": True, "AttributeName": definition.ttl_attribute},
    }


async def _ensure_one(client: DynamoDBClient, definition: TableDefinition) -> None:
    try:
        await client.create_table(**definition.create_kwargs)
    except ClientError as exc:
        # ResourceInUseException = the table already exists (or is being created): that is the idempotent case.
        if _error_code(exc) != "ResourceInUseException":
            raise
    deadline = time.monotonic() + _ACTIVE_TIMEOUT_S
    while True:
        description = await client.describe_table(TableName=definition.name)
        _check_schema(definition, description)
        if description["Table"].get("TableStatus") == "ACTIVE":
            break
        if time.monotonic() > deadline:
            raise StoreError(f"DynamoDB table {definition.name!r} did not become ACTIVE")
        await asyncio.sleep(_POLL_INTERVAL_S)
    # UpdateTimeToLive fails on a table whose TTL is already enabled, so look first.
    if definition.ttl_attribute is not None and not _ttl_enabled(
        await client.describe_time_to_live(TableName=definition.name)
    ):
        await client.update_time_to_live(**_ttl_request(definition))


def _wrap(exc: ClientError | BotoCoreError, definitions: Sequence[TableDefinition]) -> StoreError:
    names = ", ".join(d.name for d in definitions)
    return StoreError(f"creating DynamoDB tables ({names}) failed: {exc}")


async def ensure_tables(client: DynamoDBClient, conversation_table: str, state_table: str) -> None:
    """Create (if missing) and configure both tables with an async DynamoDB client. Idempotent."""
    definitions = table_definitions(conversation_table, state_table)
    try:
        for definition in definitions:
            await _ensure_one(client, definition)
    except (ClientError, BotoCoreError) as exc:
        raise _wrap(exc, definitions) from exc
