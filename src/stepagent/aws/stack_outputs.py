"""Settings of a deployed stack, read from its CloudFormation outputs.

``template.yaml`` exports every resource a client needs (queues, tables, bucket, callback URL, model) as
stack outputs; :func:`stack_environment` maps them to the ``STEPAGENT_*`` names, so ``--stack NAME`` on the
command line (and :mod:`stepagent.client`) is the same as exporting those variables. One
``DescribeStacks`` call; an unknown stack or missing credentials is one
:class:`~stepagent.errors.ConfigurationError` that says what to check.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from stepagent.aws.clients import aws_session, client
from stepagent.aws.settings import Settings
from stepagent.errors import ConfigurationError

#: Output key in template.yaml → the setting it provides.
OUTPUT_SETTINGS: Mapping[str, str] = {
    "InputQueueUrl": "STEPAGENT_INPUT_QUEUE_URL",
    "OutputQueueUrl": "STEPAGENT_OUTPUT_QUEUE_URL",
    "DelayQueueUrl": "STEPAGENT_DELAY_QUEUE_URL",
    "ToolQueueUrl": "STEPAGENT_TOOL_QUEUE_URL",
    "ConversationTableName": "STEPAGENT_CONVERSATION_TABLE",
    "StateTableName": "STEPAGENT_STATE_TABLE",
    "BlobBucketName": "STEPAGENT_BLOB_BUCKET",
    "CallbackUrl": "STEPAGENT_CALLBACK_URL",
    "Model": "STEPAGENT_MODEL",
}


async def stack_environment(stack_name: str, settings: Settings | None = None) -> dict[str, str]:
    """``{setting name: value}`` from the outputs of ``stack_name`` (region and endpoint from ``settings``)."""
    settings = settings if settings is not None else Settings.from_env()
    try:
        async with client(aws_session(settings), "cloudformation", settings) as cloudformation:
            found = await cloudformation.describe_stacks(StackName=stack_name)
    except Exception as error:
        raise ConfigurationError(
            f"could not read the outputs of stack {stack_name!r} in {settings.region or 'us-east-1'}: {error} "
            "(check the stack name, AWS_REGION and your AWS credentials)"
        ) from None
    stacks = found.get("Stacks") or []
    outputs = {o["OutputKey"]: o["OutputValue"] for o in (stacks[0].get("Outputs") or [])} if stacks else {}
    env = {OUTPUT_SETTINGS[key]: value for key, value in outputs.items() if key in OUTPUT_SETTINGS}
    if "STEPAGENT_INPUT_QUEUE_URL" not in env:
        raise ConfigurationError(f"stack {stack_name!r} has no stepagent outputs (is it a stepagent stack?)")
    return env


async def settings_for(stack_name: str | None) -> Settings:
    """The settings of the environment, or of a deployed stack (its outputs over the environment's values)
    when ``stack_name`` is given: what ``--stack NAME`` means on every command."""
    settings = Settings.from_env()
    if stack_name is None:
        return settings
    return Settings.from_env({**os.environ, **await stack_environment(stack_name, settings)})
