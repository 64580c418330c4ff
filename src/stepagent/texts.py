"""Model-facing strings. Exact texts matter: tests and downstream parsers match on them, so they
live in one place."""

from __future__ import annotations

AGENT_INTRO = "You are a helpful agent running on stepagent. You work in conversation threads."
# The guidance and the built-in tools' descriptions go with every request, so each says what it must in as
# few words as it can.
GUIDE_TOOLS = "- Use tools when they help. An asynchronous tool ends your turn; its result wakes you."
GUIDE_SPAWN = (
    "- Give independent sub-tasks to child threads (`spawn_thread`); they report back automatically. Do not "
    "do a child's task yourself."
)
GUIDE_CHILD = (
    "- When a `spawn_thread` result says you are INSIDE a child thread: restate its instructions, ignore the "
    "parent's plans, do the task, `report_to_parent`, then `close_thread` with your own thread ID."
)
GUIDE_CONCISE = "- Be concise."
#: The system prompt when none is configured and every built-in tool is offered. A configured prompt
#: (``STEPAGENT_SYSTEM_PROMPT``) replaces the intro and "be concise"; the tool guidance that applies stays.
DEFAULT_SYSTEM_PROMPT = (
    AGENT_INTRO + "\n\n" + "\n".join((GUIDE_TOOLS, GUIDE_SPAWN, GUIDE_CHILD, GUIDE_CONCISE))
)

#: The system prompt's last line. It names only the root, so every thread of a tree — children and
#: compaction threads included — sends the same system prompt and their requests extend the parent's
#: cached prefix; a child learns its own id from the tool result that starts it ("You are now INSIDE ...").
THREAD_SUFFIX = (
    "\n\nThe root thread ID is `{root_thread_id}`. You are in it unless a tool result says you are now INSIDE "
    "another thread, whose ID is then yours."
)

CHILD_SEED = (
    "You are now INSIDE the thread that you requested to create. Your thread ID is {child}. Your next task "
    "is to exactly follow these instructions: {instructions}\n. Start by repeating to yourself the "
    "instructions, ignoring thinking from the parent context. Make sure to not be confused by the parent "
    "context. If the parent was planning to spawn more threads, you should not."
)
SUBSCRIPTION_CHILD_SPAWN_INSTRUCTIONS = "Spawning thread to process incoming event."
SUBSCRIPTION_CHILD_SEED = (
    "You are now INSIDE the thread for processing the single event above. Your thread ID is {child}, the "
    "parent which is still subscribing is {parent}. Process the single subscription event above, report to "
    "the parent if appropriate, then close the thread after processing this event. Your outputs are NOT "
    "VISIBLE to the user, if you want to show them something, send a report to your parent."
)
COMPACTION_INSTRUCTIONS = (
    "This tool call was synthetically injected by the harness. You are now INSIDE a compaction thread. You "
    "can see the full conversation history inherited from your parent thread, including all ancestor "
    "thread context. Summarize ALL of this content into a concise but comprehensive summary that preserves: "
    "all important context, decisions made, current task progress, relevant code changes and file paths, "
    "and any pending work. Then call close_thread with your thread ID ({child}) and include the summary in "
    "report_to_parent."
)
COMPACTION_TOOL_NAME = "__harness_begin_compaction__"
COMPACTION_COMPLETE = "Compaction complete"
INPUTS_OMITTED = (
    "✦ The new inputs alone fill the model's context window ({window} tokens): the model is shown only the "
    "newest items that fit, after a note saying how many earlier ones were left out"
)

FORBIDDEN_TOOL = (
    "Error: you cannot directly invoke receive_event__injected, invocations will automatically be injected "
    "when events arrive."
)
UNKNOWN_TOOL = "Error: tool '{name}' does not exist"
DISPATCH_FAILED = "Error: Tool call failed: {error}"
IMAGE_OMITTED = "[image omitted: the current model does not support image inputs]"

SPAWN_OK = (
    "Child thread is successfully spawned and has ID: {child}. You will be notified automatically when the "
    "child has anything to report. Make sure that you **do not** do the task assigned to the child thread."
)
SPAWN_STACK_MISMATCH = (
    "Error: child_of {given} does not match the actual thread stack {actual}. You may be confused and think "
    "you are in the parent thread, but you are not. You are in thread {thread}. Do NOT spawn threads — focus "
    "on your assigned task."
)
REPORT = "Report from child thread: {report}"
REPORT_FROM_EVENT_CHILD = (
    "Report from temporary child thread created to process a subscription event:\n{report}"
)
REPORT_ACK = "Report sent to parent thread."
CLOSED_WITH_REPORT = "Child thread with ID {thread} has shut down. Report from child thread: {report}"
CLOSED = "Child thread with ID {thread} has shut down"
EVENT_CHILD_CLOSED = (
    "An event from your subscription {subscription} was processed by a child thread {thread}. The "
    "subscription remains active. Report from the child:\n{report}"
)
PARENT_MESSAGE = "Message from parent thread: {message}"
PARENT_MESSAGE_ACK = "Message sent to child thread."
SUBSCRIPTION_CANCELLED = "Subscription '{id}' cancelled successfully."
APPROVAL_REJECTED = "A person declined this tool call; it did not run."
APPROVAL_REJECTED_WITH_MESSAGE = "A person declined this tool call; it did not run. Their message: {message}"


def rust_debug_list(values: list[str]) -> str:
    """Render a list of strings as the reference does (Rust ``{:?}``): ``["a", "b"]``."""
    escaped = (v.replace("\\", "\\\\").replace('"', '\\"') for v in values)
    return "[" + ", ".join(f'"{v}"' for v in escaped) + "]"
