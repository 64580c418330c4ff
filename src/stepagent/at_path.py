"""``@path`` setting values: where a relative path is looked for, and how the file is read.

Guarantees: a file is read once, when asked, as UTF-8; an absolute path is taken as is, a relative one
from the first search root (:func:`search_roots`) that has it, so a file shipped inside a tools package is
found in a deployment; a missing file's error names every place it was looked for. Nothing is imported.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from stepagent.errors import ConfigurationError


def search_roots(tools: str | None = None, environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where a relative ``@path`` is looked for, in order: the current directory, ``LAMBDA_TASK_ROOT``,
    then for the user's toolset (``STEPAGENT_TOOLS=package.module:name``) the directory holding its
    top-level package (its import root) and the package directory itself. Nothing is imported."""
    env = os.environ if environ is None else environ
    roots = [Path.cwd()]
    if env.get("LAMBDA_TASK_ROOT"):
        roots.append(Path(env["LAMBDA_TASK_ROOT"]))
    if tools:
        top = tools.split(":", 1)[0].split(".", 1)[0].strip()
        spec = None
        if top:
            try:
                spec = importlib.util.find_spec(top)
            except (ImportError, ValueError):
                spec = None
        if spec is not None:
            locations = list(spec.submodule_search_locations or [])
            if spec.origin and not locations:
                locations = [str(Path(spec.origin).parent)]
            for location in locations:
                package = Path(location)
                roots += [package.parent, package] if spec.submodule_search_locations else [package]
    unique: list[Path] = []
    for root in roots:
        if root not in unique:
            unique.append(root)
    return unique


def read_at_file(value: str, setting: str, roots: Sequence[Path]) -> tuple[str, Path]:
    """The text of the file named by ``value`` (``@path``) and where it was found."""
    raw = value[1:].strip()
    if not raw:
        raise ConfigurationError(f"{setting}={value!r} names no file after '@'")
    path = Path(raw).expanduser()
    candidates = [path] if path.is_absolute() else [root / path for root in roots]
    for candidate in candidates:
        if candidate.is_file():
            try:
                return candidate.read_text(encoding="utf-8"), candidate
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigurationError(f"{setting}: cannot read {candidate}: {exc}") from None
    looked = ", ".join(str(c) for c in candidates)
    raise ConfigurationError(f"{setting}={value!r}: no such file (looked for {looked})")
