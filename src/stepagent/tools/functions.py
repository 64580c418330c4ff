"""Python function tools: ``@tool``, loading a user's toolset, and the in-process function runner.

``@tool`` (or ``@tool(inline=True, name=..., description=..., timeout=...)``) turns a plain or async function
with type hints into a :class:`FunctionTool`. Guarantees:

- Schema, description and validation are :class:`~stepagent.function_schema.TypedFunction`'s: from the
  signature via pydantic, the description from the docstring; a bad definition (``*args``/``**kwargs``, a
  missing annotation, an invalid name) fails at decoration time with a
  :class:`~stepagent.errors.ConfigurationError`.
- The decorated object is still callable exactly like the original function.
- :meth:`FunctionTool.invoke` never raises anything but :class:`~stepagent.errors.ToolError` for problems the
  model should see: invalid arguments (naming the argument), the function raising (``Type: message``), a
  timeout. Return values become text: ``str`` as is, anything else as JSON.
- Inline tools run inside the step and return their result; the others are handed to the context's
  :class:`~stepagent.tools.base.FunctionRunner` and answer later through the input queue.

:func:`load_toolset` reads ``STEPAGENT_TOOLS=package.module:name``. :class:`InProcessFunctionRunner` runs
function tools in this process (local mode and tests); in AWS the tool runner Lambda
(``handlers/tool_runner.py``) replaces it.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, overload, runtime_checkable

from stepagent.errors import ConfigurationError, ToolError
from stepagent.function_schema import DEFAULT_TIMEOUT, TypedFunction, result_text
from stepagent.messages import ToolResult
from stepagent.tools.base import Tool, ToolContext, Toolset

if TYPE_CHECKING:
    from stepagent.tools.mcp_oauth import OAuthServices

P = ParamSpec("P")
R = TypeVar("R")

# ----------------------------------------------------------------------------------------------------------
# The tool


class FunctionTool(Tool, Generic[P, R]):
    """A tool backed by a Python function. Calling the object calls the function unchanged."""

    # Copied from the function by functools.update_wrapper; declared so type checkers know them.
    __name__: str
    __wrapped__: Callable[P, R]

    def __init__(
        self,
        func: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
        inline: bool = False,
        timeout: float | None = DEFAULT_TIMEOUT,
        approval: bool = False,
    ) -> None:
        if isinstance(func, FunctionTool | TypedFunction) or not callable(func):
            raise ConfigurationError(f"@tool needs a plain or async function, got {func!r}")
        typed = TypedFunction(func, name=name, description=description, timeout=timeout)
        self._typed = typed
        self._func = func
        # The same function, called with validated keyword arguments (which ParamSpec cannot express).
        self._untyped: Callable[..., Any] = func
        self._is_async = inspect.iscoroutinefunction(func)
        self.timeout = timeout
        functools.update_wrapper(self, func)
        # Tool declares these as ClassVars (for class-based tools); a function tool sets them per
        # instance, which shadows the class attributes at runtime. setattr keeps mypy's ClassVar check quiet.
        setattr(self, "name", typed.name)  # noqa: B010
        setattr(self, "description", typed.description)  # noqa: B010
        setattr(self, "parameters", typed.parameters)  # noqa: B010
        setattr(self, "inline", inline)  # noqa: B010
        setattr(self, "approval", approval)  # noqa: B010

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<FunctionTool {self.name!r} inline={self.inline}>"

    @property
    def function(self) -> Callable[P, R]:
        return self._func

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments for the function; ``ToolError`` naming each bad argument."""
        return self._typed.validate(arguments)

    async def invoke(self, arguments: Mapping[str, Any]) -> str:
        """Validate, run (with the timeout), and render the result as text. Raises only ``ToolError``
        (and ``CancelledError``)."""
        kwargs = self.validate(arguments)
        if self._is_async:
            value = await self._with_timeout(self._call_async(kwargs))
        elif self.inline:
            # Inline sync tools are meant to be fast and pure: run them directly, no thread, no timeout.
            value = self._call_sync(kwargs)
        else:
            # On timeout the worker thread cannot be killed; it finishes in the background, result ignored.
            value = await self._with_timeout(asyncio.to_thread(self._call_sync, kwargs))
        try:
            return result_text(value)
        except (TypeError, ValueError) as exc:
            raise ToolError(
                f"tool '{self.name}' returned a value that is not JSON-serialisable: {exc}"
            ) from None

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | None:
        if self.inline:
            text = await self.invoke(arguments)
            return ToolResult.text(context.tool_call_id, text, call_id=context.call_id)
        if context.runner is None:
            raise ConfigurationError(
                f"no function runner configured: cannot dispatch function tool '{self.name}' "
                "(configure the tool runner, or declare the tool with @tool(inline=True))"
            )
        await context.runner.submit(self.name, arguments, context)
        return None

    async def _with_timeout(self, awaitable: Any) -> Any:
        if self.timeout is None:
            return await awaitable
        try:
            return await asyncio.wait_for(awaitable, self.timeout)
        except TimeoutError:
            # Only wait_for's own timeout gets here: the function's exceptions (including its own
            # TimeoutErrors) were already turned into ToolErrors by _call_async/_call_sync.
            raise ToolError(f"tool '{self.name}' timed out after {self.timeout:g} s") from None

    async def _call_async(self, kwargs: dict[str, Any]) -> Any:
        try:
            return await self._untyped(**kwargs)
        except ToolError:
            raise  # the function chose the model-facing message itself
        except Exception as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc

    def _call_sync(self, kwargs: dict[str, Any]) -> Any:
        try:
            return self._untyped(**kwargs)
        except ToolError:
            raise
        except Exception as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc


@overload
def tool(func: Callable[P, R], /) -> FunctionTool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    inline: bool = False,
    timeout: float | None = DEFAULT_TIMEOUT,
    approval: bool = False,
) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


def tool(
    func: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    inline: bool = False,
    timeout: float | None = DEFAULT_TIMEOUT,
    approval: bool = False,
) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """Make a tool from a function: ``@tool``, or ``@tool(inline=..., name=..., timeout=...)`` with options.

    ``inline=True`` runs the tool inside the step (fast, pure functions only); otherwise the function
    runner executes it off the step. ``timeout`` (seconds, ``None`` = no limit) bounds async functions
    and non-inline sync functions. ``approval=True``: every call waits for a person's decision
    (approve, edit, reject or respond) before it runs.
    """

    def decorate(function: Callable[P, R]) -> FunctionTool[P, R]:
        return FunctionTool(
            function, name=name, description=description, inline=inline, timeout=timeout, approval=approval
        )

    if func is not None:
        return decorate(func)
    return decorate


# ----------------------------------------------------------------------------------------------------------
# STEPAGENT_TOOLS

_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def load_toolset(spec: str) -> list[Tool]:
    """Load the tools named by ``STEPAGENT_TOOLS`` (``package.module:name``): a ``Tool``, a list or tuple of
    tools (``@tool`` functions are tools), or a ``Toolset``. Every problem is a ``ConfigurationError``."""
    where = f"STEPAGENT_TOOLS={spec!r}"
    spec = spec.strip()
    if not _SPEC.match(spec):
        raise ConfigurationError(f"{where} is not of the form 'package.module:name'")
    module_name, attribute = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ConfigurationError(
                f"{where}: module {module_name!r} not found (is it installed or on PYTHONPATH?)"
            ) from None
        raise ConfigurationError(f"{where}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigurationError(
            f"{where}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    value: Any = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ConfigurationError(
                f"{where}: module {module_name!r} has no attribute {attribute!r}"
            ) from None
    tools = _as_tools(value, where)
    try:
        Toolset.of(tools)  # unique names, checked once here rather than at first use
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    return tools


def _as_tools(value: Any, where: str) -> list[Tool]:
    if isinstance(value, Toolset):
        return list(value)
    if isinstance(value, Tool):
        return [value]
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if not isinstance(item, Tool):
                raise ConfigurationError(f"{where}: item {index} is {_describe(item)}, not a tool")
        return list(value)
    raise ConfigurationError(
        f"{where}: expected a Tool, a list of tools or a Toolset, got {_describe(value)}"
    )


def _describe(value: Any) -> str:
    if isinstance(value, type) and issubclass(value, Tool):
        return f"the Tool class {value.__name__} (list an instance: {value.__name__}())"
    if inspect.isfunction(value) or inspect.ismethod(value):
        return f"the plain function {value.__name__!r} (decorate it with @tool)"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


# ----------------------------------------------------------------------------------------------------------
# The in-process runner


@runtime_checkable
class Invocable(Protocol):
    """What a function runner can execute: a named tool whose ``invoke`` returns the result text and raises
    only ``ToolError`` for failures the model should see (function tools, MCP tools)."""

    @property
    def name(self) -> str: ...

    async def invoke(self, arguments: Mapping[str, Any]) -> str: ...


class InProcessFunctionRunner:
    """A :class:`~stepagent.tools.base.FunctionRunner` that runs function tools in this process.

    For local mode and tests; in AWS the tool runner Lambda replaces it. By default ``submit`` runs the tool
    to completion before returning (simple and deterministic). With ``background=True`` it starts a task
    and returns at once, as a real queue would; :meth:`join` waits for those tasks and re-raises the first
    unexpected failure (a ``ToolError`` is never a failure: it is sent as ``Error: ...``).

    The result goes back through ``context.send_result`` (dedup id = the tool call id), so a re-dispatched
    call re-runs the function but the receiving thread keeps only one result.
    """

    #: Seconds an older MCP server's call is held open for the person's answer to its question.
    input_wait: float = 120.0
    #: What ``"auth": "oauth"`` MCP servers' sign-ins need (``None``: such a call fails with an error).
    oauth: OAuthServices | None = None

    def __init__(self, tools: Iterable[Tool] | Mapping[str, Tool] = (), *, background: bool = False) -> None:
        values: Iterable[Tool] = tools.values() if isinstance(tools, Mapping) else tools
        # Only invocable tools (function and MCP tools) run here; others dispatch by their own means.
        self._tools: dict[str, Invocable] = {t.name: t for t in values if isinstance(t, Invocable)}
        self._background = background
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._failures: list[BaseException] = []

    @property
    def tools(self) -> Mapping[str, Invocable]:
        return self._tools

    def add(self, function_tool: Invocable) -> None:
        self._tools[function_tool.name] = function_tool

    @property
    def running(self) -> int:
        """How many background calls are still running (local mode's idle check reads it)."""
        return len(self._tasks)

    async def submit(self, tool_name: str, arguments: dict[str, Any], context: ToolContext) -> None:
        if not self._background:
            await self.run(tool_name, arguments, context)
            return
        key = (context.thread_id, context.tool_call_id)
        if key in self._tasks:
            return  # the same call is already running; a second run could only produce a duplicate
        task = asyncio.create_task(self.run(tool_name, arguments, context), name=f"tool {tool_name} {key}")
        self._tasks[key] = task
        task.add_done_callback(functools.partial(self._finished, key))

    async def run(self, tool_name: str, arguments: dict[str, Any], context: ToolContext) -> None:
        """Run one call now and send its result (or ``Error: <message>``) to the calling thread."""
        function_tool = self._tools.get(tool_name)
        if function_tool is None:
            text: str | None = f"Error: no function tool named '{tool_name}' is registered with this runner"
        else:
            try:
                text = await self._invoke(function_tool, arguments, context)
            except ToolError as exc:
                text = f"Error: {exc}"
        if text is not None:  # None: an MCP tool asked the person a question; the call resumes on the answer
            await context.send_result(text)

    async def _invoke(
        self, function_tool: Invocable, arguments: dict[str, Any], context: ToolContext
    ) -> str | None:
        from stepagent.tools.mcp import McpTool

        if not isinstance(function_tool, McpTool):
            return await function_tool.invoke(arguments)
        from stepagent.tools.mcp_oauth import owner_of
        from stepagent.tools.mcp_runs import run_mcp_call

        return await run_mcp_call(
            function_tool,
            arguments,
            thread_id=context.thread_id,
            tool_call_id=context.tool_call_id,
            call_id=context.call_id,
            resume=context.resume,
            sender=context.sender,
            read_kept=context.access.cache_get,
            input_wait=self.input_wait,
            owner=owner_of(context.user_id, context.thread_stack),
            oauth=self.oauth,
        )

    async def join(self) -> None:
        """Wait until no background call is running; re-raise the first unexpected failure."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        if self._failures:
            failure = self._failures.pop(0)
            raise failure

    async def aclose(self) -> None:
        """Cancel running background calls and wait for them to end."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _finished(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        self._tasks.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            self._failures.append(task.exception())  # type: ignore[arg-type]
