"""The RAP receiver Lambda (behind a Function URL): callback → input queue; view update → output queue.

Guarantees:

- Cold start builds everything once (settings, the SQS client, the state store — which says whether a
  call is already answered — and, for view updates, the conversation store; the S3 client opens at the
  first oversized payload); ``STEPAGENT_INPUT_QUEUE_URL``, ``STEPAGENT_STATE_TABLE`` and the callback key
  (``STEPAGENT_CALLBACK_SECRET``, or a secret named by ``STEPAGENT_CALLBACK_SECRET_ID``, read once) are
  required (one :class:`~stepagent.errors.ConfigurationError` names what is missing). Every invocation runs on the
  process's one event loop (:func:`stepagent.aws.lambda_entry.event_loop`), where the clients live.
- Authentication, validation and conversion are :func:`~stepagent.rap.receiver.receive_function_url_event`.
  Messages go to the FIFO input queue through :class:`~stepagent.senders.sqs.SqsSender` (group = thread,
  deterministic dedup id, claim check for big bodies via ``STEPAGENT_BLOB_BUCKET``).
- A result, sign-in link or question for a call that is already answered is refused with 409, nothing
  sent (:func:`~stepagent.rap.receiver_app.deliver`).
- The answer is 200 only after every send succeeded; a queue failure is 500 ``{"error": "Internal
  error"}`` so the tool server retries (the same dedup id makes the retry harmless).
- ``view_update`` needs ``STEPAGENT_OUTPUT_QUEUE_URL`` and both tables (it is published with the thread
  context, like every output event). The thread must be known (404 otherwise). Without that
  configuration view updates are acknowledged and dropped, with a log line, as the reference does.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from typing import Any

from stepagent.aws.clients import AwsSession, LazyClient, aws_session, client
from stepagent.aws.layer_check import check_layer
from stepagent.aws.outputs import OutputPublisher
from stepagent.aws.secrets import resolve_secrets
from stepagent.aws.settings import Settings
from stepagent.rap.function_url import FunctionUrlEvent, FunctionUrlResponse
from stepagent.rap.receiver import (
    INTERNAL_ERROR_BODY,
    ReceiverResult,
    ViewUpdate,
    function_url_response,
    receive_function_url_event,
)
from stepagent.rap.receiver_app import Answered, answered_in, deliver
from stepagent.senders.sqs import SqsQueues, SqsSender
from stepagent.stores.dynamodb import DynamoStateStore, dynamo_stores
from stepagent.tracing import TRACEPARENT, continuing

log = logging.getLogger(__name__)


class UnknownThread(Exception):
    """A view update for a thread the stores do not know (answered with 404)."""

    pass


class RapReceiverRuntime:
    """Clients and the request handler of the receiver. Build with :meth:`create`."""

    def __init__(
        self, settings: Settings, sender: SqsSender, publisher: OutputPublisher | None, answered: Answered
    ) -> None:
        self.settings = settings
        self.sender = sender
        self.publisher = publisher
        self.answered = answered
        self._stack = AsyncExitStack()

    @classmethod
    async def create(
        cls, settings: Settings | None = None, *, session: AwsSession | None = None
    ) -> RapReceiverRuntime:
        settings = settings if settings is not None else Settings.from_env()
        session = session if session is not None else aws_session(settings)
        settings = await resolve_secrets(settings, session)
        settings.require("STEPAGENT_INPUT_QUEUE_URL", "STEPAGENT_STATE_TABLE", "STEPAGENT_CALLBACK_SECRET")
        stack = AsyncExitStack()
        try:
            sqs = await stack.enter_async_context(client(session, "sqs", settings))
            # S3 holds only payloads too large for a message: its client opens on first use, as the worker's.
            s3 = (
                LazyClient(lambda: stack.enter_async_context(client(session, "s3", settings))).as_client()
                if settings.blob_bucket
                else None
            )
            queues = SqsQueues(sqs, s3_client=s3, bucket=settings.blob_bucket)
            sender = SqsSender(sqs, str(settings.input_queue_url), queues=queues)
            publisher = None
            dynamodb = await stack.enter_async_context(client(session, "dynamodb", settings))
            state_store = DynamoStateStore(
                dynamodb, state_table=str(settings.state_table), s3_client=s3, bucket=settings.blob_bucket
            )
            if settings.output_queue_url and settings.conversation_table:
                conversation, state = dynamo_stores(
                    dynamodb,
                    conversation_table=settings.conversation_table,
                    state_table=str(settings.state_table),
                    s3_client=s3,
                    bucket=settings.blob_bucket,
                )
                publisher = OutputPublisher(queues, settings.output_queue_url, conversation, state)
        except BaseException:
            await stack.aclose()
            raise
        runtime = cls(settings, sender, publisher, answered_in(state_store))
        runtime._stack = stack
        return runtime

    async def aclose(self) -> None:
        await self._stack.aclose()

    async def publish_view(self, view: ViewUpdate) -> None:
        if self.publisher is None:
            log.info("view_update for %s dropped: no output queue or tables configured", view.thread_id)
            return
        if await self.publisher.conversation.get_thread(view.thread_id) is None:
            raise UnknownThread(view.thread_id)
        await self.publisher.publish(view.thread_id, [view.output_event()])

    async def handle(self, event: FunctionUrlEvent) -> FunctionUrlResponse:
        """One Function URL request → the Function URL response."""
        result = receive_function_url_event(event, str(self.settings.callback_secret))
        if result.ok:
            try:
                for view in result.views:
                    await self.publish_view(view)
            except UnknownThread as unknown:
                result = ReceiverResult(404, {"error": f"unknown thread {unknown.args[0]!r}"})
            except Exception:
                log.exception("could not publish a RAP view update")
                result = ReceiverResult(500, INTERNAL_ERROR_BODY)
            else:
                # A callback that carries a trace context (the one its call was sent with) continues it.
                with continuing(_header(event, TRACEPARENT)):
                    result = await deliver(
                        ReceiverResult(result.status, result.body, result.messages, pending=result.pending),
                        self.sender,
                        None,
                        self.answered,
                    )
        if not result.ok:
            log.warning("RAP callback refused: %s %s", result.status, result.body.get("error"))
        return function_url_response(result)


def _header(event: FunctionUrlEvent, name: str) -> str | None:
    headers = event.get("headers") or {}
    found = next((v for k, v in headers.items() if str(k).lower() == name), None)
    return found if isinstance(found, str) else None


_runtime: RapReceiverRuntime | None = None


def rap_receiver_handler(event: FunctionUrlEvent, context: Any) -> FunctionUrlResponse:
    """The Lambda entry point (``handlers/rap_receiver.py``)."""
    global _runtime
    from stepagent.aws.lambda_entry import event_loop

    loop = event_loop()
    if _runtime is None:
        check_layer()
        _runtime = loop.run_until_complete(RapReceiverRuntime.create())
    return loop.run_until_complete(_runtime.handle(event))


def reset() -> None:
    """Forget the cached runtime (tests)."""
    global _runtime
    if _runtime is not None:
        from stepagent.aws.lambda_entry import event_loop

        event_loop().run_until_complete(_runtime.aclose())
    _runtime = None
