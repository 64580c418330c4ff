"""The strict schemas we send for a pydantic class equal the vendors' SDKs' rewrites of the same class, over
classes that exercise every branch of the rewrites: ``$ref`` roots and ``$ref`` beside other keywords,
discriminated unions (``oneOf``), ``allOf``, literals (``const``/``enum``), recursive models, open dicts,
string formats, array bounds and ``None`` defaults. The input schema is never modified."""

from __future__ import annotations

import copy
import datetime
import enum
import uuid
from typing import Annotated, Any, Literal

import anthropic
import pydantic
import pytest
from openai.lib._pydantic import to_strict_json_schema

from stepagent.errors import ProviderError
from stepagent.providers.strict_schema import anthropic_strict_schema, openai_strict_schema


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class Cat(pydantic.BaseModel):
    kind: Literal["cat"]
    lives: int = pydantic.Field(ge=0, le=9)


class Dog(pydantic.BaseModel):
    kind: Literal["dog"]
    good: bool = True


class Address(pydantic.BaseModel):
    street: str
    zip_code: str = pydantic.Field(pattern=r"^\d{5}$", min_length=5)


class Node(pydantic.BaseModel):
    label: str
    children: list[Node] = []


class Everything(pydantic.BaseModel):
    """Every keyword the rewrites handle."""

    pet: Annotated[Cat | Dog, pydantic.Field(discriminator="kind")]
    home: Address = pydantic.Field(description="where they live")
    work: Address | None = None
    colour: Colour = Colour.RED
    mode: Literal["fast"] = "fast"
    when: datetime.datetime
    day: datetime.date | None = None
    ident: uuid.UUID
    extras: dict[str, Any] = {}
    scores: list[float] = pydantic.Field(min_length=2, max_length=5)
    one_or_more: list[int] = pydantic.Field(min_length=1)
    tree: Node | None = None


class Tags(pydantic.RootModel[list[str]]):
    pass


CLASSES = [Everything, Node, Address, Cat, Tags]


@pytest.mark.parametrize("model", CLASSES, ids=lambda m: m.__name__)
def test_anthropic_rewrite_equals_the_sdks(model: type[pydantic.BaseModel]) -> None:
    schema = model.model_json_schema()
    original = copy.deepcopy(schema)
    assert anthropic_strict_schema(schema, model.__name__) == anthropic.transform_schema(model)
    assert schema == original


@pytest.mark.parametrize("model", CLASSES, ids=lambda m: m.__name__)
def test_openai_rewrite_equals_the_sdks(model: type[pydantic.BaseModel]) -> None:
    schema = model.model_json_schema()
    original = copy.deepcopy(schema)
    assert openai_strict_schema(schema, model.__name__) == to_strict_json_schema(model)
    assert schema == original


def test_a_root_model_keeps_its_definitions_for_anthropic() -> None:
    class Wrapped(pydantic.RootModel[Address]):
        pass

    ours = anthropic_strict_schema(Wrapped.model_json_schema(), "Wrapped")
    assert ours == anthropic.transform_schema(Wrapped.model_json_schema())
    assert set(ours) == {"$defs", "$ref"}


def test_a_schema_openai_cannot_resolve_fails_clearly() -> None:
    broken = {"type": "object", "properties": {"a": {"$ref": "http://elsewhere/x", "description": "d"}}}
    with pytest.raises(ProviderError, match="Broken cannot be used for OpenAI structured output") as info:
        openai_strict_schema(broken, "Broken")
    assert not info.value.retryable
