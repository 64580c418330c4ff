"""The ciphers that seal users' OAuth tokens: the local AES-GCM key file (created once, 0600) and KMS (on
moto). A value opens only with its own key and context; anything else is ``SealBroken``."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from stepagent.aws.kms_cipher import KmsCipher
from stepagent.tools.token_cipher import KEY_FILE, LocalCipher, SealBroken
from tests.conftest import aws_client


async def test_the_local_key_file_is_created_once_private_and_reused(tmp_path: Path) -> None:
    first = LocalCipher.from_dir(tmp_path / "state")
    key_file = tmp_path / "state" / KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    sealed = await first.seal(b"at-secret", "k1")
    assert "at-secret" not in sealed
    again = LocalCipher.from_dir(tmp_path / "state")  # a later run: same key
    assert await again.open(sealed, "k1") == b"at-secret"


async def test_a_local_value_opens_only_with_its_key_and_context(tmp_path: Path) -> None:
    cipher = LocalCipher.from_dir(tmp_path)
    sealed = await cipher.seal(b"at-secret", "k1")
    with pytest.raises(SealBroken):
        await cipher.open(sealed, "k2")  # copied under another user's key
    with pytest.raises(SealBroken):
        await LocalCipher.from_dir(tmp_path / "other").open(sealed, "k1")
    tampered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    with pytest.raises(SealBroken):
        await cipher.open(tampered, "k1")
    with pytest.raises(SealBroken):
        await cipher.open("plain text", "k1")


async def test_kms_seals_under_the_stack_key_and_context() -> None:
    async with aws_client("kms") as kms:
        key_id = (await kms.create_key())["KeyMetadata"]["KeyId"]
        cipher = KmsCipher(kms, key_id)
        sealed = await cipher.seal(b"rt-secret", "k1")
        assert sealed.startswith("kms1:") and "rt-secret" not in sealed
        assert await cipher.open(sealed, "k1") == b"rt-secret"
        with pytest.raises(SealBroken):
            await cipher.open(sealed, "k2")
        with pytest.raises(SealBroken):
            await cipher.open("aesgcm1:AAAA", "k1")
