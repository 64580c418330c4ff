"""Encryption at rest for users' OAuth tokens: the :class:`Cipher` port and its local implementation.

- :class:`Cipher` seals bytes under a ``context`` (the storage key they are kept under): a sealed value
  opens only with the same context, so a token copied to another user's or server's key does not open.
- :class:`LocalCipher` (``stepagent run`` and the embedded stack): AES-256-GCM from ``cryptography``, with
  a random 96-bit nonce per value and the context as associated data. The key is 32 random bytes in a file
  of the stack's state directory, created once with mode 0600 (never widened; an existing file is used
  as it is).
- In AWS the tool runner and the API use :class:`stepagent.aws.kms_cipher.KmsCipher` (a KMS key of the
  template).

A value that does not open (tampered, another key, another context) raises :class:`SealBroken`.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Protocol

#: The local key's file name in the state directory.
KEY_FILE = "oauth-token.key"


class SealBroken(Exception):
    """A sealed value does not open with this key and context."""


class Cipher(Protocol):
    """Seals and opens small values (tokens) bound to a context string."""

    async def seal(self, plaintext: bytes, context: str) -> str: ...

    async def open(self, sealed: str, context: str) -> bytes: ...


class LocalCipher:
    """AES-256-GCM under a key file (see the module docstring)."""

    PREFIX = "aesgcm1:"

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("the local token key must be 32 bytes")
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(key)

    @classmethod
    def from_dir(cls, state_dir: Path) -> LocalCipher:
        """The cipher of ``state_dir``'s key file, created (0600) if there is none."""
        path = Path(state_dir) / KEY_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls(path.read_bytes())
        key = os.urandom(32)
        with os.fdopen(fd, "wb") as out:
            out.write(key)
        return cls(key)

    async def seal(self, plaintext: bytes, context: str) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, plaintext, context.encode())
        return self.PREFIX + base64.b64encode(nonce + sealed).decode()

    async def open(self, sealed: str, context: str) -> bytes:
        from cryptography.exceptions import InvalidTag

        if not sealed.startswith(self.PREFIX):
            raise SealBroken("not sealed with the local key")
        try:
            raw = base64.b64decode(sealed[len(self.PREFIX) :])
            return self._aead.decrypt(raw[:12], raw[12:], context.encode())
        except (InvalidTag, ValueError):
            raise SealBroken("the value does not open with the local key") from None
