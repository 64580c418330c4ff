"""A cold-start check that the Lambda layer was built for this function's architecture and Python.

``infra/build_layer.py`` writes ``stepagent_layer.json`` (architecture, Python version) at the layer's root.
A layer built for x86_64 on an arm64 function (or the reverse) would otherwise fail on the first native
import (pydantic-core, aiohttp) with an error that does not say why; this names the mismatch and the fix.
Outside Lambda (no ``LAMBDA_TASK_ROOT``), or without the marker (a development install), it does nothing.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Iterable
from pathlib import Path

from stepagent.errors import ConfigurationError

MARKER = "stepagent_layer.json"
_ARCHITECTURES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}


def check_layer(paths: Iterable[str] | None = None, machine: str | None = None) -> None:
    """Raise :class:`ConfigurationError` when the layer on ``paths`` (default ``sys.path``) was built for
    another architecture or Python version than this process runs."""
    if "LAMBDA_TASK_ROOT" not in os.environ:
        return
    for entry in sys.path if paths is None else paths:
        marker = Path(entry or ".") / MARKER
        if marker.is_file():
            break
    else:
        return
    built = json.loads(marker.read_text())
    running = _ARCHITECTURES.get((machine or platform.machine()).lower(), machine or platform.machine())
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if built.get("architecture") != running:
        raise ConfigurationError(
            f"the stepagent layer was built for {built.get('architecture')} but this function runs on "
            f"{running}: rebuild it for the function's architecture (make deploy ARCHITECTURE={running})"
        )
    if built.get("python") != python:
        raise ConfigurationError(
            f"the stepagent layer was built for Python {built.get('python')} but this function runs "
            f"Python {python}"
        )
