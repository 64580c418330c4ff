"""What a thread's context window decides for a step: whether to compact, and whether an input can be shown.

What it guarantees:

- **Compaction before truncation.** Compaction is decided from the runtime's own estimate of the next
  request — the one truncation uses, scaled by the provider's measured tokens per estimated token
  (``providers/window.py``) — against a limit below truncation's budget (:func:`over_limit`), or from the
  provider's reported usage above the agent's threshold (:func:`should_compact`). A compaction thread
  never compacts itself (:func:`compaction_due`).
- **One request per need.** :func:`compaction_request`'s id names what would be compacted (the summary
  the thread already has) and the lease period, so every trigger between two compactions sends the same
  request and the queue's dedup and the thread's processed ids keep all but the first — including a
  trigger from a step that measured its usage before the last summary landed. Preparing the request
  takes the durable claim (two compactions never overlap); once a lease period has passed without a new
  summary (a compaction child that never finished) the id changes and compaction is tried again.
- **The answer waited for is given.** :func:`owes_after_compaction` says when the compaction that just
  completed was what an unfinished turn waited for, so the step that applies the summary answers.
- **What cannot fit is said.** :func:`input_check` finds a user's text that alone cannot fit beside the
  fixed part of a request: it is kept as a marked stand-in and the turn ends with an error naming sizes.

Nothing here writes; :func:`estimate_scale` reads a compaction thread's parent head at most.
"""

from __future__ import annotations

from collections.abc import Callable

from stepagent.core.agents import ThreadAgent, output_limit, system_prompt
from stepagent.core.completion import model_view
from stepagent.core.history import HistoryManager
from stepagent.history_items import EventItem, Summary, ToolResultItem, UserItem
from stepagent.ids import derived_id
from stepagent.messages import Compaction, InputMessage, TextContent
from stepagent.providers.base import Usage
from stepagent.providers.window import (
    INPUT_NOT_SHOWN,
    INPUT_TOO_LARGE,
    compaction_helps,
    estimate_item,
    input_room,
)
from stepagent.stores.base import ConversationStore, ThreadKind

#: A request to compact a thread and the dedup id it is sent with.
CompactionRequest = tuple[InputMessage, str]


def should_compact(usage: Usage | None, context_window: int, threshold: float = 0.75) -> bool:
    """The reference's rule: total tokens strictly above the threshold of a known context window."""
    return usage is not None and context_window > 0 and usage.total_tokens > context_window * threshold


def compaction_due(
    history: HistoryManager, usage: Usage | None, window: int, threshold: float, *, over: bool = False
) -> bool:
    """Whether the thread should compact: its next request's estimate is ``over`` the limit (the
    estimate truncation uses), or the provider reported usage above the threshold."""
    if not over and not should_compact(usage, window, threshold):
        return False
    return history.info is None or history.info.kind != ThreadKind.COMPACTION


def compaction_request(history: HistoryManager, *, now: float, lease_seconds: float) -> CompactionRequest:
    """The input (and its dedup id) that asks this thread to compact itself, ordered like any other (see
    the module docstring for why its id is what it is)."""
    epoch = int(now // lease_seconds)
    covered = str(history.compacted_up_to or 0)
    thread_id = history.thread_id
    request_id = derived_id("compaction-request", thread_id, covered, str(epoch))
    request = InputMessage(content=TextContent(text=""), group_id=thread_id, synthetic=Compaction())
    return request, request_id


def thread_system_prompt(history: HistoryManager, agent: ThreadAgent) -> str:
    """The system prompt of the thread's requests."""
    return system_prompt(agent.instructions, agent.toolset, root_thread_id=history.root_thread_id)


def over_limit(history: HistoryManager, agent: ThreadAgent, system: str, *, scale: float = 1.0) -> bool:
    """Whether the thread should compact before its next request: over the threshold's share of the
    window, its estimate scaled by the provider's measured ``scale``, or too near truncation's budget
    (``providers/window.py``) — so compaction always comes before truncation."""
    model = agent.info
    if model.context_window <= 0:
        return False
    view = model_view(history.history, model.supports_image_input)
    return compaction_helps(
        system,
        agent.toolset.specs(),
        view,
        model.context_window,
        output_limit(agent),
        agent.compaction_threshold,
        scale=scale,
    )


async def estimate_scale(conversation: ConversationStore, history: HistoryManager) -> float:
    """The provider's tokens per estimated token as last measured on this thread (its head), or — for a
    compaction thread before its first measure — on the parent it summarises; ``1.0``: never measured."""
    info = history.info
    if info is None:
        return 1.0
    if info.estimate_scale is None and info.kind == ThreadKind.COMPACTION and info.parent_id is not None:
        parent = await conversation.get_thread(info.parent_id)
        info = parent if parent is not None else info
    return info.estimate_scale if info.estimate_scale is not None else 1.0


def awaits_model(history: HistoryManager) -> bool:
    """Whether the history ends with something the model has not answered."""
    return bool(history.history) and isinstance(history.history[-1], UserItem | ToolResultItem | EventItem)


def owes_after_compaction(history: HistoryManager) -> bool:
    """Whether the compaction that just completed was what an answer waited for. The step whose request
    could not fit committed an unfinished turn and asked for compaction; the step that started the
    compaction kept the turn unfinished. The summary then either leaves that input visible (the history
    ends awaiting the model) or covers everything (only the summary is left): either way the model
    answers now."""
    items = history.history
    only_summary = len(items) == 1 and isinstance(items[0], Summary)
    return history.compacted_up_to is not None and (only_summary or awaits_model(history))


def input_check(
    history: HistoryManager, agent: Callable[[], ThreadAgent]
) -> Callable[[str], tuple[str, str] | None]:
    """The check of a user's text against the room the window leaves beside the fixed part of a request
    (see :class:`~stepagent.core.prepare.Preparer`): a text that alone cannot fit is not shown — the check
    returns its stand-in and the error. One that fits alone but not beside the summary of a compaction is
    shown with the newest items that fit (``core/completion.py``). ``agent`` is asked on first use."""
    room: list[int] = []

    def check(text: str) -> tuple[str, str] | None:
        chosen = agent()
        window = chosen.info.context_window
        if window <= 0:
            return None
        if not room:
            info = history.info
            scale = info.estimate_scale if info is not None and info.estimate_scale is not None else 1.0
            system = thread_system_prompt(history, chosen)
            room.append(input_room(system, chosen.toolset.specs(), window, output_limit(chosen), scale))
        tokens = estimate_item(UserItem(TextContent(text=text)))
        if room[0] <= 0 or tokens <= room[0]:
            return None  # it fits (a window the fixed part fills is reported by the completion)
        chars = len(text)
        stand_in = INPUT_NOT_SHOWN.format(chars=chars, window=window)
        error = INPUT_TOO_LARGE.format(tokens=tokens, chars=chars, window=window, limit=room[0])
        return stand_in, error

    return check
