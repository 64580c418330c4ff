"""SqsSender, the claim check and the queue/bucket definitions, on the moto server."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stepagent.aws.queue_resources import ensure_queues_and_bucket, queue_definitions
from stepagent.blobs import ContentBlobs
from stepagent.errors import MalformedMessageError, PayloadTooLargeError, QueueError
from stepagent.messages import InputMessage, parse_input_message
from stepagent.senders.claim_check import ENVELOPE_KEY, INLINE_BODY_LIMIT, envelope_of, unwrap_body, wrap_body
from stepagent.senders.sqs import BATCH_BODY_BYTES, BATCH_ENTRIES, Outgoing, SqsQueues, SqsSender, dedup_key
from tests.conftest import REGION, aws_client, unique_name

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def queues() -> AsyncIterator[tuple[Any, Any, Any]]:
    """(sqs client, s3 client, QueueResources) for a fresh set of queues and bucket."""
    async with aws_client("sqs") as sqs, aws_client("s3") as s3:
        resources = await ensure_queues_and_bucket(sqs, s3, prefix=unique_name("sq"), region=REGION)
        try:
            yield sqs, s3, resources
        finally:
            for url in resources.urls.values():
                await sqs.delete_queue(QueueUrl=url)


async def drain(sqs: Any, url: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        response = await sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = response.get("Messages", [])
        if not messages:
            return out
        for message in messages:
            out.append(message)
            await sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


async def test_dedup_is_deterministic_and_scoped_to_the_target_thread(queues: tuple[Any, Any, Any]) -> None:
    sqs, s3, resources = queues
    sender = SqsSender(sqs, resources.input_queue_url, s3_client=s3, bucket=resources.bucket)
    for thread in ("a", "b", "a"):
        await sender.send(InputMessage.user_text(thread, f"hello {thread}"), "same-id")
    messages = await drain(sqs, resources.input_queue_url)
    assert sorted(m["Attributes"]["MessageGroupId"] for m in messages) == ["a", "b"]
    for message in messages:
        group = message["Attributes"]["MessageGroupId"]
        assert message["Attributes"]["MessageDeduplicationId"] == dedup_key(group, "same-id")
        assert json.loads(message["Body"])["id"] == "same-id"
    assert len(dedup_key("g" * 128, "x" * 1000)) == 64


async def test_an_explicit_message_id_is_kept(queues: tuple[Any, Any, Any]) -> None:
    sqs, _, resources = queues
    sender = SqsSender(sqs, resources.input_queue_url)
    await sender.send(InputMessage.user_text("t", "hi", id="logical-1"), "dedup-1")
    [message] = await drain(sqs, resources.input_queue_url)
    assert parse_input_message(message["Body"]).id == "logical-1"
    assert message["Attributes"]["MessageDeduplicationId"] == dedup_key("t", "dedup-1")


async def test_a_big_message_is_claim_checked_and_resolves_to_the_same_body(
    queues: tuple[Any, Any, Any],
) -> None:
    sqs, s3, resources = queues
    sender = SqsSender(sqs, resources.input_queue_url, s3_client=s3, bucket=resources.bucket)
    text = "z" * INLINE_BODY_LIMIT + " ünïcode"
    big = InputMessage.user_text("t", text, id="big-1")
    await sender.send(big, "big-1")
    [message] = await drain(sqs, resources.input_queue_url)
    assert len(message["Body"]) < 1_000
    envelope = json.loads(message["Body"])[ENVELOPE_KEY]
    assert envelope["v"] == 2 and envelope["bucket"] == resources.bucket
    [ref] = envelope["texts"]
    digest = hashlib.sha256(text.encode()).hexdigest()  # the text's own hash, not the body's
    assert ref["key"] == f"blobs/sha256/{digest}" and ref["size"] == len(text.encode())
    stored = await s3.get_object(Bucket=resources.bucket, Key=ref["key"])
    assert (await stored["Body"].read()).decode() == text
    # Byte-identical, also for a reader that has never seen the text (no cache).
    assert await unwrap_body(message["Body"], ContentBlobs(s3, resources.bucket)) == big.to_json()
    # Without a bucket, a big body is rejected rather than truncated or dropped.
    with pytest.raises(PayloadTooLargeError):
        await SqsSender(sqs, resources.input_queue_url).send(big, "big-2")


async def test_a_body_that_is_not_json_falls_back_to_a_whole_body_copy(queues: tuple[Any, Any, Any]) -> None:
    _, s3, resources = queues
    blobs = ContentBlobs(s3, resources.bucket)
    wrapped = await wrap_body("q" * 300_000, blobs)
    envelope = json.loads(wrapped)[ENVELOPE_KEY]
    assert envelope["v"] == 1 and envelope["key"] == f"payloads/{envelope['sha256']}"
    assert await unwrap_body(wrapped, blobs) == "q" * 300_000


async def test_broken_v1_claim_checks_are_bad_input(queues: tuple[Any, Any, Any]) -> None:
    _, s3, resources = queues
    blobs = ContentBlobs(s3, resources.bucket)
    wrapped = await wrap_body("q" * 300_000, blobs)
    fields = json.loads(wrapped)[ENVELOPE_KEY]

    def variant(**changes: Any) -> str:
        return json.dumps({ENVELOPE_KEY: fields | changes})

    for body, reason in [
        (variant(sha256="0" * 64), "does not match"),
        (variant(key="payloads/missing"), "does not exist"),
        (variant(bucket="someone-elses-bucket"), "not"),
        (variant(v=3), "version"),
        (json.dumps({ENVELOPE_KEY: "nope"}), "must be an object"),
    ]:
        with pytest.raises(MalformedMessageError, match=reason):
            await unwrap_body(body, blobs)
    # A message that merely mentions the key is not an envelope.
    mention = InputMessage.user_text("t", ENVELOPE_KEY).to_json()
    assert envelope_of(mention) is None and await unwrap_body(mention, blobs) == mention


async def test_broken_v2_claim_checks_are_bad_input(queues: tuple[Any, Any, Any]) -> None:
    _, s3, resources = queues
    bucket = resources.bucket
    text = "r" * 300_000
    wrapped = await wrap_body(InputMessage.user_text("t", text).to_json(), ContentBlobs(s3, bucket))
    fields = json.loads(wrapped)[ENVELOPE_KEY]
    [ref] = fields["texts"]

    def variant(**changes: Any) -> str:
        return json.dumps({ENVELOPE_KEY: {**fields, "texts": [ref | changes]}})

    missing = "0" * 64
    for body, reason in [
        (variant(sha256=missing, key=f"blobs/sha256/{missing}"), "does not exist"),
        (variant(key="rows/elsewhere"), "its 'key'"),
        (variant(path=["no", "such"]), "do not fit"),
        (json.dumps({ENVELOPE_KEY: {**fields, "texts": []}}), "list of 'texts'"),
    ]:
        with pytest.raises(MalformedMessageError, match=reason):
            await unwrap_body(body, ContentBlobs(s3, bucket))
    # A truncated or swapped object is caught by its hash, by any reader that has not cached the text.
    await s3.put_object(Bucket=bucket, Key=ref["key"], Body=text[:-1].encode())
    with pytest.raises(MalformedMessageError, match="does not match its sha256"):
        await unwrap_body(wrapped, ContentBlobs(s3, bucket))


class CountingSqs:
    """The SQS client, counting the send requests made through it."""

    def __init__(self, sqs: Any) -> None:
        self.sqs = sqs
        self.requests: list[tuple[str, int]] = []

    async def send_message(self, **kwargs: Any) -> Any:
        self.requests.append(("SendMessage", 1))
        return await self.sqs.send_message(**kwargs)

    async def send_message_batch(self, **kwargs: Any) -> Any:
        self.requests.append(("SendMessageBatch", len(kwargs["Entries"])))
        return await self.sqs.send_message_batch(**kwargs)


async def test_a_batch_sends_the_same_messages_in_order_in_as_few_requests_as_sqs_allows(
    queues: tuple[Any, Any, Any],
) -> None:
    sqs, s3, resources = queues
    counting = CountingSqs(sqs)
    sender = SqsQueues(counting, s3_client=s3, bucket=resources.bucket)
    url = resources.output_queue_url
    big = "b" * (INLINE_BODY_LIMIT + 1)  # claim-checked: its envelope is small
    bodies = [f"event {n}" for n in range(BATCH_ENTRIES + 1)] + [big]
    await sender.send_batch(
        url, [Outgoing(b, group_id="root", dedup_id=f"e{n}") for n, b in enumerate(bodies)]
    )
    assert counting.requests == [("SendMessageBatch", BATCH_ENTRIES), ("SendMessageBatch", 2)]
    received = await drain(sqs, url)
    assert [await sender.resolve(m["Body"]) for m in received] == bodies
    assert [m["Attributes"]["MessageDeduplicationId"] for m in received] == [
        f"e{n}" for n in range(len(bodies))
    ]
    assert {m["Attributes"]["MessageGroupId"] for m in received} == {"root"}

    # Bodies that would overflow one batch's payload go in the next request; a lone one is a SendMessage.
    counting.requests.clear()
    half = "h" * (BATCH_BODY_BYTES // 2 + 1)
    await sender.send_batch(url, [Outgoing(half, group_id="root", dedup_id=f"h{n}") for n in range(3)])
    assert counting.requests == [("SendMessage", 1)] * 3
    assert [m["Body"] for m in await drain(sqs, url)] == [half] * 3


async def test_a_refused_batch_entry_is_a_queue_error(queues: tuple[Any, Any, Any]) -> None:
    sqs, _, resources = queues
    # A FIFO queue refuses a message without a group id.
    with pytest.raises(QueueError, match="SendMessageBatch"):
        await SqsQueues(sqs).send_batch(
            resources.output_queue_url, [Outgoing("a", dedup_id="x"), Outgoing("b")]
        )


async def test_aws_failures_are_queue_errors(queues: tuple[Any, Any, Any]) -> None:
    sqs, _, resources = queues
    missing = resources.input_queue_url.rsplit("/", 1)[0] + "/does-not-exist.fifo"
    with pytest.raises(QueueError, match="does-not-exist"):
        await SqsSender(sqs, missing).send(InputMessage.user_text("t", "hi"), "x")


async def test_queue_definitions_match_the_template_and_creation_is_idempotent(
    queues: tuple[Any, Any, Any],
) -> None:
    sqs, s3, resources = queues
    prefix = resources.input_queue_url.rsplit("/", 1)[1].removesuffix("-input.fifo")
    again = await ensure_queues_and_bucket(sqs, s3, prefix=prefix, region=REGION)
    assert again == resources
    attributes = (await sqs.get_queue_attributes(QueueUrl=resources.input_queue_url, AttributeNames=["All"]))[
        "Attributes"
    ]
    assert attributes["FifoQueue"] == "true" and attributes["VisibilityTimeout"] == "1800"
    assert json.loads(attributes["RedrivePolicy"]) == {
        "deadLetterTargetArn": resources.arns["input_dlq"],
        "maxReceiveCount": 5,
    }
    by_role = {d.role: d for d in queue_definitions(prefix)}
    assert (
        by_role["tool"].max_receive_count == 3 and by_role["tool"].attributes["VisibilityTimeout"] == "5400"
    )
    assert "FifoQueue" not in by_role["delay"].attributes and by_role["delay"].dead_letter_role == "delay_dlq"
    assert by_role["output"].attributes["FifoQueue"] == "true"
    # Converging attributes of existing queues (a test shortening the visibility timeout).
    await ensure_queues_and_bucket(
        sqs, s3, prefix=prefix, region=REGION, attribute_overrides={"input": {"VisibilityTimeout": "7"}}
    )
    changed = await sqs.get_queue_attributes(
        QueueUrl=resources.input_queue_url, AttributeNames=["VisibilityTimeout"]
    )
    assert changed["Attributes"]["VisibilityTimeout"] == "7"
    env = resources.env()
    assert env["STEPAGENT_INPUT_QUEUE_URL"] == resources.input_queue_url
    assert env["STEPAGENT_BLOB_BUCKET"] == resources.bucket
    lifecycle = await s3.get_bucket_lifecycle_configuration(Bucket=resources.bucket)
    assert lifecycle["Rules"][0]["Expiration"] == {"Days": 30}
