"""Answering a RAP ``user_choice``: POST ``{"id": <call id>, "selected": <index>}`` to its ``response_url``.

Guarantees: the index is checked against the choice before anything is sent; dismissal sends the
choice's ``default`` (the RAP ``user_choice`` rule); nothing is cached or replayed — each answer is one POST, and a non-2xx
answer or a network error is raised as :class:`ChoiceAnswerError` for the caller to show.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from stepagent.errors import ChoiceAnswerError
from stepagent.messages import UserChoiceRequired


def choice_from_event(event: Mapping[str, Any]) -> UserChoiceRequired:
    """The choice carried by a ``user_choice_required`` output event (or an equivalent mapping)."""
    return UserChoiceRequired.model_validate({k: v for k, v in event.items() if k != "type"})


async def answer_user_choice(
    choice: UserChoiceRequired, selected: int | None, http: httpx.AsyncClient | None = None
) -> int:
    """POST the answer (``None`` = dismissed: the default); returns the index sent."""
    index = choice.default if selected is None else selected
    if isinstance(index, bool) or not 0 <= index < len(choice.choices):
        raise ChoiceAnswerError(f"choice {index} is out of range: pick 0..{len(choice.choices) - 1}")
    payload = {"id": choice.id, "selected": index}
    try:
        if http is None:
            async with httpx.AsyncClient(timeout=10.0) as client:
                response = await client.post(choice.response_url, json=payload)
        else:
            response = await http.post(choice.response_url, json=payload)
    except httpx.HTTPError as exc:
        raise ChoiceAnswerError(f"could not reach {choice.response_url}: {exc}") from exc
    if not 200 <= response.status_code < 300:
        raise ChoiceAnswerError(
            f"{choice.response_url} refused the answer: HTTP {response.status_code} {response.text[:200]}"
        )
    return index
