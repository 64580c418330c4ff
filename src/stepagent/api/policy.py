"""What a caller may say about itself in a message's ``metadata``: identity comes from the token only.

The runtime passes the root metadata's ``user_id`` to every tool (``ToolContext.user_id``, the RAP
``user_id``) and its ``profile`` selects the agent profile (model, tools, limits). So the API, not the
body, decides both:

- ``user_id`` is reserved: a body that sets it is refused (400); with authentication the API sets it to
  the verified subject in every metadata it sends. A message's metadata replaces the conversation's, and a
  message without metadata keeps it: so a message without metadata to a thread that does not exist yet
  gets ``{"user_id": subject}``, and one to an existing thread keeps the metadata its first message set
  (which the API wrote, with the subject, since only the API's messages create an owned thread).
- ``profile`` is honoured only when it is in ``STEPAGENT_API_PROFILES`` (a comma-separated allow-list;
  empty, the default, lets no caller choose one): any other is refused (422 ``profile_not_allowed``).
- With authentication ``metadata`` must be a JSON object (or absent), since the subject is written into it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stepagent.agent_config import PROFILE_METADATA_KEY

#: The metadata key the runtime hands to tools as the acting user.
USER_ID_KEY = "user_id"


class MetadataRefused(Exception):
    """The body's metadata claims what only the deployment may decide (its status, code and message)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True, slots=True)
class ApiPolicy:
    """The deployment's choices about callers' metadata (``STEPAGENT_API_PROFILES``)."""

    #: The profiles a caller may select with ``metadata.profile``.
    profiles: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ApiPolicy:
        raw = environ.get("STEPAGENT_API_PROFILES") or ""
        return cls(profiles=frozenset(name.strip() for name in raw.split(",") if name.strip()))

    def metadata(self, metadata: Any, subject: str | None, *, new_thread: bool) -> Any:
        """The metadata to send for a caller's ``metadata``: checked, and with ``user_id`` = ``subject``
        (``None``: no authentication, nothing to set); ``new_thread``: the store has no such thread yet.
        :class:`MetadataRefused` when it cannot be sent."""
        if metadata is None and not new_thread:
            return None
        if metadata is not None and not isinstance(metadata, dict):
            if subject is None:
                return metadata
            raise MetadataRefused(
                400, "bad_request", "metadata must be a JSON object (the API adds the user's id to it)"
            )
        fields = dict(metadata or {})
        if USER_ID_KEY in fields:
            raise MetadataRefused(
                400,
                "bad_request",
                f"metadata.{USER_ID_KEY} is reserved: the API sets it to the signed-in user (the token's subject)",
            )
        profile = fields.get(PROFILE_METADATA_KEY)
        if PROFILE_METADATA_KEY in fields and not (isinstance(profile, str) and profile in self.profiles):
            allowed = ", ".join(sorted(self.profiles)) or "none (STEPAGENT_API_PROFILES is empty)"
            raise MetadataRefused(
                422,
                "profile_not_allowed",
                f"metadata.{PROFILE_METADATA_KEY} {profile!r} may not be chosen through the API "
                f"(allowed: {allowed})",
            )
        if subject is None:
            return metadata
        return {**fields, USER_ID_KEY: subject}
