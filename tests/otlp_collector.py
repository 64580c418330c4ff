"""An OTLP/HTTP trace collector on loopback for tests: ``POST /v1/traces`` with a protobuf
``ExportTraceServiceRequest`` (decoded with ``opentelemetry-proto``), answered 200; the spans are kept.

``hang=True`` makes a collector that accepts connections and never answers (an unreachable backend that
does not refuse: the worst case for an exporter's time bound)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    service: str
    status_code: int


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass
class Collector:
    url: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: list[dict[str, str]] = field(default_factory=list)

    def trace_ids(self) -> set[str]:
        return {s.trace_id for s in self.spans}


@contextmanager
def otlp_collector(*, hang: bool = False) -> Iterator[Collector]:
    """A collector serving on ``collector.url`` (the ``OTEL_EXPORTER_OTLP_ENDPOINT`` base) until exit."""
    release = threading.Event()
    collector = Collector("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            if hang:
                release.wait()
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            collector.requests.append({k.lower(): v for k, v in self.headers.items()})
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        collector.spans.append(
                            ReceivedSpan(
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                attributes={a.key: _value(a.value) for a in span.attributes},
                                service=str(resource.get("service.name")),
                                status_code=span.status.code,
                            )
                        )
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    collector.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        release.set()
        server.shutdown()
        server.server_close()
