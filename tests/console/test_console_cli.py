"""``stepagent run --console`` as a user starts it (a subprocess): the embedded stack with the demo agent,
the console's URL printed with the local-only note, the conversation served, Ctrl-C stops it all; and the
header names the AWS account when the console talks to AWS."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

from stepagent.aws.settings import Settings
from stepagent.console import pages
from stepagent.console.server import describe_target, is_loopback
from tests.integration.test_cli import ROOT, clean_env


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_run_console_serves_the_demo_conversation_until_ctrl_c() -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepagent.cli",
            "run",
            "--console",
            "--port",
            "0",
            "--thread",
            "cli-demo",
            "--say",
            "what time is it?",
        ],
        env=clean_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen: list[str] = []
        assert process.stderr is not None
        while not any(line.startswith("stepagent console: ") for line in seen):
            line = process.stderr.readline()
            assert line, "exited before serving: " + "".join(seen)
            seen.append(line)
        url = next(line for line in seen if line.startswith("stepagent console: ")).split(": ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/c/cli-demo")
        assert "local only" in process.stderr.readline()
        base = url.rsplit("/c/", 1)[0]
        deadline = time.monotonic() + 60
        while True:  # the demo's first step, committed (the --say text was sent before serving)
            page = get_json(base + "/api/c/cli-demo")
            if any(i["kind"] == "tool_call" for i in page["threads"][0]["items"]):
                break
            assert time.monotonic() < deadline, page
            time.sleep(0.2)
        # The demo goes on running while we poll: its first call is get_time (a spawn may already follow).
        calls = [i["name"] for i in page["threads"][0]["items"] if i["kind"] == "tool_call"]
        assert calls[0] == "get_time", calls
        assert "demo-1" not in get_json(base + "/api/conversations")["conversations"][0]["thread_id"]
        # Something in flight when Ctrl-C comes: a request whose body is still to come, its handler waiting
        # for it (the server's "100 Continue" says so). The server gives open requests a moment, then closes
        # them: a slow or stuck client cannot hold the exit.
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as slow_client:
            slow_client.sendall(
                f"POST /c/cli-demo/send HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 1000\r\n".encode()
                + b"Expect: 100-continue\r\nContent-Type: application/x-www-form-urlencoded\r\n\r\n"
            )
            assert slow_client.recv(100).startswith(b"HTTP/1.1 100 Continue")
            process.send_signal(signal.SIGINT)
            assert process.wait(30) == 130
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


class FakeSts:
    async def get_caller_identity(self) -> dict[str, str]:
        return {"Account": "123456789012", "Arn": "arn:aws:iam::123456789012:user/<ann>"}


async def test_the_header_names_the_account_on_aws_and_the_endpoint_locally() -> None:
    aws = Settings.from_env({"AWS_REGION": "eu-west-1"})
    header = await describe_target(aws, "prod", FakeSts())
    assert (
        header == "stack prod · AWS account 123456789012 (arn:aws:iam::123456789012:user/<ann>) · eu-west-1"
    )
    page = pages.layout("t", "", header=header, csrf="c")
    assert "user/&lt;ann&gt;) · eu-west-1</span>" in page  # text: the page escapes it
    local = Settings.from_env({"AWS_ENDPOINT_URL": "http://127.0.0.1:4566"})
    assert await describe_target(local, None, None) == "local endpoint http://127.0.0.1:4566"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
