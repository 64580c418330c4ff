"""A turn's spans as a tree in the terminal (``stepagent run --trace``): no tracing backend needed.

Guarantees: :func:`render` draws every span it is given exactly once, one tree per trace (a turn), in
start order; a span whose parent is not among them (the parent lives in another process, or was not
recorded) is drawn as a root of its trace. Each line names the span, its key GenAI attributes (thread,
tokens, tool call id) and its duration.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan

_SHOWN = (
    ("stepagent.thread_id", "thread"),
    ("gen_ai.agent.name", "agent"),
    ("gen_ai.usage.input_tokens", "in"),
    ("gen_ai.usage.output_tokens", "out"),
    ("gen_ai.usage.cache_read.input_tokens", "cache_read"),
    ("gen_ai.tool.call.id", "call"),
)


def _label(span: ReadableSpan) -> str:
    attributes = span.attributes or {}
    details = [
        f"{short}={attributes[key]!s}" for key, short in _SHOWN if attributes.get(key) not in (None, 0)
    ]
    if span.status is not None and not span.status.is_ok:
        details.append("ERROR")
    millis = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
    return " ".join([span.name, *details, f"{millis:.0f} ms"])


def render(spans: Sequence[ReadableSpan]) -> list[str]:
    """The lines of one tree per trace (see the module docstring)."""
    ordered = sorted(spans, key=lambda s: s.start_time or 0)
    ids = {s.context.span_id for s in ordered}
    children: dict[int, list[ReadableSpan]] = {}
    traces: dict[int, list[ReadableSpan]] = {}
    for span in ordered:
        parent = span.parent.span_id if span.parent is not None else None
        if parent in ids and parent is not None:
            children.setdefault(parent, []).append(span)
        else:
            traces.setdefault(span.context.trace_id, []).append(span)
    lines: list[str] = []

    def draw(span: ReadableSpan, prefix: str, last: bool, root: bool) -> None:
        lines.append(_label(span) if root else f"{prefix}{'└─ ' if last else '├─ '}{_label(span)}")
        below = children.get(span.context.span_id, [])
        inner = "" if root else prefix + ("   " if last else "│  ")
        for index, child in enumerate(below):
            draw(child, inner, index == len(below) - 1, False)

    for trace_id, roots in traces.items():
        count = sum(1 for s in ordered if s.context.trace_id == trace_id)
        lines.append(f"trace {trace_id:032x} ({count} spans)")
        for root in roots:
            draw(root, "", True, True)
    return lines
