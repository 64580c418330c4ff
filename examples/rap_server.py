"""A RAP tool server you can copy: one plain tool, one subscription, one tool that asks the user.

Run it::

    python examples/rap_server.py --port 8765

and point stepagent at it::

    STEPAGENT_RAP_SERVERS=http://127.0.0.1:8765
    STEPAGENT_CALLBACK_URL=<your RAP receiver URL>
    STEPAGENT_CALLBACK_SECRET=<a long random string>

Check the manifest with ``curl http://127.0.0.1:8765/.well-known/rap-toolset``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random

from stepagent.errors import ToolError
from stepagent.rap.server import RapCall, RapToolServer, Subscription, current_call

server = RapToolServer("weather", description="Weather reports and alerts")


@server.tool
def forecast(city: str, days: int = 1) -> str:
    """The weather forecast for a city.

    Args:
        city: The city, e.g. Lisbon.
        days: How many days ahead (1-7).
    """
    if not 1 <= days <= 7:
        raise ToolError("days must be between 1 and 7")  # the model sees "Error: days must be ..."
    return f"{city}: sunny for the next {days} day(s)"


@server.tool(annotations={"longRunning": True})
async def storm_alerts(city: str, checks: int = 5, every_seconds: float = 2.0) -> Subscription:
    """Subscribe to storm alerts for a city; cancel with cancel_subscription.

    Args:
        city: The city to watch.
        checks: How many checks before the subscription ends by itself.
        every_seconds: Seconds between checks.
    """

    async def watch(call: RapCall) -> None:
        for n in range(1, checks + 1):
            await asyncio.sleep(every_seconds)
            if random.random() < 0.3:
                # Non-associative (the default): the runtime handles it in a child thread.
                await call.send_event(
                    json.dumps({"city": city, "alert": "storm", "check": n}), event_id=str(n)
                )
        await call.send_event(
            json.dumps({"city": city, "done": True}), associative=True, final=True, event_id="end"
        )

    return Subscription(f"Watching {city} for storms ({checks} checks).", watch)


@server.tool
async def plan_trip(city: str) -> str:
    """Plan a trip, asking the user how they want to travel.

    Args:
        city: Where to go.
    """
    modes = ["train", "plane", "bike"]
    picked = await current_call().ask_user(f"How do you want to get to {city}?", modes, default=0)
    return f"Booked a {modes[picked]} to {city}."


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    options = parser.parse_args()
    server.run(host=options.host, port=options.port)
