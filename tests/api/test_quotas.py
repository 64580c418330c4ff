"""Per-subject quotas of the HTTP API, enforced across instances: two API servers over one deployment (moto,
the real worker) share the counters in the state table, so concurrent requests through both cannot pass a
limit — open streams, new conversations and messages per minute, and dollars per day (a priced model run
by the worker). The windows run on a test clock; nothing depends on when the test runs."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from stepagent.api.app import ApiState, build_app
from stepagent.api.auth import DevAuth, Verifier
from stepagent.api.quotas import LEASE_S, ApiLimits
from stepagent.client import Client
from stepagent.providers.base import Final, ModelInfo, ModelRequest, StreamEvent, TextDelta, Usage
from stepagent.providers.prices import parse_prices
from stepagent.rap.server import serve_in_background
from stepagent.stores.dynamodb.io import DynamoIo
from stepagent.stores.dynamodb.quotas import SubjectCounters
from stepagent.stores.metrics import StoreMetrics
from tests.api.helpers import new_thread
from tests.client.deployment import Deployment, deployment
from tests.conftest import DynamoEnv
from tests.console.helpers import scripted_model

NO_LIMITS = ApiLimits(
    max_new_threads_per_minute=None,
    max_messages_per_minute=None,
    max_open_streams=None,
    max_cost_usd_per_day=None,
)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Instances:
    deployment: Deployment
    dev: DevAuth
    clock: Clock
    http: list[httpx.AsyncClient]
    counters: SubjectCounters

    def headers(self, subject: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.dev.token(subject)}"}


@asynccontextmanager
async def two_instances(model: Any, limits: ApiLimits, **options: Any) -> AsyncIterator[Instances]:
    """One deployment and two API servers over it, each with its own client (as two Lambda executions)."""
    dev = DevAuth.generate()
    clock = Clock(1_000_000_040.0)  # 20 s into a minute (10**9 + 40 = 60 * 16666667 + 20)
    async with AsyncExitStack() as stack:
        d = await stack.enter_async_context(deployment(model, **options))
        clients, counters = [], None
        for _ in range(2):
            client = await stack.enter_async_context(Client(d.settings, poll_interval=0.05))
            state = ApiState(client, Verifier(dev.settings), limits=limits, clock=clock)
            counters = state.quotas.counters
            url = await stack.enter_async_context(serve_in_background(build_app(state), lifespan="off"))
            clients.append(await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30)))
        assert counters is not None
        yield Instances(d, dev, clock, clients, counters)


async def test_open_streams_are_counted_per_subject_across_instances() -> None:
    limits = ApiLimits(max_open_streams=3, max_new_threads_per_minute=None, max_messages_per_minute=None)
    async with two_instances(scripted_model(), limits) as api:
        alice = api.headers("alice")
        thread = new_thread("streams")
        assert (
            await api.http[0].post(f"/v1/threads/{thread}/messages", json={"text": "hi"}, headers=alice)
        ).status_code == 202
        path = f"/v1/threads/{thread}/events?follow=1"

        async with AsyncExitStack() as streams:

            async def open_one(index: int) -> tuple[int, Any]:
                response = await streams.enter_async_context(
                    api.http[index % 2].stream("GET", path, headers=alice)
                )
                if response.status_code == 200:
                    reader = response.aiter_raw()
                    await anext(reader)  # the server has started this stream
                    return 200, (response, reader)
                await response.aread()
                return response.status_code, response

            opened = await asyncio.gather(*(open_one(i) for i in range(12)))
            statuses = [status for status, _ in opened]
            assert statuses.count(200) == 3, statuses
            assert statuses.count(429) == 9, statuses
            refused = next(r for s, r in opened if s == 429)
            assert refused.headers["Retry-After"] == "5"
            assert refused.json()["error"]["code"] == "too_many_requests"
            assert "open event streams" in refused.json()["error"]["message"]
            # Another subject has slots of their own.
            bob_thread = new_thread("bob")
            bob = api.headers("bob")
            await api.http[1].post(f"/v1/threads/{bob_thread}/messages", json={"text": "hi"}, headers=bob)
            async with api.http[1].stream(
                "GET", f"/v1/threads/{bob_thread}/events?follow=1", headers=bob
            ) as other:
                assert other.status_code == 200

            # Closing one of alice's streams frees its slot (the server notices the client left).
            _, (response, reader) = next(o for o in opened if o[0] == 200)
            await reader.aclose()
            await response.aclose()
            for _ in range(200):
                async with api.http[1].stream("GET", path, headers=alice) as again:
                    if again.status_code == 200:
                        break
                    assert again.status_code == 429
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("a closed stream never freed its slot")


async def test_new_conversations_and_messages_per_minute_cannot_be_raced_past() -> None:
    limits = ApiLimits(max_new_threads_per_minute=20, max_messages_per_minute=25, max_open_streams=None)
    async with two_instances(scripted_model(), limits) as api:
        alice = api.headers("alice")
        # 30 new conversations at once, through both instances: exactly 20 are accepted.
        threads = [new_thread("burst") for _ in range(30)]
        responses = await asyncio.gather(
            *(
                api.http[i % 2].post(f"/v1/threads/{t}/messages", json={"text": "hi"}, headers=alice)
                for i, t in enumerate(threads)
            )
        )
        statuses = [r.status_code for r in responses]
        assert statuses.count(202) == 20 and statuses.count(429) == 10, statuses
        refused = next(r for r in responses if r.status_code == 429)
        assert refused.headers["Retry-After"] == "40"  # the minute ends 40 s after the clock's 20 s
        error = refused.json()["error"]
        assert error["code"] == "too_many_requests" and "20 new conversations per minute" in error["message"]
        # Messages to a conversation that exists are not new conversations: 5 more fit (25 messages a
        # minute, 20 used), the 6th does not.
        accepted = next(t for t, r in zip(threads, responses, strict=True) if r.status_code == 202)
        more = [
            await api.http[i % 2].post(
                f"/v1/threads/{accepted}/messages", json={"text": f"m{i}"}, headers=alice
            )
            for i in range(6)
        ]
        assert [r.status_code for r in more] == [202] * 5 + [429]
        assert "25 messages per minute" in more[-1].json()["error"]["message"]
        # Bob is counted apart; and the next minute alice may start again.
        bob = api.headers("bob")
        assert (
            await api.http[0].post(
                f"/v1/threads/{new_thread('b')}/messages", json={"text": "hi"}, headers=bob
            )
        ).status_code == 202
        api.clock.now += 40
        assert (
            await api.http[1].post(
                f"/v1/threads/{new_thread('n')}/messages", json={"text": "hi"}, headers=alice
            )
        ).status_code == 202


@dataclass
class PricedModel:
    """Every answer uses 1000 input and 1000 output tokens of a model priced at $1000 per million: $2."""

    @property
    def info(self) -> ModelInfo:
        return ModelInfo("test:priced", context_window=1_000_000)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        yield TextDelta("ok")
        yield Final(usage=Usage(input_tokens=1000, output_tokens=1000))


async def test_the_daily_cost_limit_refuses_new_messages_once_the_worker_has_counted_the_spend() -> None:
    limits = dataclasses.replace(NO_LIMITS, max_cost_usd_per_day=3.0)
    prices = parse_prices('{"test:priced": {"input": 1000, "output": 1000}}')
    async with two_instances(PricedModel(), limits, prices=prices) as api:
        api.deployment.services.runtime._worker.clock = api.clock  # the worker's day is the test's
        alice = api.headers("alice")
        web = Client(api_url=str(api.http[0].base_url), token=api.dev.token("alice"))
        async with web:
            one, two = new_thread("cost"), new_thread("cost")
            first = await web.send(one, "hello")
            await web.wait(one, first, timeout=60)  # $2 spent
            second = await web.send(two, "hello")  # under $3: accepted, in another conversation
            await web.wait(two, second, timeout=60)  # $4 spent
        # The worker adds a step's cost just after committing it: wait until both steps are counted.
        for _ in range(400):
            spent, _ = await api.counters.spent_today("alice", api.clock())
            if spent >= 4:
                break
            await asyncio.sleep(0.05)
        assert spent == 4.0
        refused = await api.http[1].post(f"/v1/threads/{one}/messages", json={"text": "more"}, headers=alice)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert (
            error["code"] == "too_many_requests"
            and "$4.0000" in error["message"]
            and "$3" in error["message"]
        )
        assert 0 < int(refused.headers["Retry-After"]) <= 86_400
        # Bob's day is his own; and alice may talk again the next UTC day.
        bob = api.headers("bob")
        assert (
            await api.http[0].post(
                f"/v1/threads/{new_thread('b')}/messages", json={"text": "hi"}, headers=bob
            )
        ).status_code == 202
        api.clock.now += int(refused.headers["Retry-After"])
        assert (
            await api.http[0].post(f"/v1/threads/{one}/messages", json={"text": "more"}, headers=alice)
        ).status_code == 202


def test_the_limits_are_read_from_the_environment_with_clear_errors() -> None:
    import pytest

    from stepagent.errors import ConfigurationError

    assert ApiLimits.from_env({}) == ApiLimits(20, 60, 8, None)
    limits = ApiLimits.from_env(
        {
            "STEPAGENT_API_MAX_NEW_THREADS_PER_MINUTE": "5",
            "STEPAGENT_API_MAX_MESSAGES_PER_MINUTE": "7",
            "STEPAGENT_API_MAX_OPEN_STREAMS": "2",
            "STEPAGENT_API_MAX_COST_USD_PER_DAY": "$1.5",
        }
    )
    assert limits == ApiLimits(5, 7, 2, 1.5)
    for name, bad in (
        ("STEPAGENT_API_MAX_OPEN_STREAMS", "0"),
        ("STEPAGENT_API_MAX_MESSAGES_PER_MINUTE", "lots"),
        ("STEPAGENT_API_MAX_COST_USD_PER_DAY", "-1"),
        ("STEPAGENT_API_MAX_COST_USD_PER_DAY", "nan"),
    ):
        with pytest.raises(ConfigurationError, match=name):
            ApiLimits.from_env({name: bad})


async def test_a_lease_is_renewed_while_held_runs_out_after_a_crash_and_is_lost_to_another_stream(
    dynamo: DynamoEnv,
) -> None:
    counters = SubjectCounters(DynamoIo(dynamo.client, None, None, StoreMetrics()), dynamo.state_table)
    now = 1_000_000.0
    first = await counters.acquire("alice", 1, now, 60)
    assert first is not None and await counters.acquire("alice", 1, now + 30, 60) is None
    renewed = await counters.renew(first, now + 30, 60)  # the holder keeps it: still full at +80
    assert renewed is not None and await counters.renew(renewed, now + 91, 60) is None  # ran out: lost
    assert renewed is not None and renewed.expires == now + 90
    assert await counters.acquire("alice", 1, now + 80, 60) is None
    # The holder's process dies (no renewal): once the lease has run out another stream takes the slot,
    # and the old holder can neither renew nor free it.
    second = await counters.acquire("alice", 1, now + 91, 60)
    assert second is not None and second.holder != first.holder
    assert await counters.renew(renewed, now + 92, 60) is None
    await counters.release(renewed)
    assert await counters.acquire("alice", 1, now + 93, 60) is None
    await counters.release(second)
    assert await counters.acquire("alice", 1, now + 93, 60) is not None


async def test_a_stream_whose_lease_was_taken_over_ends() -> None:
    limits = dataclasses.replace(NO_LIMITS, max_open_streams=1)
    async with two_instances(scripted_model(), limits) as api:
        alice = api.headers("alice")
        thread = new_thread("lost")
        await api.http[0].post(f"/v1/threads/{thread}/messages", json={"text": "hi"}, headers=alice)
        path = f"/v1/threads/{thread}/events?follow=1"
        async with api.http[0].stream("GET", path, headers=alice) as first:
            assert first.status_code == 200
            # Time passes without a renewal reaching the store (the clock jumps past the lease): the lease
            # is lost, so the first stream ends at its next renewal, and another stream gets the slot.
            api.clock.now += LEASE_S + 1
            async with api.http[1].stream("GET", path, headers=alice) as second:
                assert second.status_code == 200
                async with asyncio.timeout(30):
                    body = b"".join([chunk async for chunk in first.aiter_raw()])  # ends: no follow forever
                assert body.startswith(b": stepagent events")
