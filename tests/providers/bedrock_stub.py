"""A loopback stand-in for the Bedrock runtime endpoint, and AWS event-stream encoding for its answers.

The server (stdlib ``ThreadingHTTPServer`` on 127.0.0.1, a free port, in a daemon thread) records every
request body and answers ``converse-stream`` with a binary ``application/vnd.amazon.eventstream`` body
encoded per the AWS event-stream format (prelude, headers, payload, CRC32s), so aioboto3's real parser
decodes it. ``cut_after`` sends only that many bytes of the body and drops the connection.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return bytes([len(raw_name)]) + raw_name + b"\x07" + len(raw_value).to_bytes(2, "big") + raw_value


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    encoded = b"".join(_header(k, v) for k, v in headers.items())
    total = 12 + len(encoded) + len(payload) + 4
    prelude = total.to_bytes(4, "big") + len(encoded).to_bytes(4, "big")
    message = prelude + binascii.crc32(prelude).to_bytes(4, "big") + encoded + payload
    return message + binascii.crc32(message).to_bytes(4, "big")


def _wire(value: Any) -> Any:
    """Fixture JSON → wire JSON: ``{"__bytes__": b64}`` blobs are base64 strings on the wire."""
    if isinstance(value, dict):
        if set(value) == {"__bytes__"}:
            return value["__bytes__"]
        return {k: _wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire(v) for v in value]
    return value


def parsed(value: Any) -> Any:
    """Fixture JSON → what botocore yields: ``{"__bytes__": b64}`` blobs become bytes."""
    if isinstance(value, dict):
        if set(value) == {"__bytes__"}:
            return base64.b64decode(value["__bytes__"])
        return {k: parsed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [parsed(v) for v in value]
    return value


def encode_event(event: dict[str, Any]) -> bytes:
    ((key, body),) = event.items()
    if key.endswith("Exception"):
        headers = {":message-type": "exception", ":exception-type": key, ":content-type": "application/json"}
    else:
        headers = {":event-type": key, ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, json.dumps(_wire(body), ensure_ascii=False).encode())


def load_events(name: str) -> list[dict[str, Any]]:
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@dataclass
class BedrockStub:
    url: str = ""
    bodies: list[bytes] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    #: The client's (host, port) of every request: equal for requests over one kept-alive connection.
    peers: list[tuple[str, int]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    error_body: dict[str, Any] = field(default_factory=dict)
    error_headers: dict[str, str] = field(default_factory=dict)
    cut_after: int | None = None

    def body(self) -> bytes:
        return b"".join(encode_event(event) for event in self.events)


def _handler(stub: BedrockStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            stub.bodies.append(self.rfile.read(length))
            stub.paths.append(self.path)
            stub.peers.append(self.client_address[:2])
            if stub.status != 200:
                payload = json.dumps(stub.error_body).encode()
                self.send_response(stub.status)
                self.send_header("content-type", "application/json")
                self.send_header("x-amzn-errortype", str(stub.error_body.get("__type", "")))
                for key, value in stub.error_headers.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            body = stub.body()
            self.send_response(200)
            self.send_header("content-type", "application/vnd.amazon.eventstream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            if stub.cut_after is not None:
                self.wfile.write(body[: stub.cut_after])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    return Handler


def serve() -> Iterator[BedrockStub]:
    stub = BedrockStub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(stub))
    server.daemon_threads = True
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
