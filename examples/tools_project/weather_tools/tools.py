"""Two tools: one asynchronous (run by the tool runner), one inline, both using a third-party package.

``STEPAGENT_TOOLS=weather_tools.tools:toolset`` names the list at the bottom.
"""

from __future__ import annotations

import humanize

from stepagent import tool


@tool
def forecast_size(city: str, bytes_of_data: int) -> str:
    """How much forecast data a city has, in human units.

    Args:
        city: The city name.
        bytes_of_data: The size of the forecast data in bytes.
    """
    return f"The forecast for {city} is {humanize.naturalsize(bytes_of_data)}."


@tool(inline=True)
def ordinal(n: int) -> str:
    """The ordinal of a number (1 -> 1st).

    Args:
        n: The number.
    """
    return humanize.ordinal(n)


toolset = [forecast_size, ordinal]
