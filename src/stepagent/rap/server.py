"""A small RAP tool server on Starlette: write tools as typed Python functions, serve them over RAP.

::

    server = RapToolServer("clock", description="Time tools")

    @server.tool
    def get_time(timezone: str = "UTC") -> str:
        \"\"\"The current time in an IANA timezone.\"\"\"
        return datetime.now(ZoneInfo(timezone)).isoformat()

    server.run(port=8080)            # or mount server.app in any ASGI host

What it does for you (the RAP protocol, docs/writing-tools.md):

- ``GET /.well-known/rap-toolset`` serves the manifest; schemas and descriptions come from the type hints
  and docstrings, exactly as for ``@tool``. Invocations are POSTed to ``/invoke`` (``/`` works too).
- An invocation is acknowledged with 200 at once and run in the background; the return value is sent as
  the ``tool_result`` (``str`` as is, anything else as JSON). A :class:`ToolError` or any exception, invalid
  arguments and unknown operations are sent as ``Error: ...`` results, so every accepted call ends in a
  result. A body that is not a valid invocation gets a 400 (there is nowhere to send a result).
- Return :class:`Subscription` to start a subscription: the result is sent with ``subscription: true``
  first, then ``run(call)`` runs in the background and sends events with :meth:`RapCall.send_event`.
  Return :data:`DEFERRED` to answer later yourself through :func:`current_call`.
- ``/cancel_tool_call`` cancels the call's running work (handler and subscription); ``/close_thread``
  cancels all of a thread's work. Both always answer 200.
- :meth:`RapCall.ask_user` sends a ``user_choice`` and waits for the runtime's POST to ``response_url``
  (``/choices/<unguessable key>``).
- Callbacks are retried on 5xx and network errors with jittered backoff (a ``Retry-After`` in seconds is
  honoured), never on 4xx.
- The W3C ``traceparent`` header of an invocation goes back with its callbacks, so the step that the
  result wakes joins the calling step's trace.

Limits: state (running subscriptions, open choices) lives in this process. A production server that must
survive restarts stores each subscription's ``callback_url`` durably and sends events from wherever the
events come from (see :meth:`RapToolServer.call_for`). Requests are not authenticated unless you pass
``authorize``; put the server behind IAM (Lambda Function URL with ``sigv4=1``) or your own check.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, Literal, overload

import httpx
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from stepagent.backoff import Backoff
from stepagent.errors import CallbackError, CallbackRefusedError, ToolError, classify
from stepagent.function_schema import TypedFunction, result_text
from stepagent.rap.call import (
    DEFERRED,
    RapCall,
    Result,
    Subscription,
    _current,
    current_call,
)
from stepagent.rap.protocol import RapInvocation
from stepagent.tracing import TRACEPARENT, continuing, trace_attributes

__all__ = [
    "DEFERRED",
    "CallbackError",
    "RapCall",
    "RapToolServer",
    "Result",
    "Subscription",
    "current_call",
    "serve_in_background",
]

log = logging.getLogger(__name__)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class RapToolServer:
    """Tools served over RAP. Build it, decorate functions with :meth:`tool`, serve :attr:`app`."""

    def __init__(
        self,
        name: str,
        *,
        description: str | None = None,
        public_url: str | None = None,
        authorize: Callable[[Request], Awaitable[bool]] | None = None,
        http: httpx.AsyncClient | None = None,
        callback_attempts: int = 4,
        callback_backoff: float = 0.25,
    ) -> None:
        self.name = name
        self.description = description
        self.public_url = public_url.rstrip("/") if public_url else None
        self.authorize = authorize
        self._http = http
        self._own_http = http is None
        self.callback_attempts = callback_attempts
        self.callback_backoff = callback_backoff
        self.tools: dict[str, TypedFunction[..., Any]] = {}
        self.annotations: dict[str, dict[str, Any]] = {}
        #: What the runtime told this server, in order (for tests and logs).
        self.cancelled: list[tuple[str, str]] = []
        self.closed: list[str] = []
        self._work: dict[tuple[str, str], set[asyncio.Task[None]]] = {}
        self.choices: dict[str, tuple[str, int, asyncio.Future[int]]] = {}
        self.app = Starlette(
            routes=[
                Route("/.well-known/rap-toolset", self._manifest, methods=["GET"]),
                Route("/invoke", self._invoke, methods=["POST"]),
                Route("/", self._invoke, methods=["POST"]),
                Route("/cancel_tool_call", self._cancel, methods=["POST"]),
                Route("/close_thread", self._close, methods=["POST"]),
                Route("/choices/{key}", self._choice, methods=["POST"]),
            ],
            lifespan=self._lifespan,
        )

    # ---- declaring tools ----------------------------------------------------------------------------------

    @overload
    def tool(self, func: Callable[..., Any], /) -> TypedFunction[..., Any]: ...

    @overload
    def tool(
        self,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        annotations: dict[str, Any] | None = None,
    ) -> Callable[[Callable[..., Any]], TypedFunction[..., Any]]: ...

    def tool(
        self,
        func: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        annotations: dict[str, Any] | None = None,
    ) -> TypedFunction[..., Any] | Callable[[Callable[..., Any]], TypedFunction[..., Any]]:
        """``@server.tool`` or ``@server.tool(name=..., timeout=..., annotations=...)``."""

        def register(function: Callable[..., Any]) -> TypedFunction[..., Any]:
            made = TypedFunction(function, name=name, description=description, timeout=timeout)
            if not made.description:
                raise ValueError(f"RAP tool {made.name!r} needs a description (a docstring)")
            self.tools[made.name] = made
            if annotations:
                self.annotations[made.name] = dict(annotations)
            return made

        return register(func) if func is not None else register

    def manifest(self, base_url: str) -> dict[str, Any]:
        tools = []
        for tool in self.tools.values():
            entry: dict[str, Any] = {
                "name": tool.name,
                "description": tool.description,
                "inputSchema": tool.parameters,
            }
            if tool.name in self.annotations:
                entry["annotations"] = self.annotations[tool.name]
            tools.append(entry)
        manifest: dict[str, Any] = {"name": self.name, "endpoint": f"{base_url}/invoke", "tools": tools}
        if self.description:
            manifest["description"] = self.description
        return manifest

    def call_for(self, invocation: dict[str, Any], base_url: str | None = None) -> RapCall:
        """A :class:`RapCall` for a stored invocation body, to send results or events outside a request."""
        return RapCall(RapInvocation.model_validate(invocation), self, base_url or self.public_url or "")

    # ---- callbacks ----------------------------------------------------------------------------------------

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=10.0)
        return self._http

    async def post_callback(self, url: str, body: dict[str, Any]) -> None:
        """POST a callback; retry what :func:`~stepagent.errors.classify` says to (5xx answers and network
        errors, after a jittered wait or the receiver's ``Retry-After``); raise ``CallbackError`` on failure
        (:class:`~stepagent.errors.CallbackRefusedError` at once for a 4xx: resending cannot help)."""
        backoff = Backoff(attempts=self.callback_attempts, base=self.callback_backoff, cap=10.0)
        attempt = 1
        while True:
            try:
                await self._post_once(url, body)
                return
            except CallbackError as error:
                delay = backoff.delay(attempt, error.retry_after)
                if classify(error) != "retry" or not backoff.allows(attempt, delay):
                    raise
            await asyncio.sleep(delay)
            attempt += 1

    async def _post_once(self, url: str, body: dict[str, Any]) -> None:
        failed = f"{body['type']} callback for {body['group_id']} failed"
        try:
            response = await self.http.post(url, json=body, headers=trace_attributes())
        except httpx.HTTPError as exc:
            raise CallbackError(f"{failed}: {type(exc).__name__}: {exc}") from exc
        if response.status_code < 300:
            return
        problem = f"{failed}: HTTP {response.status_code}: {response.text[:200]}"
        if response.status_code < 500:
            raise CallbackRefusedError(problem)
        retry_after = None
        with contextlib.suppress(ValueError):
            retry_after = float(response.headers.get("retry-after", ""))
        raise CallbackError(problem, retry_after=retry_after)

    # ---- running calls ------------------------------------------------------------------------------------

    def _start(
        self,
        key: tuple[str, str],
        work: Coroutine[Any, Any, None],
        call: RapCall,
        traceparent: str | None = None,
    ) -> None:
        async def guarded() -> None:
            _current.set(call)
            try:
                with continuing(traceparent):  # callbacks carry the calling step's trace back
                    await work
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("RAP call %s of thread %s failed in the background", key[1], key[0])

        task = asyncio.get_running_loop().create_task(guarded())
        tasks = self._work.setdefault(key, set())
        tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            work.close()  # a task cancelled before it started never awaited ``work``; closing is a no-op otherwise
            tasks.discard(finished)
            if not tasks and self._work.get(key) is tasks:
                del self._work[key]

        task.add_done_callback(done)

    async def _serve_call(self, call: RapCall) -> None:
        invocation = call.invocation
        tool = self.tools.get(invocation.operation)
        if tool is None:
            await call.send_error(f"unknown operation '{invocation.operation}' on RAP server '{self.name}'")
            return
        arguments = invocation.arguments if invocation.arguments is not None else {}
        try:
            if not isinstance(arguments, dict):
                raise ToolError(f"arguments for tool '{tool.name}' must be a JSON object")
            kwargs = tool.validate(arguments)
            value = await self._call_function(tool, kwargs)
        except ToolError as exc:
            await call.send_error(str(exc))
            return
        if value is DEFERRED:
            return
        if isinstance(value, Subscription):
            await call.send_result(value.text, subscription=True)
            self._start((call.thread_id, call.id), value.run(call), call)
        elif isinstance(value, Result):
            await call.send_result(value.text, content=value.content, display_as=value.display_as)
        else:
            try:
                text = result_text(value)
            except (TypeError, ValueError) as exc:
                text = f"Error: tool '{tool.name}' returned a value that is not JSON-serialisable: {exc}"
            await call.send_result(text)

    @staticmethod
    async def _call_function(tool: TypedFunction[..., Any], kwargs: dict[str, Any]) -> Any:
        function = tool.function
        try:
            if asyncio.iscoroutinefunction(function):
                work: Awaitable[Any] = function(**kwargs)
            else:
                work = asyncio.to_thread(function, **kwargs)  # copies the context: current_call() works
            if tool.timeout is None:
                return await work
            return await asyncio.wait_for(work, tool.timeout)
        except ToolError:
            raise
        except TimeoutError:
            raise ToolError(f"tool '{tool.name}' timed out after {tool.timeout:g} s") from None
        except Exception as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc

    # ---- routes -------------------------------------------------------------------------------------------

    def _base_url(self, request: Request) -> str:
        return self.public_url or str(request.base_url).rstrip("/")

    async def _denied(self, request: Request) -> JSONResponse | None:
        if self.authorize is not None and not await self.authorize(request):
            return _error(401, "unauthorized")
        return None

    async def _json(self, request: Request) -> dict[str, Any] | None:
        try:
            data = await request.json()
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    async def _manifest(self, request: Request) -> JSONResponse:
        return JSONResponse(self.manifest(self._base_url(request)))

    async def _invoke(self, request: Request) -> JSONResponse:
        denied = await self._denied(request)
        if denied is not None:
            return denied
        data = await self._json(request)
        if data is None:
            return _error(400, "the body must be a JSON object")
        try:
            invocation = RapInvocation.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            return _error(400, f"invalid invocation: {'.'.join(map(str, first['loc']))}: {first['msg']}")
        call = RapCall(invocation, self, self._base_url(request))
        traceparent = request.headers.get(TRACEPARENT)
        self._start((invocation.group_id, invocation.id), self._serve_call(call), call, traceparent)
        return JSONResponse({"ok": True})

    def is_running(self, thread_id: str, call_id: str) -> bool:
        """Whether work of this call is still running here (its handler, or its subscription's ``run``)."""
        return bool(self._work.get((thread_id, call_id)))

    def _cancel_work(self, match: Callable[[tuple[str, str]], bool]) -> None:
        for key, tasks in list(self._work.items()):
            if match(key):
                for task in list(tasks):
                    task.cancel()

    async def _cancel(self, request: Request) -> JSONResponse:
        denied = await self._denied(request)
        if denied is not None:
            return denied
        data = await self._json(request) or {}
        thread, call = str(data.get("thread_id", "")), str(data.get("tool_call_id", ""))
        self.cancelled.append((thread, call))
        self._cancel_work(lambda key: key == (thread, call))
        return JSONResponse({"ok": True})

    async def _close(self, request: Request) -> JSONResponse:
        denied = await self._denied(request)
        if denied is not None:
            return denied
        data = await self._json(request) or {}
        thread = str(data.get("thread_id", ""))
        self.closed.append(thread)
        self._cancel_work(lambda key: key[0] == thread)
        return JSONResponse({"ok": True})

    async def _choice(self, request: Request) -> JSONResponse:
        pending = self.choices.get(request.path_params["key"])
        if pending is None:
            return _error(404, "no such pending choice (answered already, or the server restarted)")
        call_id, count, answer = pending
        data = await self._json(request) or {}
        selected = data.get("selected")
        if data.get("id") != call_id:
            return _error(400, "'id' does not match the call that asked")
        if not isinstance(selected, int) or isinstance(selected, bool) or not 0 <= selected < count:
            return _error(400, f"'selected' must be an index below {count}")
        if not answer.done():
            answer.set_result(selected)
        return JSONResponse({"ok": True})

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        yield
        self._cancel_work(lambda key: True)
        tasks = [task for tasks in self._work.values() for task in tasks]
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._own_http and self._http is not None:
            await self._http.aclose()
            self._http = None

    # ---- serving ------------------------------------------------------------------------------------------

    def run(self, host: str = "127.0.0.1", port: int = 8080) -> None:
        """Serve with uvicorn until interrupted."""
        import uvicorn

        uvicorn.run(self.app, host=host, port=port, log_level="info")


#: Seconds a stopping embedded server waits for open connections (a streaming response, a keep-alive
#: client) before closing them.
GRACEFUL_SHUTDOWN_SECONDS = 1


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an IP address, IPv6 optionally in brackets) is ``localhost`` or a loopback
    address: the servers that run unauthenticated (the console, the HTTP API with auth off) refuse any
    other bind. Internal (not in ``__all__``), beside :func:`serve_in_background`, which both serve with."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@contextlib.asynccontextmanager
async def serve_in_background(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    lifespan: Literal["on", "off"] = "on",
    backlog: int = 2048,
) -> AsyncIterator[str]:
    """Run ``app`` with uvicorn on this event loop; yields its base URL (``port=0``: a free port).

    The server stops when the context exits, in at most about :data:`GRACEFUL_SHUTDOWN_SECONDS` plus the
    app's own lifespan shutdown. ``backlog``: pending connections the socket queues (uvicorn's default;
    a server holding many streams opened at once wants more). It leaves SIGINT and SIGTERM to the program (see :mod:`stepagent.shutdown`):
    uvicorn would otherwise take them over while it serves, and a signal would stop only this server."""
    import uvicorn

    # Defined here, not at module level, because its base class is uvicorn's: the RAP server SDK (and the
    # devstack that imports this module) loads uvicorn only when a server is actually started.
    class EmbeddedServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan=lifespan,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        backlog=backlog,
    )
    server = EmbeddedServer(config)
    task = asyncio.get_running_loop().create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()  # startup failed: raise its error
                raise RuntimeError("the server stopped during startup")
            await asyncio.sleep(0.01)
        bound = server.servers[0].sockets[0].getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        yield f"http://{shown}:{bound}"
    finally:
        server.should_exit = True
        await task
