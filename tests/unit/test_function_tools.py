"""@tool: schemas from signatures, invocation, errors, timeouts; load_toolset; the in-process runner."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
from pydantic import BaseModel

from stepagent.core.effects import StoreToolAccess
from stepagent.errors import ConfigurationError, ToolError
from stepagent.function_schema import parse_docstring, result_text
from stepagent.messages import InputMessage, ToolResult
from stepagent.stores.memory import memory_stores
from stepagent.tools.base import Tool, ToolContext, Toolset
from stepagent.tools.functions import FunctionTool, InProcessFunctionRunner, load_toolset, tool

# ---------------------------------------------------------------------------------------------------------
# Fakes


class RecordingSender:
    """An InputSender that records (message, dedup_id)."""

    def __init__(self) -> None:
        self.sent: list[tuple[InputMessage, str]] = []

    async def send(self, message: InputMessage, dedup_id: str) -> None:
        self.sent.append((message, dedup_id))

    def texts(self) -> list[str]:
        out = []
        for message, _ in self.sent:
            assert isinstance(message.content, ToolResult)
            out.append(message.content.joined_text())
        return out


class RecordingRunner:
    def __init__(self) -> None:
        self.submitted: list[tuple[str, dict[str, Any], ToolContext]] = []

    async def submit(self, tool_name: str, arguments: dict[str, Any], context: ToolContext) -> None:
        self.submitted.append((tool_name, arguments, context))


def make_context(
    sender: RecordingSender | None = None,
    runner: Any = None,
    tool_call_id: str = "tc-1",
    call_id: str | None = "call-1",
    thread_id: str = "thread-1",
) -> ToolContext:
    conversation, state = memory_stores()
    return ToolContext(
        thread_id=thread_id,
        tool_call_id=tool_call_id,
        call_id=call_id,
        thread_stack=["root", thread_id],
        sender=sender or RecordingSender(),
        access=StoreToolAccess(conversation, state),
        runner=runner,
    )


# ---------------------------------------------------------------------------------------------------------
# Tools used by the tests (module level so type hints resolve)


class Point(BaseModel):
    """A point on the map."""

    x: float
    y: float = 0.0


@tool
def weather(city: str, days: int = 3) -> str:
    """Get the weather forecast for a city.

    The forecast comes from a fake service.

    Args:
        city: The city name,
            e.g. "Paris".
        days (int): How many days to forecast.

    Returns:
        A short forecast.
    """
    return f"{city}: sunny for {days} days"


@tool(inline=True, name="add_numbers", description="Add two numbers.")
def add(a: float, b: float) -> float:
    """Ignored docstring."""
    return a + b


@tool
async def async_echo(message: str, repeat: int = 1) -> list[str]:
    """Echo a message."""
    return [message] * repeat


@tool
def kinds(
    text: str,
    count: int,
    ratio: float,
    flag: bool,
    names: list[str],
    maybe: Optional[str],  # noqa: UP045 - Optional on purpose: both spellings must work
    maybe_too: int | None = None,
    mode: Literal["fast", "slow"] = "fast",
    point: Point | None = None,
    title: str = "default title",
) -> dict[str, Any]:
    """Exercise every parameter kind."""
    return {"text": text, "point": point}


@tool
def failing(reason: str) -> str:
    """Always fails."""
    raise ValueError(reason)


@tool
def own_tool_error() -> str:
    """Raises a ToolError itself."""
    raise ToolError("custom message for the model")


@tool
async def async_failing() -> str:
    """Fails asynchronously, with its own TimeoutError."""
    raise TimeoutError("upstream timed out")


@tool(timeout=0.05)
async def hangs() -> str:
    """Never returns: waits for an event nobody sets (created per call, so it binds to the running loop)."""
    await asyncio.Event().wait()
    return "unreachable"


@tool
def no_docstring(value: int) -> int:
    return value * 2


@tool
def returns_model() -> Point:
    """Returns a pydantic model."""
    return Point(x=1, y=2)


@tool
def returns_none() -> None:
    """Returns nothing."""


@tool
def returns_unicode() -> dict[str, str]:
    """Returns non-ASCII text."""
    return {"city": "Zürich", "when": "今日"}


# ---------------------------------------------------------------------------------------------------------
# Definition and schema


def test_decorated_function_is_a_tool_and_still_callable() -> None:
    assert isinstance(weather, FunctionTool) and isinstance(weather, Tool)
    assert weather("Oslo", days=2) == "Oslo: sunny for 2 days"
    assert weather.__name__ == "weather"
    assert "forecast" in (weather.__doc__ or "")
    assert add(1, 2) == 3
    assert asyncio.run(async_echo("hi", repeat=2)) == ["hi", "hi"]


def test_name_description_and_flags() -> None:
    assert weather.name == "weather"
    assert weather.description == "Get the weather forecast for a city."
    assert not weather.inline
    assert add.name == "add_numbers" and add.description == "Add two numbers." and add.inline
    assert no_docstring.description == ""
    spec = weather.spec()
    assert spec.name == "weather" and spec.parameters == weather.parameters


def test_schema_with_docstring_descriptions_and_defaults() -> None:
    assert weather.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": 'The city name, e.g. "Paris".'},
            "days": {"type": "integer", "default": 3, "description": "How many days to forecast."},
        },
        "required": ["city"],
        "additionalProperties": False,
    }


def test_schema_for_every_parameter_kind() -> None:
    schema = kinds.parameters
    props = schema["properties"]
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["text", "count", "ratio", "flag", "names", "maybe"]
    assert props["text"] == {"type": "string"}
    assert props["count"] == {"type": "integer"}
    assert props["ratio"] == {"type": "number"}
    assert props["flag"] == {"type": "boolean"}
    assert props["names"] == {"type": "array", "items": {"type": "string"}}
    assert props["maybe"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert props["maybe_too"] == {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"], "default": "fast"}
    assert props["point"] == {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}], "default": None}
    assert props["title"] == {"type": "string", "default": "default title"}  # a property named "title" stays
    assert schema["$defs"]["Point"] == {
        "type": "object",
        "description": "A point on the map.",
        "properties": {"x": {"type": "number"}, "y": {"type": "number", "default": 0.0}},
        "required": ["x"],
    }

    def no_titles(node: Any) -> None:
        if isinstance(node, dict):
            assert not isinstance(node.get("title"), str) or node is props, node
            for key, value in node.items():
                if key != "properties":
                    no_titles(value)
                else:
                    for sub in value.values():
                        no_titles(sub)
        elif isinstance(node, list):
            for item in node:
                no_titles(item)

    no_titles(schema)


def test_schema_keeps_title_inside_default_values() -> None:
    @tool
    def f(options: dict[str, str] = {"title": "kept"}) -> str:  # noqa: B006 - never mutated
        """Doc."""
        return ""

    assert f.parameters["properties"]["options"]["default"] == {"title": "kept"}


def test_parameters_named_like_basemodel_attributes() -> None:
    @tool
    def f(json: str, schema: int, model_config: bool = False) -> str:
        """Names that would clash with pydantic's BaseModel."""
        return f"{json}-{schema}-{model_config}"

    assert set(f.parameters["properties"]) == {"json", "schema", "model_config"}
    assert asyncio.run(f.invoke({"json": "a", "schema": 2})) == "a-2-False"


def test_no_parameters() -> None:
    assert returns_none.parameters == {"type": "object", "properties": {}, "additionalProperties": False}


def test_parse_docstring_sections() -> None:
    doc = """Summary line
    continues here.

    Details.

    Arguments:
        a (int): First.
        *b: Second,
            wrapped.

    Raises:
        c: not an argument.
    """
    assert parse_docstring(doc) == ("Summary line continues here.", {"a": "First.", "b": "Second, wrapped."})
    assert parse_docstring(None) == ("", {})


# The same tool documented in each style docstring_parser reads: one description, the same parameters.
STYLES = {
    "google": """Get weather.

    Args:
        city: The city.
        units: Metric or
            imperial.

    Returns:
        text
    """,
    "numpy": """Get weather.

    Parameters
    ----------
    city : str
        The city.
    units : str, optional
        Metric or
        imperial.

    Returns
    -------
    str
    """,
    "rest": """Get weather.

    :param city: The city.
    :param units: Metric or
        imperial.
    :returns: text
    """,
    "epydoc": """Get weather.

    @param city: The city.
    @param units: Metric or
        imperial.
    @return: text
    """,
}


@pytest.mark.parametrize("style", sorted(STYLES))
def test_each_docstring_style_gives_the_description_and_the_parameters(style: str) -> None:
    def get_weather(city: str, units: str = "metric") -> str:
        return city

    get_weather.__doc__ = STYLES[style]
    made = tool(get_weather)
    assert made.description == "Get weather."
    assert made.parameters["properties"]["city"]["description"] == "The city."
    assert made.parameters["properties"]["units"]["description"] == "Metric or imperial."


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: tool(name="v")(lambda *args: None), "must be a named parameter"),
        (lambda: tool(name="bad name!")(lambda: None), "tool name 'bad name!' is invalid"),
        (lambda: tool(timeout=0)(_annotated), "timeout must be positive"),
        (lambda: tool(_unannotated), "parameter 'x' has no type annotation"),
        (lambda: tool(_kwargs), "must be a named parameter"),
        (lambda: tool(_positional_only), "must be a named parameter"),
        (lambda: tool(weather), "needs a plain or async function"),
        (lambda: tool(42), "needs a plain or async function"),  # type: ignore[call-overload]
    ],
)
def test_bad_definitions_fail_at_decoration(build: Any, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        build()
    assert fragment in str(info.value)


def _annotated(x: int) -> int:
    return x


def _unannotated(x) -> int:  # type: ignore[no-untyped-def]
    return 1


def _kwargs(**kwargs: int) -> int:
    return 1


def _positional_only(x: int, /) -> int:
    return x


# ---------------------------------------------------------------------------------------------------------
# Invocation


async def test_invoke_sync_function_returns_text() -> None:
    assert await weather.invoke({"city": "Paris"}) == "Paris: sunny for 3 days"


async def test_invoke_async_function_returns_json_text() -> None:
    assert await async_echo.invoke({"message": "hi", "repeat": 2}) == '["hi", "hi"]'


async def test_invoke_inline_function() -> None:
    assert await add.invoke({"a": 1.5, "b": 2}) == "3.5"


async def test_invoke_converts_pydantic_parameters() -> None:
    arguments = {
        "text": "t",
        "count": 1,
        "ratio": 0.5,
        "flag": True,
        "names": [],
        "maybe": None,
        "point": {"x": 3},
    }
    assert await kinds.invoke(arguments) == '{"text": "t", "point": {"x": 3.0, "y": 0.0}}'


async def test_return_value_conversion() -> None:
    assert await returns_model.invoke({}) == '{"x": 1.0, "y": 2.0}'
    assert await returns_none.invoke({}) == "null"
    assert await returns_unicode.invoke({}) == '{"city": "Zürich", "when": "今日"}'
    assert result_text({"when": Path("/tmp")}) == '{"when": "/tmp"}'


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"city": 3}, "argument 'city': Input should be a valid string"),
        ({}, "missing required argument 'city'"),
        ({"city": "x", "country": "y"}, "unexpected argument 'country'"),
        ({"city": "x", "days": "many"}, "argument 'days': Input should be a valid integer"),
    ],
)
async def test_validation_errors_name_the_argument(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ToolError) as info:
        await weather.invoke(arguments)
    assert message in str(info.value)
    assert "tool 'weather'" in str(info.value)


async def test_validation_error_for_nested_field() -> None:
    arguments = {"text": "t", "count": 1, "ratio": 1, "flag": True, "names": ["a", 2], "maybe": None}
    with pytest.raises(ToolError, match=r"argument 'names\.1': Input should be a valid string"):
        await kinds.invoke(arguments)


async def test_function_exception_becomes_tool_error() -> None:
    with pytest.raises(ToolError) as info:
        await failing.invoke({"reason": "boom"})
    assert str(info.value) == "ValueError: boom"


async def test_function_tool_error_passes_through_unchanged() -> None:
    with pytest.raises(ToolError) as info:
        await own_tool_error.invoke({})
    assert str(info.value) == "custom message for the model"


async def test_functions_own_timeout_error_is_not_reported_as_our_timeout() -> None:
    with pytest.raises(ToolError) as info:
        await async_failing.invoke({})
    assert str(info.value) == "TimeoutError: upstream timed out"


async def test_async_timeout() -> None:
    with pytest.raises(ToolError) as info:
        await hangs.invoke({})
    assert str(info.value) == "tool 'hangs' timed out after 0.05 s"


async def test_sync_timeout_in_thread() -> None:
    release = threading.Event()

    @tool(timeout=0.05)
    def blocking() -> str:
        """Blocks its worker thread until released."""
        release.wait(5)
        return "late"

    try:
        with pytest.raises(ToolError, match=r"tool 'blocking' timed out after 0\.05 s"):
            await blocking.invoke({})
    finally:
        release.set()  # let the abandoned worker thread finish


async def test_sync_non_inline_runs_in_a_thread_and_inline_runs_directly() -> None:
    main = threading.get_ident()

    @tool
    def where() -> bool:
        """Thread check."""
        return threading.get_ident() == main

    @tool(inline=True)
    def where_inline() -> bool:
        """Thread check."""
        return threading.get_ident() == main

    assert await where.invoke({}) == "false"
    assert await where_inline.invoke({}) == "true"


async def test_timeout_none_disables_the_limit() -> None:
    @tool(timeout=None)
    async def quick() -> str:
        """Quick."""
        return "ok"

    assert quick.timeout is None
    assert await quick.invoke({}) == "ok"


# ---------------------------------------------------------------------------------------------------------
# execute


async def test_execute_inline_returns_result() -> None:
    context = make_context()
    result = await add.execute({"a": 1, "b": 2}, context)
    assert result == ToolResult.text("tc-1", "3.0", call_id="call-1")


async def test_execute_inline_error_propagates() -> None:
    @tool(inline=True)
    def bad() -> str:
        """Fails."""
        raise RuntimeError("nope")

    with pytest.raises(ToolError, match="RuntimeError: nope"):
        await bad.execute({}, make_context())


async def test_execute_async_submits_to_the_runner() -> None:
    runner = RecordingRunner()
    context = make_context(runner=runner)
    assert await weather.execute({"city": "Rome"}, context) is None
    assert runner.submitted == [("weather", {"city": "Rome"}, context)]


async def test_execute_async_without_runner_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="no function runner configured"):
        await weather.execute({"city": "Rome"}, make_context())


# ---------------------------------------------------------------------------------------------------------
# load_toolset


@pytest.fixture
def toolmodule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    package = tmp_path / "fake_user_tools"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tools.py").write_text(
        textwrap.dedent(
            '''
            from stepagent.tools.base import Toolset
            from stepagent.tools.functions import tool

            @tool
            def ping(host: str) -> str:
                """Ping a host."""
                return "pong " + host

            @tool(inline=True)
            def pong() -> str:
                """Pong."""
                return "ping"

            def plain(x: int) -> int:
                return x

            toolset = [ping, pong]
            as_tuple = (ping,)
            as_toolset = Toolset.of([ping, pong])
            single = ping
            number = 42
            with_plain = [ping, plain]
            duplicates = [ping, ping]

            class Holder:
                tools = [pong]
            '''
        )
    )
    (package / "broken.py").write_text("raise RuntimeError('import-time failure')\n")
    (package / "needs_missing.py").write_text("import definitely_not_installed_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fake_user_tools"
    for name in [m for m in sys.modules if m.startswith("fake_user_tools")]:
        del sys.modules[name]


@pytest.mark.parametrize(
    ("attribute", "names"),
    [
        ("toolset", ["ping", "pong"]),
        ("as_tuple", ["ping"]),
        ("as_toolset", ["ping", "pong"]),
        ("single", ["ping"]),
        ("Holder.tools", ["pong"]),
    ],
)
def test_load_toolset_success(toolmodule: str, attribute: str, names: list[str]) -> None:
    tools = load_toolset(f"{toolmodule}.tools:{attribute}")
    assert [t.name for t in tools] == names
    assert all(isinstance(t, Tool) for t in tools)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("fake_user_tools.tools", "is not of the form 'package.module:name'"),
        ("fake_user_tools.tools:", "is not of the form"),
        (":toolset", "is not of the form"),
        ("a:b:c", "is not of the form"),
        ("fake-user-tools:x", "is not of the form"),
        ("fake_user_tools.nope:toolset", "module 'fake_user_tools.nope' not found"),
        ("no_such_package_xyz.tools:toolset", "module 'no_such_package_xyz.tools' not found"),
        ("fake_user_tools.needs_missing:x", "importing 'fake_user_tools.needs_missing' failed"),
        ("fake_user_tools.broken:x", "RuntimeError: import-time failure"),
        ("fake_user_tools.tools:missing", "has no attribute 'missing'"),
        ("fake_user_tools.tools:number", "expected a Tool, a list of tools or a Toolset, got an int"),
        ("fake_user_tools.tools:with_plain", "item 1 is the plain function 'plain' (decorate it with @tool)"),
        ("fake_user_tools.tools:duplicates", "two tools are named 'ping'"),
    ],
)
def test_load_toolset_failures(toolmodule: str, spec: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_toolset(spec)
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"STEPAGENT_TOOLS={spec!r}")


def test_load_toolset_names_missing_dependency(toolmodule: str) -> None:
    with pytest.raises(ConfigurationError, match="definitely_not_installed_xyz"):
        load_toolset("fake_user_tools.needs_missing:x")


def test_load_toolset_tool_class_hint(toolmodule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import fake_user_tools.tools as module  # type: ignore[import-not-found]

    class MyTool(Tool):
        name = "mine"

    monkeypatch.setattr(module, "classes", [MyTool], raising=False)
    with pytest.raises(ConfigurationError, match=r"the Tool class MyTool \(list an instance: MyTool\(\)\)"):
        load_toolset("fake_user_tools.tools:classes")


# ---------------------------------------------------------------------------------------------------------
# The in-process runner


async def test_runner_runs_the_tool_and_sends_the_result() -> None:
    sender = RecordingSender()
    runner = InProcessFunctionRunner([weather, add])
    context = make_context(sender=sender, runner=runner)
    assert await weather.execute({"city": "Lima"}, context) is None
    assert len(sender.sent) == 1
    message, dedup_id = sender.sent[0]
    assert dedup_id == "tc-1"
    assert message.group_id == "thread-1"
    assert message.content == ToolResult.text("tc-1", "Lima: sunny for 3 days", call_id="call-1")
    assert message.synthetic is None


async def test_runner_sends_error_results() -> None:
    sender = RecordingSender()
    runner = InProcessFunctionRunner(Toolset.of([failing, weather, hangs]))
    await runner.submit("failing", {"reason": "bad input"}, make_context(sender=sender, tool_call_id="a"))
    await runner.submit("weather", {"city": 1}, make_context(sender=sender, tool_call_id="b"))
    await runner.submit("hangs", {}, make_context(sender=sender, tool_call_id="c"))
    await runner.submit("nope", {}, make_context(sender=sender, tool_call_id="d"))
    assert [dedup for _, dedup in sender.sent] == ["a", "b", "c", "d"]
    texts = sender.texts()
    assert texts[0] == "Error: ValueError: bad input"
    assert texts[1].startswith("Error: invalid arguments for tool 'weather': argument 'city'")
    assert texts[2] == "Error: tool 'hangs' timed out after 0.05 s"
    assert texts[3] == "Error: no function tool named 'nope' is registered with this runner"


async def test_runner_accepts_a_mapping_and_ignores_non_function_tools() -> None:
    class Other(Tool):
        name = "other"

    runner = InProcessFunctionRunner({"weather": weather, "other": Other()})
    assert list(runner.tools) == ["weather"]
    runner.add(add)
    assert set(runner.tools) == {"weather", "add_numbers"}


async def test_background_runner_returns_at_once_and_join_waits() -> None:
    gate = asyncio.Event()

    @tool
    async def gated(value: str) -> str:
        """Waits for the gate."""
        await gate.wait()
        return value.upper()

    sender = RecordingSender()
    runner = InProcessFunctionRunner([gated], background=True)
    context = make_context(sender=sender, runner=runner)
    await gated.execute({"value": "x"}, context)
    await gated.execute({"value": "x"}, context)  # same call re-dispatched while running: not run twice
    assert sender.sent == []
    gate.set()
    await runner.join()
    assert sender.texts() == ["X"]


async def test_background_runner_reports_unexpected_failures_on_join() -> None:
    class BrokenSender(RecordingSender):
        async def send(self, message: InputMessage, dedup_id: str) -> None:
            raise OSError("queue down")

    runner = InProcessFunctionRunner([weather], background=True)
    await runner.submit("weather", {"city": "x"}, make_context(sender=BrokenSender()))
    with pytest.raises(OSError, match="queue down"):
        await runner.join()
    await runner.join()  # the failure is reported once


async def test_background_runner_aclose_cancels() -> None:
    runner = InProcessFunctionRunner([hangs], background=True)
    sender = RecordingSender()
    await runner.submit("hangs", {}, make_context(sender=sender))
    await runner.aclose()
    await runner.join()
    assert sender.sent == []
