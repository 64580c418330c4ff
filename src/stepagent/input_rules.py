"""The rules every untrusted input must meet, checked once at the boundary (pure, no I/O).

An input that breaks one can never succeed on retry, so it is rejected as
:class:`~stepagent.errors.MalformedMessageError` or :class:`~stepagent.errors.PayloadTooLargeError` (DLQ
copy and an ``error`` event in the worker, a 4xx from the RAP receiver) — never left to fail later, inside a
step, as something that looks transient (a ``RecursionError`` from a deep structure, a
``UnicodeEncodeError`` from a lone surrogate, a DynamoDB key over its size limit). The rules, for every
field of the message (content, metadata, ``display_as``, synthetic, ids):

- **JSON**: standard JSON only — no ``NaN``/``Infinity``, no number that does not fit a double, no integer
  over 4,300 digits.
- **Depth**: at most :data:`MAX_DEPTH` nested arrays/objects, counting the message object itself.
- **Characters**: every string, keys included, is Unicode text that UTF-8 and SQS can carry: no
  surrogate code points (U+D800..U+DFFF, which JSON can spell as ``"\\ud800"`` but UTF-8 cannot encode) and
  no U+FFFE/U+FFFF (which SQS refuses).
- **Size**: the whole message at most :data:`MAX_MESSAGE_BYTES` UTF-8 bytes (bigger queue bodies travel by
  claim check, so this is about what one step holds); ``metadata`` — echoed in every output event of its
  root — at most :data:`MAX_METADATA_BYTES` as JSON.
- **Ids** (``id``, ``group_id``, a tool result's ``id``/``call_id``, a synthetic ``tool_call_id`` and
  ``child_thread_id``): at most :data:`MAX_ID_BYTES` UTF-8 bytes, as they become parts of DynamoDB keys.
- **Thread ids from outside** (:func:`check_group_id`, what the HTTP API accepts): SQS's own rule for a
  FIFO ``MessageGroupId``, which a thread id becomes — 1 to :data:`MAX_GROUP_ID_CHARS` characters, each
  an ASCII letter, digit or punctuation mark (no space, nothing outside ASCII).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from stepagent.errors import MalformedMessageError, PayloadTooLargeError

MAX_DEPTH = 64
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_METADATA_BYTES = 256 * 1024
MAX_ID_BYTES = 512
MAX_GROUP_ID_CHARS = 128

# SQS: "alphanumeric characters (a-z, A-Z, 0-9) and punctuation (!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~)" —
# exactly the printable ASCII characters but the space.
_GROUP_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_GROUP_ID_CHARS}}}")

_BAD_CHARACTERS = re.compile("[\ud800-\udfff\ufffe\uffff]")


def _no_constants(name: str) -> Any:
    raise MalformedMessageError(f"the body is not standard JSON: {name} is not a JSON number")


def load_json(body: str | bytes, what: str = "message body") -> Any:
    """``json.loads`` that turns every way a body can be unparseable into ``MalformedMessageError``
    (including nesting too deep for the parser, which raises ``RecursionError``)."""
    try:
        return json.loads(body, parse_constant=_no_constants)
    except MalformedMessageError:
        raise
    except RecursionError:
        raise MalformedMessageError(f"the {what} is nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise MalformedMessageError(f"the {what} is not valid UTF-8") from None
    except ValueError as exc:  # JSONDecodeError, or an integer over Python's digit limit
        raise MalformedMessageError(f"the {what} is not valid JSON: {exc}") from None


def _path(parts: tuple[str | int, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "(message)"


def _bad_character(text: str) -> str | None:
    found = _BAD_CHARACTERS.search(text)
    if found is None:
        return None
    code = ord(found.group())
    kind = "a lone surrogate" if 0xD800 <= code <= 0xDFFF else "a noncharacter"
    return f"contains {kind} (U+{code:04X}), which is not valid text"


def check_json(value: Any, what: str = "message") -> None:
    """Depth, characters and numbers of a parsed JSON value, walked without recursion."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            problem = _bad_character(node)
            if problem is not None:
                raise MalformedMessageError(f"invalid {what}: {_path(path)} {problem}", field=_path(path))
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise MalformedMessageError(
                    f"invalid {what}: {_path(path)} is a number out of range", field=_path(path)
                )
        elif isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                raise MalformedMessageError(
                    f"invalid {what}: {_path(path)} is nested deeper than {MAX_DEPTH} levels",
                    field=_path(path),
                )
            if isinstance(node, dict):
                for key, child in node.items():
                    if not isinstance(key, str):
                        raise MalformedMessageError(f"invalid {what}: {_path(path)} has a non-string key")
                    problem = _bad_character(key)
                    if problem is not None:
                        raise MalformedMessageError(f"invalid {what}: a key in {_path(path)} {problem}")
                    stack.append((child, depth + 1, (*path, key)))
            else:
                stack.extend((child, depth + 1, (*path, index)) for index, child in enumerate(node))


def check_size(body: str | bytes, what: str = "message") -> None:
    """Raise :class:`~stepagent.errors.PayloadTooLargeError` if ``body`` is over :data:`MAX_MESSAGE_BYTES`
    (UTF-8)."""
    size = len(body) if isinstance(body, bytes) else len(body.encode("utf-8", "surrogatepass"))
    if size > MAX_MESSAGE_BYTES:
        raise PayloadTooLargeError(f"the {what} is {size} bytes, over the {MAX_MESSAGE_BYTES}-byte limit")


def check_id(value: str | None, field: str) -> None:
    """Raise :class:`~stepagent.errors.MalformedMessageError` if id ``field`` is over :data:`MAX_ID_BYTES`
    (UTF-8)."""
    if value is not None and len(value.encode("utf-8")) > MAX_ID_BYTES:
        raise MalformedMessageError(
            f"invalid input message: {field}: longer than {MAX_ID_BYTES} bytes", field=field
        )


def check_group_id(value: str, field: str) -> None:
    """Raise :class:`~stepagent.errors.MalformedMessageError` unless ``value`` may be an SQS FIFO
    ``MessageGroupId`` (see the module docstring)."""
    if _GROUP_ID.fullmatch(value) is None:
        raise MalformedMessageError(
            f"invalid {field} {value[:140]!r}: it must be 1 to {MAX_GROUP_ID_CHARS} characters, each an ASCII "
            "letter, digit or punctuation mark (!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~; no spaces)",
            field=field,
        )


def check_metadata(metadata: Any) -> None:
    """Raise :class:`~stepagent.errors.PayloadTooLargeError` if ``metadata`` is over
    :data:`MAX_METADATA_BYTES` as JSON."""
    if metadata is None:
        return
    size = len(json.dumps(metadata, ensure_ascii=False).encode("utf-8"))
    if size > MAX_METADATA_BYTES:
        raise PayloadTooLargeError(
            f"invalid input message: metadata is {size} bytes as JSON, over the {MAX_METADATA_BYTES}-byte limit"
        )
