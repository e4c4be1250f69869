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
