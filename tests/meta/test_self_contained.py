"""The repository explains itself: nothing points outside it, every cited decision exists."""

from __future__ import annotations

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "design" / "decisions.md"

# Paths and documents that exist only outside the repository, written as escaped patterns so
# that this file does not match itself.
_OUTSIDE = re.compile(
    "|".join(
        [
            r"\.\./shared",
            r"shared/(spec|docs)",
            r"[/]work/",
            r"spec/seed[s]",
            r"(DECISIONS|ARCHITECTURE|CONVENTIONS|FIELD-NOTES)\.md",
            r"constellation-language\.md",
        ]
    )
)
# Pointers into texts a reader of the repository cannot open: an issue of the tracker the project
# was planned in, a source design by section number (their text is not in docs/design/), "the
# seed" (what the source designs were called there). An issue of a public project names the
# project ("httpcore issue 1093"); an IETF RFC ("RFC 9110 §15.5.6") is public. Escaped so that
# this file does not match itself.
_PUBLIC_PROJECTS = ("httpcore", "grpc", "httpx", "starlette", "cpython", "uvicorn", "anyio")
_POINTER = re.compile(
    "|".join(
        [
            "".join(f"(?<!{p} )" for p in _PUBLIC_PROJECTS) + r"\b[Ii]ssue #?\d",
            r"\b[Ii]ssue'[s]\b",
            r"\b(?:foundation|host's|workflow|pipeline|deferred|propagation|dsl) [i]ssue\b",
            r"\([Ii]ssue:",
            r"\bRFC(?:[ -]0\d*)? ?§",  # RFC 0002 and RFC-002 are source designs
            r"\bP0?55 ?§",
            r"\b[Ss]eed'[s]\b",
            r"\b(?:the|userver|Wonder|Orbiplex) [s]eed\b(?!\s*[\d=(])",
            r"\bO[Q]\d",
        ]
    )
)
_CITATION = re.compile(r"(?<![\w.])D(\d{1,2})\.(\d{1,2})(?![\w.]\d)")
_ENTRY = re.compile(r"^\*\*D(\d+)\.(\d+) ", re.M)
_MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_CITING_TREES = ("src", "docs", "tests", "bench", "examples", "README.md")


def _repository_files() -> list[pathlib.Path]:
    """Tracked files plus new ones not ignored (what the next commit could contain)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [ROOT / name for name in sorted(set(listed.split("\0"))) if name]


def _text(path: pathlib.Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
        return None  # binary, or deleted in the work tree


def test_no_file_points_outside_the_repository() -> None:
    """No tracked file names a document or path that exists only outside the repository."""
    hits = []
    for path in _repository_files():
        text = _text(path)
        if text is None:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if _OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not hits, "files point outside the repository:\n" + "\n".join(hits)


def _pointers(text: str) -> list[tuple[int, str]]:
    return [
        (lineno, line.strip())
        for lineno, line in enumerate(text.splitlines(), 1)
        if _POINTER.search(line)
    ]


def test_no_pointer_to_a_text_the_reader_cannot_open() -> None:
    """No comment, docstring, test name or page points at an issue or a section of a source
    design that is not in the repository: it says what is meant, or cites a decision Dn.m."""
    hits = []
    for path in _repository_files():
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in _CITING_TREES or (text := _text(path)) is None:
            continue
        hits += [f"{rel}:{lineno}: {line}" for lineno, line in _pointers(text)]
    assert not hits, "pointers a reader cannot open:\n" + "\n".join(hits)


def test_the_pointer_patterns_catch_what_they_should_and_only_that() -> None:
    """The patterns above find the pointers that were once written here, not public ones."""
    caught = [
        "as iss" + "ue 7 §4 says",
        "names fixed by iss" + "ue 11",
        "The iss" + "ue's scenario",
        "the workflow iss" + "ue",
        "the se" + "ed's example",
        "where the se" + "ed is silent",
        "(RF" + "C §5.6)",
        "RF" + "C 0002 §5.3",
        "P0" + "55 §2",
        "open question O" + "Q3",
    ]
    fine = [
        "RFC 9110 §15.5.6",
        "httpcore issue 1093",
        "grpc issue 26236",
        "random order, seed 1782211968",
        "set the seed (=42)",
        "D6.2's worked example",
        "RFC 0002, *Timeout wrapper*",
    ]
    assert [t for t in caught if not _POINTER.search(t)] == []
    assert [t for t in fine if _POINTER.search(t)] == []


def test_markdown_links_stay_inside_the_repository() -> None:
    """Every relative link in a Markdown file resolves to a file inside the repository."""
    bad = []
    for path in _repository_files():
        if path.suffix != ".md" or (text := _text(path)) is None:
            continue
        for target in _MD_LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto: and the like are public addresses
            resolved = (path.parent / target).resolve()
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                bad.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not bad, "broken or outward links:\n" + "\n".join(bad)


def _entries() -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in _ENTRY.findall(RECORD.read_text(encoding="utf-8"))}


def test_design_record_numbers_each_section_without_gaps() -> None:
    """Each section of the design record numbers its entries 1, 2, 3, ... with no gap."""
    by_section: dict[int, list[int]] = {}
    for section, number in sorted(_entries()):
        by_section.setdefault(section, []).append(number)
    assert sorted(by_section) == list(range(1, max(by_section) + 1))
    for section, numbers in by_section.items():
        assert numbers == list(range(1, len(numbers) + 1)), f"D{section}: {numbers}"


def test_every_cited_decision_exists() -> None:
    """Every D<n>.<m> cited in src/, docs/, tests/, bench/, examples/ or the README is recorded."""
    entries = _entries()
    missing = []
    for path in _repository_files():
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in _CITING_TREES or (text := _text(path)) is None:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for a, b in _CITATION.findall(line):
                if (int(a), int(b)) not in entries:
                    missing.append(f"{rel}:{lineno}: D{a}.{b}")
    assert not missing, "cited decisions missing from docs/design/decisions.md:\n" + "\n".join(
        missing
    )
