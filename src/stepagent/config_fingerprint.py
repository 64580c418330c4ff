"""A short, stable fingerprint of an agent's configuration: its :class:`~stepagent.agent_config.AgentConfig`
(prompt, limits, built-in tools, approval patterns, profiles...) and the names of the tools it is offered.

What it guarantees: the same configuration gives the same fingerprint in every process (sets are sorted,
no object addresses or hash seeds enter it), and any change of a field's value or of the tool names gives
another one. Objects that are not plain data (a model provider instance, a pydantic class as an output
schema) count by their type's name only. Each commit records it on its thread's head (``cfg``), so
``stepagent configs`` tells which threads last stepped under an older configuration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

__all__ = ["config_fingerprint"]

#: Hex characters kept of the SHA-256 (48 bits: distinct for any realistic number of deployments).
LENGTH = 12


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, BaseModel):  # the configuration models: their fields, as a dataclass's
        return {name: _plain(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((_plain(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return f"{type(value).__module__}.{type(value).__qualname__}"


def config_fingerprint(agent: Any, tool_names: Iterable[str], model: str | None = None) -> str:
    """The fingerprint of ``agent`` (an ``AgentConfig``) offering ``tool_names`` on ``model``."""
    document = {"agent": _plain(agent), "tools": sorted(set(tool_names)), "model": model}
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:LENGTH]
