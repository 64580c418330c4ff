"""``stepagent infra create``: the tables, queues and bucket on moto or LocalStack, and the settings that
name them (:func:`stepagent.devstack.stack.infra_create`)."""

from __future__ import annotations

import argparse
from collections.abc import Coroutine
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``infra create``."""
    infra = subparsers.add_parser("infra", help="manage the AWS resources")
    infra_commands = infra.add_subparsers(dest="infra_command", required=True, metavar="ACTION")
    create = infra_commands.add_parser(
        "create", help="create the tables, queues and bucket on moto or LocalStack and print the settings"
    )
    create.add_argument("--endpoint-url", required=True, help="e.g. http://localhost:4566 (LocalStack)")
    create.add_argument("--prefix", default="stepagent", help="name prefix for the resources")
    create.set_defaults(run=_create)


def _create(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    from stepagent.devstack.stack import infra_create

    return infra_create(args.endpoint_url, args.prefix)
