"""The product speaks to its users: no lab notes in the docs or the code.

Docs, code and tests carry no mention of work sessions, issue numbers, machines that were or
were not lent, or the path of a local literature folder; papers are cited by author and year
(or by title), which a reader can look up.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: What is scanned: the package, the backends, the models, benchmarks, docs, tests, the README.
SCANNED = ["ppl_bdl", "backends", "models", "benchmarks", "docs", "tests", "README.md"]
SUFFIXES = {".py", ".md", ".rst", ".txt", ".sh", ".toml", ".cfg"}
SKIPPED_PARTS = {"_build", "_generated", "__pycache__", "data"}

#: Pattern -> what it catches. Matched per line, case-insensitively.
FORBIDDEN = {
    r"\bsessions?\b": "a work session",
    r"\bissues?[\s#-]*\d+": "an issue number",
    r"(?<![\w&#/])#\d{1,3}\b(?![\w-])": "an issue number",
    r"shared/literature|\bliterature/": "the local literature folder (cite author and year)",
    r"\b(?:was|were|not|never|be|is) lent\b|\blent (?:to|machine|gpu|device)": "a lent machine",
}
#: Lines where "session" names software (pytest's, Ray's, an OS login session), not a work session.
SOFTWARE_SESSION = re.compile(
    r"test session|pytest session|scope=\"session\"|session-local|ray session|tf\.session|"
    r"autogroup|torchrun|session_dir",
    re.IGNORECASE,
)


def _files() -> list[Path]:
    found = []
    for entry in SCANNED:
        path = ROOT / entry
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for file in candidates:
            relative = file.relative_to(ROOT)
            if not file.is_file() or file.suffix not in SUFFIXES and file.name != "README.md":
                continue
            if SKIPPED_PARTS.intersection(relative.parts) or file == Path(__file__):
                continue
            found.append(file)
    return found


def _offences(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in FORBIDDEN.items():
            if not re.search(pattern, line, re.IGNORECASE):
                continue
            if what == "a work session" and SOFTWARE_SESSION.search(line):
                continue
            found.append(f"line {number}: {what}: {line.strip()[:100]}")
    return found


@pytest.mark.parametrize("pattern", sorted(FORBIDDEN))
def test_the_patterns_catch_what_they_are_for(pattern):
    examples = {
        r"\bsessions?\b": "measured in session 8",
        r"\bissues?[\s#-]*\d+": "see #ray-workers-issue-204",
        r"(?<![\w&#/])#\d{1,3}\b(?![\w-])": "fixed in #21",
        r"shared/literature|\bliterature/": "see ../shared/literature/000.txt",
        r"\b(?:was|were|not|never|be|is) lent\b|\blent (?:to|machine|gpu|device)": (
            "no GPU was lent"
        ),
    }
    assert re.search(pattern, examples[pattern], re.IGNORECASE)
    assert not _offences('color = "#1f77b4"; scope="session"  # a pytest session fixture')


def test_docs_and_code_carry_no_lab_notes():
    offences = {
        str(file.relative_to(ROOT)): found
        for file in _files()
        if (found := _offences(file.read_text(encoding="utf-8", errors="replace")))
    }
    assert not offences, "\n".join(
        f"{name}: {line}" for name, lines in offences.items() for line in lines
    )
