"""A local RAP tool server to play with and copy: ``get_time`` and a ``ticker`` subscription.

Run it with ``python -m stepagent.devstack.rap_demo_server --port 8765`` and point the runtime at it with
``STEPAGENT_RAP_SERVERS=http://127.0.0.1:8765``. Tools:

- ``get_time(timezone="UTC")``: an ordinary call; the answer comes back through the callback.
- ``ticker(count=3, interval_seconds=1.0, associative_every=0)``: a subscription. The call's result says
  it is subscribed; then ``count`` events ``{"tick": n, "of": count}`` follow, each ``interval_seconds``
  apart, and a final ``{"done": true, ...}`` event ends it. Every ``associative_every``-th tick is
  associative (inlined into the subscribing thread); the others are processed in event child threads.
  Cancelling the subscription (``cancel_subscription``) stops the ticks.
- ``pick_color()``: asks the user to choose (a RAP ``user_choice``) and answers with the choice.
- ``connect_account()``: sends an OAuth notice, then answers as if the user had authorised.

Events carry their tick number (and an ``event_id``), so two ticks are never mistaken for a retried
delivery of one (see :mod:`stepagent.rap.receiver` on event dedup).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from stepagent.errors import ToolError
from stepagent.rap.server import DEFERRED, RapCall, RapToolServer, Subscription, current_call

COLORS = ["red", "green", "blue"]


def build_server(public_url: str | None = None) -> RapToolServer:
    """A fresh demo server (tests start one per test)."""
    server = RapToolServer("stepagent-demo", description="Demo tools for stepagent", public_url=public_url)

    @server.tool
    def get_time(timezone: str = "UTC") -> str:
        """The current date and time in a timezone.

        Args:
            timezone: An IANA timezone name, e.g. Europe/Paris.
        """
        try:
            zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ToolError(f"unknown timezone '{timezone}'") from None
        return datetime.now(UTC).astimezone(zone).strftime(f"%Y-%m-%d %H:%M:%S {timezone}")

    @server.tool(annotations={"longRunning": True})
    async def ticker(
        count: int = 3, interval_seconds: float = 1.0, associative_every: int = 0
    ) -> Subscription:
        """Subscribe to a ticker: `count` tick events, then a final event.

        Args:
            count: How many ticks to send before the final event.
            interval_seconds: Seconds between two ticks.
            associative_every: Make every n-th tick associative (handled in this thread); 0 = none.
        """
        if count < 0 or interval_seconds < 0:
            raise ToolError("count and interval_seconds must not be negative")

        async def run(call: RapCall) -> None:
            for n in range(1, count + 1):
                await asyncio.sleep(interval_seconds)
                associative = associative_every > 0 and n % associative_every == 0
                text = json.dumps({"tick": n, "of": count})
                await call.send_event(text, associative=associative, event_id=f"tick-{n}")
            await asyncio.sleep(interval_seconds)
            done = json.dumps({"done": True, "ticks": count})
            await call.send_event(done, associative=True, final=True, event_id="done")

        return Subscription(f"Subscribed to a ticker of {count} ticks.", run)

    @server.tool
    async def pick_color() -> str:
        """Ask the user to pick a color, and return it."""
        index = await current_call().ask_user("Which color?", COLORS, default=0)
        return f"The user picked {COLORS[index]}."

    @server.tool
    async def connect_account() -> object:
        """Connect the user's account (shows an OAuth link first)."""
        call = current_call()
        await call.send_oauth("https://example.com/oauth/authorize?demo=1")
        await call.send_result("Account connected.")
        return DEFERRED

    return server


def main(argv: list[str] | None = None) -> None:
    """Serve the demo tools on ``--host`` (default 127.0.0.1) and ``--port`` (default 8765) until stopped."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    build_server().run(host=args.host, port=args.port)


if __name__ == "__main__":
    main()
