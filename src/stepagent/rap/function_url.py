"""The request a Lambda Function URL hands the RAP receiver and the response it expects, as TypedDicts, so
the type checker follows a callback from the event to the answer.

Guarantees: :class:`FunctionUrlEvent` names the fields of the Function URL event (payload format 2.0, plus
the 1.0 ``httpMethod``) that the receiver reads — every key optional, since a missing one is bad input
rather than something to trust; :class:`FunctionUrlResponse` is the response it returns. These are
declarations, not validation: the receiver still checks every value it reads.
"""

from __future__ import annotations

from typing import TypedDict


class FunctionUrlHttp(TypedDict, total=False):
    """``requestContext.http``: the request line."""

    method: str
    path: str


class FunctionUrlRequestContext(TypedDict, total=False):
    """``requestContext`` (only ``http`` is read)."""

    http: FunctionUrlHttp


class FunctionUrlEvent(TypedDict, total=False):
    """A Function URL request as Lambda delivers it (header names lower-cased)."""

    requestContext: FunctionUrlRequestContext
    httpMethod: str  # payload format 1.0's request method
    headers: dict[str, str]
    queryStringParameters: dict[str, str]
    body: str
    isBase64Encoded: bool


class FunctionUrlResponse(TypedDict):
    """What the receiver answers: the status, the headers and the JSON body as text."""

    statusCode: int
    headers: dict[str, str]
    body: str
