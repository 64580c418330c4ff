"""The chat at a terminal, on top of :class:`~stepagent.client.Client`: ``stepagent chat`` and ``tail``
against a deployment, and ``stepagent run`` on its local stack — one code path for all three.

What a person gets:

- **Committed output as lines**: ``>`` model text, ``⚙`` a tool call, ``←`` its result, ``✉`` a report or
  event, ``?`` a question, ``🔑`` a link to open, ``!`` an error; a child thread's lines start with
  ``[child <id>]`` (the one rendering of :func:`stepagent.transcript.item_line`, which ``stepagent
  history`` shares).
- **A clean prompt while the agent works** (at a terminal): input is read concurrently, character by
  character, on the prompt line, which stays the last line; output lines and the status line above it are
  redrawn around what you are typing. Typing a message while the agent works sends it at once (it
  interrupts a pending tool call, as the runtime does).
- **Progress**: a status line with a spinner and what is happening — the model thinking, the text it is
  writing (the live partial text), the tool that is running, a question waiting for you.
- **Questions answered here**: when a tool asks you to choose, the next line you type is the answer (the
  number or the text of a choice; an empty line takes the default) and is delivered to the tool.
- **A tool's questions answered here** (MCP elicitation): ``? Why should I delete it?`` with what the
  form wants; the next line you type is the answer — a JSON object (or, for a one-field form, the value
  itself), ``n`` to decline, ``c`` to cancel; for a page to open, ``y`` once you have.
- **Approvals asked here**: a tool call that waits for a person shows
  ``⏸ send_email({...})  approve? [y]es [n]o [e]dit [r]espond``; the next line you type decides it —
  ``y``, ``n [why]``, ``e {"new": "arguments"}``, ``r <the answer the model gets instead>`` (with
  ``--say``, the line is read from standard input; at its end the call keeps waiting). The chat keeps
  asking until a decision is accepted: a decision the runtime refuses (invalid edited arguments) is shown
  with its reason and the question comes back; lines typed meanwhile wait for the outcome, so none of them
  is taken for a message (which would interrupt the call).

- **What each turn spent**: once the tree is idle again, a quiet line with the tokens, model calls and
  dollars (when the model's prices are known) since the last one: ``· turn: 1,734 in · 41 out · 2 model
  calls · $0.0058`` (``chat``, ``run`` and ``tail``).

Without a terminal (pipes, ``--say``) the same lines are printed with no prompt, status or escapes.

Why the line editor is hand-written rather than ``prompt_toolkit`` (measured with prompt_toolkit 3.0.52 on
Python 3.13, the medians of 11 fresh interpreters): its asyncio support (``prompt_async`` with
``patch_stdout``) would fit the loop, and it would add cursor keys and history, but importing those two
costs ~117 ms CPU, a fifth more than this module with the client under it (~540 ms), where ``termios``,
``tty`` and ``codecs`` cost ~9 ms; it and ``wcwidth`` are ~3 MB of source in every deployment (the Lambda
layer installs stepagent's dependencies) for a screen no Lambda draws; and it owns the screen: it asks
the terminal for the cursor position at start (a terminal that does not answer gets "WARNING: your
terminal doesn't support cursor position requests (CPR)." in the chat) and draws the prompt with cursor
moves, so the status line this module keeps above the prompt would have to move into its layout. What is
written here instead is small: a line buffer with backspace, Ctrl-U and Ctrl-D, incremental UTF-8, and
redraws under one lock (:class:`Screen`, :class:`LineInput`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from stepagent.client.api import Client, ClientError
from stepagent.client.decisions import decision_outcome
from stepagent.transcript import Item, clip, item_line
from stepagent.usage import TokenTotals

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
PROMPT = "you > "
_CLEAR_LINE = "\r\x1b[K"
_UP = "\x1b[1A"


APPROVAL_QUESTION = "approve? [y]es [n]o [e]dit [r]espond"
APPROVAL_HELP = 'answer y, n [why], e {"the": "new arguments"} or r <the answer the model gets instead>'


def spent_line(before: TokenTotals, after: TokenTotals) -> str | None:
    """``· turn: 1,234 in · 56 out · 2 model calls · $0.0012`` for what was spent between two totals
    (``None``: no model call in between)."""
    calls = after.completions - before.completions
    if calls <= 0:
        return None
    parts = [
        f"{after.input_tokens - before.input_tokens:,} in",
        f"{after.output_tokens - before.output_tokens:,} out",
    ]
    cached = (after.cache_read_tokens - before.cache_read_tokens) + (
        after.cache_write_tokens - before.cache_write_tokens
    )
    if cached:
        parts.append(f"{cached:,} cache")
    parts.append(f"{calls} model call{'s' if calls != 1 else ''}")
    if after.cost_usd is not None:
        parts.append(f"${after.cost_usd - (before.cost_usd or 0.0):,.4f}")
    return "· turn: " + " · ".join(parts)


def approval_line(item: Item, root: str) -> str:
    """The question shown for a call waiting for a person's decision."""
    thread = str(item.get("thread_id", ""))
    who = "" if thread == root else f"[child {thread[:8]}] "
    args = json.dumps(item.get("args") or {}, ensure_ascii=False, separators=(",", ":"))
    return f"{who}⏸ {item.get('name')}({clip(args, 200)})  {APPROVAL_QUESTION}"


INPUT_HELP = "answer with a JSON object of the form's fields (or the value of its one field), n to decline, c to cancel"


def input_hint(item: Item) -> str:
    """What a tool's question wants, in one line: the form's fields, or the page to open."""
    if item.get("url"):
        return f"  open {item.get('url')}, then answer y (done), n (decline) or c (cancel)"
    schema = item.get("requested_schema") or {}
    fields = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    shown = ", ".join(
        f"{name}{'' if name in required else '?'}: {spec.get('type', 'any') if isinstance(spec, dict) else 'any'}"
        for name, spec in fields.items()
    )
    return f"  {{{shown}}}  — {INPUT_HELP}"


def parse_input_answer(line: str, item: Item) -> tuple[str, dict[str, Any] | None]:
    """``(action, content)`` for a typed answer to a tool's question; ``ValueError`` (with what to type)
    for a line that is none of the answers."""
    text = line.strip()
    lowered = text.lower()
    if lowered in ("n", "no", "decline"):
        return "decline", None
    if lowered in ("c", "cancel"):
        return "cancel", None
    if item.get("url"):
        if lowered in ("y", "yes", "ok", "done", ""):
            return "accept", None
        raise ValueError("answer y (done), n (decline) or c (cancel)")
    if text.startswith("{"):
        try:
            content = json.loads(text)
        except ValueError as error:
            raise ValueError(f"that is not a JSON object ({error}); {INPUT_HELP}") from None
        if not isinstance(content, dict):
            raise ValueError(INPUT_HELP)
        return "accept", content
    fields = (item.get("requested_schema") or {}).get("properties") or {}
    if len(fields) == 1 and text:
        [(name, spec)] = fields.items()
        value: Any = text
        if isinstance(spec, dict) and spec.get("type") in ("number", "integer", "boolean"):
            try:
                value = json.loads(lowered)
            except ValueError:
                raise ValueError(f"{name} must be a {spec['type']}; {INPUT_HELP}") from None
        return "accept", {name: value}
    raise ValueError(INPUT_HELP)


def parse_decision(line: str) -> tuple[str, dict[str, Any] | None, str | None]:
    """``(decision, args, message)`` for a typed answer to an approval question; ``ValueError`` (with what
    to type) for anything else."""
    text = line.strip()
    word, _, rest = text.partition(" ")
    word, rest = word.lower(), rest.strip()
    if word in ("y", "yes", "approve"):
        return "approve", None, None
    if word in ("n", "no", "reject"):
        return "reject", None, rest or None
    if word in ("e", "edit"):
        try:
            args = json.loads(rest)
        except json.JSONDecodeError:
            raise ValueError('edit needs the new arguments as JSON: e {"to": "..."}') from None
        if not isinstance(args, dict):
            raise ValueError('edit needs a JSON object of arguments: e {"to": "..."}')
        return "edit", args, None
    if word in ("r", "respond"):
        if not rest:
            raise ValueError("respond needs the answer the model gets instead: r <text>")
        return "respond", None, rest
    raise ValueError(APPROVAL_HELP)


@dataclass
class Screen:
    """The terminal: lines above, a transient status line, the prompt line (interactive only)."""

    out: TextIO
    interactive: bool
    prompt_shown: bool = False
    buffer: str = ""
    status: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _width(self) -> int:
        return max(20, shutil.get_terminal_size((100, 24)).columns - 1)

    def _erase(self) -> str:
        if not self.interactive:
            return ""
        text = _CLEAR_LINE if self.prompt_shown else ""
        if self.status is not None:
            text += (_UP + _CLEAR_LINE) if self.prompt_shown else _CLEAR_LINE
        return text

    def _draw(self) -> str:
        if not self.interactive:
            return ""
        text = ""
        if self.status is not None:
            text += self.status[: self._width()] + ("\n" if self.prompt_shown else "")
        if self.prompt_shown:
            text += PROMPT + self.buffer
        return text

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def line(self, text: str) -> None:
        """Print a line above the status and prompt."""
        with self.lock:
            self._write(self._erase() + text + "\n" + self._draw())

    def set_status(self, status: str | None) -> None:
        if not self.interactive or status == self.status:
            return
        with self.lock:
            erase = self._erase()
            self.status = status
            self._write(erase + self._draw())

    def show_prompt(self, shown: bool) -> None:
        if not self.interactive or shown == self.prompt_shown:
            return
        with self.lock:
            erase = self._erase()
            self.prompt_shown = shown
            self._write(erase + self._draw())

    def typed(self, buffer: str) -> None:
        with self.lock:
            erase = self._erase()
            self.buffer = buffer
            self._write(erase + self._draw())

    def close(self) -> None:
        with self.lock:
            self._write(self._erase())
            self.status, self.prompt_shown = None, False


# ---- input ---------------------------------------------------------------------------------------------


class LineInput:
    """Lines from stdin as an async iterator: at a terminal, read key by key on our prompt line (cbreak
    mode, restored on exit); otherwise whole lines from a daemon thread. ``None`` ends the input."""

    def __init__(self, screen: Screen, stdin: TextIO = sys.stdin) -> None:
        self.screen = screen
        self.stdin = stdin
        self.lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._restore: Callable[[], None] | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.screen.interactive and self.stdin.isatty():
            self._start_keys(loop)
        else:
            threading.Thread(
                target=self._read_lines, args=(loop,), name="stepagent-input", daemon=True
            ).start()

    def _read_lines(self, loop: asyncio.AbstractEventLoop) -> None:
        for raw in self.stdin:
            loop.call_soon_threadsafe(self.lines.put_nowait, raw.rstrip("\n"))
        loop.call_soon_threadsafe(self.lines.put_nowait, None)

    def _start_keys(self, loop: asyncio.AbstractEventLoop) -> None:
        import termios
        import tty

        fd = self.stdin.fileno()
        saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)  # no echo, no line buffering; Ctrl-C still interrupts
        decoder = _Utf8()

        def restore() -> None:
            loop.remove_reader(fd)
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)

        self._restore = restore
        self.screen.show_prompt(True)

        def on_key() -> None:
            data = os.read(fd, 1024)
            if not data:
                self.lines.put_nowait(None)
                return
            for char in decoder.feed(data):
                self._key(char)

        loop.add_reader(fd, on_key)

    def _key(self, char: str) -> None:
        screen = self.screen
        if char in ("\r", "\n"):
            line, screen.buffer = screen.buffer, ""
            screen.typed("")
            self.lines.put_nowait(line)
        elif char in ("\x7f", "\b"):
            screen.typed(screen.buffer[:-1])
        elif char == "\x15":  # Ctrl-U
            screen.typed("")
        elif char == "\x04":  # Ctrl-D
            if not screen.buffer:
                self.lines.put_nowait(None)
        elif char == "\x1b" or not char.isprintable():
            return  # arrows and other escapes: not supported, ignored
        else:
            screen.typed(screen.buffer + char)

    def stop(self) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None

    async def __aiter__(self) -> AsyncIterator[str]:
        while (line := await self.lines.get()) is not None:
            yield line


class _Utf8:
    """Incremental UTF-8 decoding of key bytes."""

    def __init__(self) -> None:
        import codecs

        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)


# ---- the chat -----------------------------------------------------------------------------------------


@dataclass
class Activity:
    """What the tree is doing, from the items seen: for the status line."""

    root: str
    busy: bool = False
    running: dict[str, tuple[str, str]] = field(default_factory=dict)  # call id -> (thread, tool)
    partial: dict[str, Item] = field(default_factory=dict)  # thread -> its partial item
    choice: Item | None = None
    approval: Item | None = None  # a tool call waiting for a person's decision
    names: dict[str, str] = field(default_factory=dict)  # call id -> tool, of the calls seen
    asking: Item | None = None  # a tool's question waiting for the person's answer
    signing_in: dict[str, Item] = field(default_factory=dict)  # call id -> its sign-in link, while it waits
    tick: int = 0

    def see(self, item: Item) -> None:
        kind = item.get("kind")
        thread = str(item.get("thread_id"))
        if kind == "idle":
            self.busy = False
            self.running.clear()
            self.partial.clear()
            return
        self.busy = True
        if kind == "partial":
            if item.get("phase"):
                self.partial[thread] = item
            else:
                self.partial.pop(thread, None)
            return
        if "order" in item:
            self.partial.pop(thread, None)  # committed rows replace the partial text
        if kind == "tool_call":
            self.names[str(item.get("tool_call_id"))] = str(item.get("name"))
            if item.get("approval") == "pending":
                self.approval = item
            else:
                self.running[str(item.get("tool_call_id"))] = (thread, str(item.get("name")))
        elif kind == "approval":
            if self.approval is not None and self.approval.get("tool_call_id") == item.get("tool_call_id"):
                self.approval = None
            if item.get("approval") in ("approved", "edited"):
                call = str(item.get("tool_call_id"))
                self.running[call] = (thread, self.names.get(call, call))
        elif kind in ("tool_result", "event"):
            self._answered(str(item.get("tool_call_id")))
        elif kind == "choice":
            self.choice = item
        elif kind == "input":
            self.asking = item
        elif kind == "oauth":
            self.signing_in[str(item.get("tool_call_id"))] = item

    def _answered(self, call_id: str) -> None:
        """A call got its result (or was interrupted): nothing of it waits for the person any more."""
        if self.approval is not None and self.approval.get("tool_call_id") == call_id:
            self.approval = None  # interrupted
        if self.asking is not None and self.asking.get("tool_call_id") == call_id:
            self.asking = None  # answered (here or elsewhere) or interrupted
        self.running.pop(call_id, None)
        self.signing_in.pop(call_id, None)  # signed in: the call went on
        if self.choice is not None and self.choice.get("choice_id") == call_id:
            self.choice = None  # answered (here or elsewhere) or interrupted

    def status(self, width: int) -> str | None:
        if self.choice is not None:
            return "? waiting for your answer (a number or a choice; empty line: the default)"
        if self.asking is not None:
            return f"? waiting for your answer: {self.asking.get('text')}"
        if self.approval is not None:
            return f"⏸ waiting for your decision on {self.approval.get('name')}: {APPROVAL_QUESTION}"
        if self.signing_in:
            call = next(reversed(self.signing_in))
            return f"🔑 {self.names.get(call, 'a tool')} waits for you to sign in: open the link above"
        if not self.busy:
            return None
        self.tick += 1
        spin = SPINNER[self.tick % len(SPINNER)]
        for thread, item in self.partial.items():
            who = "agent" if thread == self.root else f"[child {thread[:8]}]"
            phase = item.get("phase")
            if phase == "writing":
                room = max(10, width - len(who) - 16)
                text = " ".join(str(item.get("text", "")).split())
                return f"{spin} {who} is writing: " + (text if len(text) <= room else "…" + text[-room:])
            if phase == "calling" and item.get("tool"):
                return f"{spin} {who} is calling {item.get('tool')}"
            return f"{spin} {who} is {phase}"
        if self.running:
            thread, name = next(reversed(self.running.values()))
            who = "agent" if thread == self.root else f"[child {thread[:8]}]"
            return f"{spin} {who}: running {name}"
        return f"{spin} working"


@dataclass
class Chat:
    """One conversation at the terminal."""

    client: Client
    thread: str
    screen: Screen
    activity: Activity
    errors: int = 0
    quiet: asyncio.Event = field(default_factory=asyncio.Event)
    #: Whether approvals are answered here (``chat``, ``run``) or only shown (``tail``).
    decides: bool = True
    _sent: list[str] = field(default_factory=list)
    #: The call our last decision was about and that decision's message id, until the runtime accepted
    #: or refused it (:meth:`_follow_decision`).
    deciding: tuple[Item, str] | None = None
    #: Set when no decision of ours is waiting for its outcome.
    decided: asyncio.Event = field(default_factory=asyncio.Event)
    #: What the tree had spent when the last turn's usage line was printed (``None``: not read yet).
    spent: TokenTotals | None = None
    #: ``(thread, order)`` of the waiting calls already shown (``tail --history`` reads one from the
    #: transcript and again from the tree as it follows it).
    _shown_waiting: set[tuple[str, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.decided.set()

    def show(self, item: Item) -> None:
        self.activity.see(item)
        if self.deciding is not None and self._follow_decision(item):
            return
        kind = item.get("kind")
        if kind == "idle":
            self.quiet.set()
        else:
            self.quiet.clear()
        if kind == "tool_call" and item.get("approval") == "pending":
            key = (str(item.get("thread_id")), int(item.get("order", -1)))
            if key in self._shown_waiting:
                self.refresh()
                return  # already on screen, with its question or hint
            self._shown_waiting.add(key)
        if kind == "user" and item.get("thread_id") == self.thread and item.get("text") in self._sent:
            self._sent.remove(str(item.get("text")))
            return  # our own message, already on screen
        if kind == "error":
            self.errors += 1
        line = item_line(item, self.thread)
        if line is not None:
            self.screen.line(line)
        if kind == "input":
            if self.decides:
                self.screen.line(input_hint(item))
            else:
                self.screen.line(
                    f"  answer it with Client.answer_input({item.get('thread_id')!r}, "
                    f"{item.get('tool_call_id')!r}, ...) or POST .../elicitations"
                )
        if kind == "tool_call" and item.get("approval") == "pending":
            if self.decides:
                self.screen.line(approval_line(item, self.thread))
            else:
                self.screen.line(
                    f"⏸ {item.get('name')} waits for a person: stepagent approve {item.get('thread_id')} "
                    f"{item.get('tool_call_id')} [--reject [MSG] | --edit JSON | --respond TEXT]"
                )
        self.refresh()

    async def decide(self, text: str) -> None:
        """Answer the waiting approval with a typed line (see :func:`parse_decision`). Until the runtime
        has accepted or refused it, :attr:`decided` is clear."""
        waiting = self.activity.approval
        assert waiting is not None
        try:
            decision, args, message = parse_decision(text)
        except ValueError as error:
            self.screen.line(f"! {error} (to send a message instead, start the line with >)")
            self.screen.line(approval_line(waiting, self.thread))
            return
        try:
            message_id = await self.client.approve(
                str(waiting["thread_id"]), str(waiting["tool_call_id"]), decision, args, message
            )
        except ClientError as error:
            self.screen.line(f"! {error}")
            self.screen.line(approval_line(waiting, self.thread))
            return
        self.deciding = (waiting, message_id)
        self.decided.clear()
        self.activity.approval = None
        self.activity.busy = True
        self.quiet.clear()
        self.screen.line(f"{PROMPT}{text.strip()}")
        self.refresh()

    def _follow_decision(self, item: Item) -> bool:
        """Watch for the outcome of our pending decision (:func:`~stepagent.client.decisions.decision_outcome`).
        A refusal is shown with the question again, and the chat waits for another answer. Returns whether
        ``item`` was fully handled here."""
        assert self.deciding is not None
        waiting, message_id = self.deciding
        outcome = decision_outcome(item, str(waiting.get("tool_call_id")), message_id)
        if outcome == "accepted":
            self.deciding = None
            self.decided.set()
        elif outcome == "refused":
            self.screen.line(item_line(item, self.thread) or f"! {item.get('text', '')}")
            self.refuse_decision()
            return True
        return False

    def refuse_decision(self) -> None:
        """Our decision was not applied (refused, or processed without deciding the call): ask again."""
        if self.deciding is None:
            return
        waiting, _ = self.deciding
        self.deciding = None
        self.activity.approval = waiting
        self.screen.line(approval_line(waiting, self.thread))
        self.decided.set()

    async def reply_to_question(self, text: str) -> None:
        """Answer the tool's waiting question with a typed line (see :func:`parse_input_answer`)."""
        asking = self.activity.asking
        assert asking is not None
        try:
            action, content = parse_input_answer(text, asking)
        except ValueError as error:
            self.screen.line(f"! {error} (to send a message instead, start the line with >)")
            return
        try:
            await self.client.answer_input(
                str(asking["thread_id"]), str(asking["tool_call_id"]), action, content
            )
        except ClientError as error:
            self.screen.line(f"! {error}")
            return
        self.activity.asking = None
        self.activity.busy = True
        self.quiet.clear()
        self.screen.line(f"{PROMPT}{text.strip()}")
        self.refresh()

    def refresh(self) -> None:
        self.screen.set_status(self.activity.status(self.screen._width()))

    async def count_spent(self) -> None:
        """Read what the tree has spent so far: the next :meth:`turn_spent` line counts from here."""
        report = await self.client.usage(self.thread)
        self.spent = report.total if report is not None else TokenTotals()

    async def turn_spent(self) -> None:
        """Print a quiet line with what the tree spent since the last one (a turn, as the tree is idle
        again): tokens, model calls and dollars when the model's prices are known."""
        if self.spent is None:
            return
        report = await self.client.usage(self.thread)
        if report is None:
            return
        before, self.spent = self.spent, report.total
        line = spent_line(before, report.total)
        if line is not None:
            self.screen.line(f"\x1b[2m{line}\x1b[0m" if self.screen.interactive else line)

    async def send(self, text: str, *, echo: bool) -> str:
        if echo:
            self.screen.line(f"{PROMPT}{text}")
        self._sent.append(text)
        self.activity.busy = True
        self.quiet.clear()
        self.refresh()
        return await self.client.send(self.thread, text)

    async def answer(self, text: str) -> None:
        choice = self.activity.choice
        assert choice is not None
        try:
            index = await self.client.answer_choice(
                str(choice["thread_id"]), str(choice["choice_id"]), text.strip() or None
            )
        except ClientError as error:
            self.screen.line(f"! {error} (to send it as a message instead, start the line with >)")
            return
        self.activity.choice = None
        self.screen.line(f"{PROMPT}{text.strip() or '(default)'} → {choice['choices'][index]}")
        self.refresh()

    async def ticker(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            if self.activity.busy or self.activity.choice is not None:
                self.refresh()


async def chat(
    client: Client,
    thread: str,
    *,
    say: Sequence[str] = (),
    timeout: float = 120.0,  # noqa: ASYNC109 - how long --say waits for each answer
    out: TextIO | None = None,
    stdin: TextIO | None = None,
    interactive: bool | None = None,
    decide_later: Callable[[Item], str] | None = None,
) -> int:
    """Chat on ``thread``. With ``say``: send each text, print the replies until the tree is idle, exit
    (1 if it was still busy after ``timeout`` seconds or an error was shown). Otherwise read lines until
    end of input. Returns the exit status. ``decide_later``: what to tell the person when a call still
    waits for a decision at the end of standard input (default: the ``stepagent approve`` command)."""
    out = out if out is not None else sys.stdout
    stdin = stdin if stdin is not None else sys.stdin
    if interactive is None:
        interactive = not say and stdin.isatty() and out.isatty()
    screen = Screen(out, interactive)
    session = Chat(client, thread, screen, Activity(thread))
    if say:
        return await _say(session, say, timeout, stdin, decide_later or approve_command)
    return await _interactive(session, stdin)


def approve_command(waiting: Item, options: str = "") -> str:
    """The hint for a call left waiting: the ``stepagent approve`` command that decides it (``options``:
    how the command reaches the deployment, e.g. `` --stack NAME``)."""
    return (
        f"the call keeps waiting; decide it with `stepagent approve {waiting['thread_id']} "
        f"{waiting['tool_call_id']}{options}` [--reject [MSG] | --edit JSON | --respond TEXT]"
    )


async def _say(
    session: Chat, say: Sequence[str], limit: float, stdin: TextIO, decide_later: Callable[[Item], str]
) -> int:
    await session.count_spent()
    for text in say:
        if not text.strip():
            continue
        await session.send(text, echo=True)
        while True:
            try:
                async for item in session.client.replies(session.thread, timeout=limit):
                    session.show(item)
                    if item.get("kind") == "choice":
                        session.screen.line(
                            "  (stepagent cannot answer with --say; answer in `stepagent chat "
                            f"{session.thread}`, or it times out)"
                        )
            except TimeoutError as error:
                print(f"stepagent: {error}", file=sys.stderr)
                return 1
            # The tree is idle, so our decision was processed: with no row deciding the call, it was not
            # applied (its refusal notice may have been missed) and the call still waits.
            session.refuse_decision()
            asking = session.activity.asking
            if asking is not None:
                line = await asyncio.to_thread(stdin.readline)
                if not line:
                    session.screen.line(
                        "  (no answer on standard input: the call keeps waiting; answer it with "
                        f"Client.answer_input({asking['thread_id']!r}, {asking['tool_call_id']!r}, ...))"
                    )
                    break
                await session.reply_to_question(line)
                continue
            waiting = session.activity.approval
            if waiting is None:
                await session.turn_spent()
                break
            answer = await asyncio.to_thread(stdin.readline)
            if not answer:
                session.screen.line(f"  (no answer on standard input: {decide_later(waiting)})")
                break
            await session.decide(answer)
    return 1 if session.errors else 0


async def _interactive(session: Chat, stdin: TextIO) -> int:
    screen = session.screen
    reader = LineInput(screen, stdin)

    async def follow() -> None:
        async for item in session.client.replies(session.thread, partial=screen.interactive, follow=True):
            session.show(item)
            if item.get("kind") == "idle" and session.activity.approval is None:
                await session.turn_spent()

    await session.client.cursor(session.thread)  # what happens from here on is shown
    await session.count_spent()
    tasks = [asyncio.create_task(follow()), asyncio.create_task(session.ticker())]
    reader.start()
    try:
        async for line in reader:
            if session.activity.choice is not None and not line.startswith(">"):
                await session.answer(line)
            elif session.activity.asking is not None and not line.startswith(">"):
                await session.reply_to_question(line)
            elif session.activity.approval is not None and not line.startswith(">"):
                await session.decide(line)
                # Until the decision is accepted or refused, the next line cannot be told apart (an
                # answer again, or a message that would interrupt the call): wait for the outcome.
                await _until_decided(session, tasks[0])
            elif line.strip().lstrip(">").strip():
                await session.send(
                    line.strip().lstrip(">").strip() if line.startswith(">") else line, echo=True
                )
            for task in tasks:
                if task.done():
                    task.result()  # the follower failed: raise its error
        if not screen.interactive:
            await _until_quiet(session, limit=600.0)  # piped input: let the last message be answered
    finally:
        reader.stop()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        screen.close()
    if screen.interactive:
        screen.out.write("\n")
    return 1 if session.errors else 0


async def _until_decided(session: Chat, follower: asyncio.Task[None], *, check_every: float = 5.0) -> None:
    """Wait until our decision's outcome is known (or the follower stops, whose error is then raised).
    Every ``check_every`` seconds without an outcome the stores are asked: a decision processed while its
    call still waits was not applied (its refusal notice was missed), so the question comes back."""
    while not session.decided.is_set():
        waiter = asyncio.create_task(session.decided.wait())
        try:
            await asyncio.wait({waiter, follower}, timeout=check_every, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if follower.done() and not session.decided.is_set():
            follower.result()
            return
        if not session.decided.is_set() and await _decision_lost(session):
            session.refuse_decision()


async def _decision_lost(session: Chat) -> bool:
    """Whether our pending decision was processed and its call still waits for a person."""
    if session.deciding is None or not hasattr(session.client, "state"):
        return False  # over HTTP the stream carries every refusal
    waiting, message_id = session.deciding
    thread = str(waiting["thread_id"])
    if not await session.client.state.filter_processed(thread, [message_id]):
        return False
    pending = await session.client.pending_approvals(session.thread)
    return any(item.get("tool_call_id") == waiting.get("tool_call_id") for item in pending)


async def _until_quiet(session: Chat, *, limit: float) -> None:
    if session.activity.busy and session.activity.choice is None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(session.quiet.wait(), limit)


async def tail(
    client: Client,
    thread: str,
    *,
    history: bool = False,
    until_idle: bool = False,
    timeout: float | None = None,  # noqa: ASYNC109 - with until_idle: how long to wait for it
    out: TextIO | None = None,
) -> int:
    """Print a thread tree's new items as they are committed (``history``: its transcript first), until
    interrupted, or (``until_idle``) until the tree is idle."""
    out = out if out is not None else sys.stdout
    screen = Screen(out, interactive=out.isatty())
    session = Chat(client, thread, screen, Activity(thread), decides=False)
    after: dict[str, int] | None = None
    if not history:
        await client.cursor(thread)  # from now on (before saying so: nothing is missed in between)
    else:
        items = await client.history(thread)
        for item in items:
            session.show(item)
        after = {}
        for item in items:
            if item.get("kind") != "summary":
                after[str(item["thread_id"])] = int(item["order"])
    ticker = asyncio.create_task(session.ticker()) if screen.interactive else None
    await session.count_spent()
    print(
        f"following thread {thread} and its children"
        + (" until it is idle" if until_idle else " (Ctrl-C to stop)"),
        file=sys.stderr,
        flush=True,
    )
    try:
        async for item in client.replies(
            thread, after, partial=screen.interactive, follow=not until_idle, timeout=timeout
        ):
            session.show(item)
            if item.get("kind") == "idle" and session.activity.approval is None:
                await session.turn_spent()
        if until_idle:
            await session.turn_spent()
    except TimeoutError as error:
        print(f"stepagent: {error}", file=sys.stderr)
        return 1
    finally:
        if ticker is not None:
            ticker.cancel()
        screen.close()
    return 0
