"""Comments, docstrings and documents cite only what a reader of this repository can open.

A pointer to a document that is not in the repository ("DESIGN §3", ``spec/bounded-history.md``, "issue 15",
a reference suite's case number such as "EP22") tells a newcomer nothing: the sentence it stands for has
to be written where the pointer was. This test reads every text file of the source, the tests, the
benchmarks, the docs, the handlers, the examples, the build files and the README, and fails with each
pointer it finds (file, line and what to write instead). Section signs are allowed after an RFC number
("RFC 7518 §3.3"): an RFC can be opened by anyone.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: What is scanned: folders (recursively) and single files, relative to the repository root.
SCANNED = ("src", "tests", "bench", "docs", "handlers", "examples", "infra", "README.md", "Makefile")
SCANNED += ("template.yaml", "pyproject.toml")
#: Hand-written text; generated or recorded data (``docs/benchmarks.json``, the release corpora) is not.
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".html", ".js", ".css", ".sh", ".cfg"}
SKIPPED_PARTS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}

#: Each pointer a reader cannot follow, and why. (This file's own patterns are the one place they appear.)
UNCITABLE: dict[str, str] = {
    r"\bDESIGN\b": "a section of a design document that is not in the repository",
    r"(?<!RFC \d{4} )§": "a section of a document that is not in the repository (only an RFC's may be cited)",
    r"\bspec/": "a file of a spec folder that is not in the repository",
    r"\bbounded-history\b": "the bounded-history spec, which is not in the repository",
    r"\breference-core\b": "the reference runtime's conformance document, which is not in the repository",
    r"\brap-bridge\b": "the reference runtime's bridge tests, which are not in the repository",
    r"(?:\b|_)[Ii]ssues?[- _]?#?\d+": "an issue number of a tracker the reader cannot open",
    r"\bthe issue(?:'s\b| \")": "an issue of a tracker the reader cannot open",
    r"\bW\d+\b": "a weakness label of a document that is not in the repository",
    r"\b(?:EP|SY|SB|ST|LD|LR)\d{1,2}\b": "a case number of the reference runtime's conformance suite",
    r"\bAppendix [A-Z]\b": "an appendix of a document that is not in the repository",
    r"\bM[1-9]\b": "a memory-gate label of a spec that is not in the repository",
}
RULES = [(re.compile(pattern), why) for pattern, why in UNCITABLE.items()]
ANY = re.compile("|".join(f"(?:{pattern})" for pattern in UNCITABLE))


def scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        for file in candidates:
            parts = set(file.relative_to(ROOT).parts)
            if not file.is_file() or parts & SKIPPED_PARTS or any(p.endswith(".egg-info") for p in parts):
                continue
            if file.suffix in TEXT_SUFFIXES or file.name == "Makefile":
                files.append(file)
    return [f for f in files if f.resolve() != Path(__file__).resolve()]


def uncitable_references(text: str) -> list[tuple[int, str, str]]:
    """(line number, the pointer, why a reader cannot follow it) for each pointer in ``text``."""
    if not ANY.search(text):
        return []
    return [
        (number, match.group(0), why)
        for number, line in enumerate(text.splitlines(), 1)
        for rule, why in RULES
        for match in rule.finditer(line)
    ]


def test_the_scan_covers_the_repository() -> None:
    files = {f.relative_to(ROOT).as_posix() for f in scanned_files()}
    for expected in ("README.md", "docs/reliability.md", "bench/memory.py", "src/stepagent/texts.py"):
        assert expected in files
    assert "tests/unit/test_citable_references.py" not in files


def test_each_pattern_catches_what_it_names_and_spares_what_a_reader_can_open() -> None:
    caught = [
        "the durability invariants of DESIGN §3",
        "``spec/bounded-history.md`` §5",
        "(issue 15)",
        "the issue-13 state",
        "Reference issue #64",
        "def test_issue31_shape",
        "next to the issue's targets",
        "fixes W22",
        "Ports SY08, SY10",
        "# LR1",
        "reference Appendix A",
        "Memory gate M3",
        "§8.11 gaps",
    ]
    for text in caught:
        assert uncitable_references(text), text
    spared = [
        "RFC 7518 §3.3 asks for 2048 bits",
        "the W3C `traceparent`",
        "an S3 bucket",
        "test_ep22_basic_text_completion",
        "docs/reliability.md's known weakness 1",
        "tokens issued by earlier versions",
    ]
    for text in spared:
        assert not uncitable_references(text), text


def test_no_comment_docstring_or_document_points_at_what_a_reader_cannot_open() -> None:
    problems = [
        f"{file.relative_to(ROOT)}:{number}: {pointer!r} is {why}; write the sentence it stands for instead"
        for file in scanned_files()
        for number, pointer, why in uncitable_references(file.read_text(encoding="utf-8"))
    ]
    assert not problems, "\n".join(problems)
