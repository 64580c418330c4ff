"""The error tree's one classification rule (``errors.classify``) and the strays it absorbed."""

from __future__ import annotations

import pytest

from stepagent import errors
from stepagent.errors import (
    CallbackError,
    CallbackRefusedError,
    ChoiceAnswerError,
    ConfigurationError,
    CorruptDataError,
    CorruptRowError,
    InvalidRewindError,
    MalformedMessageError,
    ProviderError,
    RetriesExhaustedError,
    StepagentError,
    StoreError,
    ToolError,
    classify,
)


@pytest.mark.parametrize(
    ("error", "disposition"),
    [
        (ConfigurationError("x"), "fatal"),
        (MalformedMessageError("x"), "reject"),
        (InvalidRewindError("x"), "reject"),
        (ChoiceAnswerError("x"), "reject"),
        (RetriesExhaustedError("x", attempts=5), "reject"),
        (StoreError("x"), "retry"),
        (CallbackError("x"), "retry"),
        (CallbackRefusedError("HTTP 403"), "reject"),
        (ProviderError("x", retryable=True), "retry"),
        (ProviderError("x", retryable=False), "reject"),
        (ToolError("x"), "result"),
        (CorruptRowError("x"), "retry"),
        (RecursionError(), "reject"),
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), "reject"),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "reject"),
        (RuntimeError("flaky"), "retry"),
        (ValueError("a bug"), "retry"),
        (OSError("network"), "retry"),
    ],
)
def test_classify_gives_every_exception_one_disposition(error: BaseException, disposition: str) -> None:
    assert classify(error) == disposition


def test_a_non_retryable_provider_error_says_so() -> None:
    refused = ProviderError("HTTP 400: prompt too long", retryable=False, status=400)
    assert not refused.retryable and refused.disposition == "reject"
    overloaded = ProviderError("HTTP 529: overloaded", retryable=True, status=529)
    assert overloaded.retryable and overloaded.disposition == "retry"


def test_every_deliberate_error_class_lives_in_the_one_tree() -> None:
    """The strays moved in: the modules that raise them re-export the tree's classes."""
    from stepagent import history_items
    from stepagent.rap import choices, server

    assert history_items.CorruptRowError is CorruptRowError and issubclass(CorruptRowError, CorruptDataError)
    assert choices.ChoiceAnswerError is ChoiceAnswerError
    assert server.CallbackError is CallbackError
    defined = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, BaseException)]
    assert all(issubclass(cls, StepagentError) for cls in defined)
