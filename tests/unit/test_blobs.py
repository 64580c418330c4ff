"""stepagent.blobs: splitting a JSON document into its skeleton and large texts, and putting them back."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from stepagent.blobs import canonical, digest_of, dumps, fill, is_digest, key_of, split


def test_large_strings_become_holes_at_their_paths_and_fill_restores_the_document() -> None:
    big, other = "é" * 20_000, "b" * 40_000  # 40,000 UTF-8 bytes each; the first has only 20,000 chars
    doc = {"a": [1, {"text": big}, "small"], "b": other, "c": None, "d": "x" * 31_999}
    original = copy.deepcopy(doc)
    skeleton, holes = split(doc, 32_000)
    assert holes == [(["a", 1, "text"], big), (["b"], other)]
    assert skeleton == {"a": [1, {"text": ""}, "small"], "b": "", "c": None, "d": "x" * 31_999}
    assert doc == original  # the input is not changed
    assert fill(json.loads(json.dumps(skeleton)), holes) == original


def test_a_document_without_large_strings_has_no_holes_and_a_large_root_string_is_one() -> None:
    assert split({"a": "small", "n": [1, 2.5, True]}, 32_000) == ({"a": "small", "n": [1, 2.5, True]}, [])
    assert split("r" * 32_000, 32_000) == ("", [([], "r" * 32_000)])
    assert fill("", [([], "r" * 32_000)]) == "r" * 32_000


@pytest.mark.parametrize(
    ("skeleton", "path"),
    [
        ({"a": "not empty"}, ["a"]),
        ({"a": ""}, ["b"]),
        ({"a": [""]}, ["a", 3]),
        ("x", []),
        ({"a": 1}, ["a", 0]),
    ],
)
def test_fill_refuses_a_path_that_is_not_a_hole(skeleton: object, path: list[str | int]) -> None:
    with pytest.raises(ValueError):
        fill(skeleton, [(path, "text")])


def test_keys_are_named_by_the_utf8_sha256_of_the_text() -> None:
    digest = digest_of("abc")  # FIPS 180-2's test vector
    assert digest == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" and is_digest(digest)
    assert digest_of("é") == hashlib.sha256(b"\xc3\xa9").hexdigest()
    assert key_of(digest) == f"blobs/sha256/{digest}"
    assert not is_digest("A" * 64) and not is_digest("0" * 63) and not is_digest(None)


@pytest.mark.parametrize(
    "text",
    ['{"a": 1}', '{"a":"\\u00e9"}', '{"a":1.10}', '{"a":1e5}', '{"a":1,"a":2}', "not json", ' {"a":1}'],
)
def test_only_json_that_dumps_reproduces_exactly_is_canonical(text: str) -> None:
    assert canonical(text) == (False, None)


def test_canonical_json_round_trips_through_split_and_fill() -> None:
    text = dumps({"t": "ü" * 40_000, "n": [1, 2.5, None, True], "s": "\u2028"})
    parsed, doc = canonical(text)
    assert parsed
    skeleton, holes = split(doc)
    assert dumps(fill(json.loads(dumps(skeleton)), holes)) == text
