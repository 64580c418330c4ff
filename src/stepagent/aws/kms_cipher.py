"""Users' OAuth tokens sealed with a KMS key (``STEPAGENT_OAUTH_KEY_ID``, the template's ``OAuthTokenKey``).

A value is KMS ``Encrypt``-ed directly (tokens are far below KMS's 4 KiB limit) with the encryption
context ``{"stepagent:oauth": <storage key>}``, so it decrypts only under the key it is kept at; the
plaintext never leaves this process. A value that does not decrypt raises
:class:`~stepagent.tools.token_cipher.SealBroken`; KMS being unreachable propagates (retried).
"""

from __future__ import annotations

import base64
from typing import Any

from stepagent.tools.token_cipher import SealBroken

_CONTEXT_KEY = "stepagent:oauth"


class KmsCipher:
    """:class:`~stepagent.tools.token_cipher.Cipher` over an aiobotocore KMS client."""

    PREFIX = "kms1:"

    def __init__(self, kms: Any, key_id: str) -> None:
        self._kms = kms
        self.key_id = key_id

    async def seal(self, plaintext: bytes, context: str) -> str:
        response = await self._kms.encrypt(
            KeyId=self.key_id, Plaintext=plaintext, EncryptionContext={_CONTEXT_KEY: context}
        )
        return self.PREFIX + base64.b64encode(response["CiphertextBlob"]).decode()

    async def open(self, sealed: str, context: str) -> bytes:
        from botocore.exceptions import ClientError

        if not sealed.startswith(self.PREFIX):
            raise SealBroken("not sealed with KMS")
        try:
            response = await self._kms.decrypt(
                CiphertextBlob=base64.b64decode(sealed[len(self.PREFIX) :]),
                EncryptionContext={_CONTEXT_KEY: context},
                KeyId=self.key_id,
            )
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code")
            if code in ("InvalidCiphertextException", "IncorrectKeyException"):
                raise SealBroken("the value does not decrypt under this key and context") from None
            raise
        return bytes(response["Plaintext"])
