"""A loopback MCP server (the official SDK, 2026-07-28) whose ``book`` tool asks the user a question with a
form of every field kind the console fills in (integer, number, boolean, enum, text; required and not),
and the model that calls it: shared by the console's question tests (pages and browser)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import (
    AcceptedElicitation,
    CancelledElicitation,
    DeclinedElicitation,
    Elicit,
    ElicitationResult,
    MCPServer,
    Resolve,
)
from pydantic import BaseModel, Field

from tests.client.deployment import FunctionModel, Step, call, say


class Booking(BaseModel):
    """What ``book`` asks for."""

    guests: int = Field(title="Guests", description="how many people")
    budget: float = Field(default=100.0, title="Budget")
    vegetarian: bool = Field(title="Vegetarian")
    room: Literal["single", "double"] = Field(title="Room")
    note: str = Field(default="", title="Note")


def ask_booking() -> Elicit[Booking]:
    return Elicit("How should I book the room?", Booking)


def build() -> MCPServer:
    server = MCPServer("hotel")

    @server.tool()
    def book(city: str, answer: Annotated[ElicitationResult[Booking], Resolve(ask_booking)]) -> str:
        """Book a room after asking the user the details."""
        match answer:
            case AcceptedElicitation(data=data):
                return (
                    f"booked {data.guests} guests in {city}, budget {data.budget!r}, "
                    f"vegetarian {data.vegetarian}, {data.room} room, note {data.note!r}"
                )
            case DeclinedElicitation():
                return f"not booked in {city}: the user declined"
            case CancelledElicitation():
                return f"not booked in {city}: the user cancelled"
        raise AssertionError(answer)

    return server


def _reply(text: str, request: Any) -> list[Step]:
    if text.startswith(("booked ", "not booked ")):
        return say("Tool says: " + text)
    if text.startswith("book a room"):
        return call("hotel__book", "call-book", city="Lisbon")
    return say("ok")


def booking_model() -> FunctionModel:
    return FunctionModel(_reply)
