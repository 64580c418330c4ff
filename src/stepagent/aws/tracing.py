"""X-Ray spans for the steps of a worker invocation, safe for the concurrent asyncio tasks of one batch.

The X-Ray SDK keeps one stack of open (sub)segments per thread; in Lambda every step of a batch runs as an
asyncio task on the same thread, so ``begin_subsegment``/``end_subsegment`` from concurrent steps would
interleave on that one stack and end each other's subsegments ("Already ended segment"). That is why the
handler does not auto-patch, and why this tracer never touches the stack.

Guarantees:

- :class:`XRayTracer` creates each span as a subsegment *object*, attached as a child of the entity that
  is current when it starts (the powertools ``## handler`` subsegment of the invocation, else the
  Lambda facade segment) — which no step changes, since no span is pushed — and annotated (X-Ray
  annotations are indexed: ``thread_id``, ``tool_call_id``, ``model``, ``tool``). Ending a span closes only
  that object, so spans of different tasks are independent; each is sent with its parent when the
  handler's subsegment ends (or streamed by the SDK), or on its own at its end when its parent is the
  segment.
- When tracing is disabled, the invocation is not sampled, or there is no segment, a span is a no-op;
  any SDK error surfaces to :func:`stepagent.tracing.traced`, which logs it and never fails the step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class _NoSpan:
    def record_error(self, error: BaseException) -> None:
        return None

    def end(self) -> None:
        return None


class _XRaySpan:
    def __init__(self, subsegment: Any, send: Any = None) -> None:
        self._subsegment = subsegment
        self._send = send  # set when the parent is the segment itself (nothing else would send it)

    def record_error(self, error: BaseException) -> None:
        self._subsegment.add_exception(error, [])

    def end(self) -> None:
        self._subsegment.close()
        if self._send is not None:
            self._send(self._subsegment)
            self._subsegment.parent_segment.remove_subsegment(self._subsegment)


class XRayTracer:
    """The :class:`~stepagent.tracing.Tracer` port on an X-Ray recorder (powertools ``Tracer.provider``)."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    def start_span(self, name: str, annotations: Mapping[str, str]) -> _XRaySpan | _NoSpan:
        from aws_xray_sdk import global_sdk_config  # type: ignore[import-untyped]
        from aws_xray_sdk.core.models.segment import Segment  # type: ignore[import-untyped]
        from aws_xray_sdk.core.models.subsegment import Subsegment  # type: ignore[import-untyped]

        if not global_sdk_config.sdk_enabled():
            return _NoSpan()
        parent = self.recorder.get_trace_entity()
        if parent is None or not getattr(parent, "sampled", False):
            return _NoSpan()
        segment = parent if isinstance(parent, Segment) else getattr(parent, "parent_segment", None)
        if segment is None:
            return _NoSpan()
        subsegment = Subsegment(name, "remote" if name == "model" else "local", segment)
        parent.add_subsegment(subsegment)
        for key, value in annotations.items():
            subsegment.put_annotation(key, value)
        # Under the handler's subsegment it is sent with it; directly under the segment, send it at its end.
        direct = parent is segment
        return _XRaySpan(subsegment, self.recorder.emitter.send_entity if direct else None)
