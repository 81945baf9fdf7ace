"""The docs and the code's comments describe the project as it is, to its users: no issue numbers,
no numbered rounds of work, no "session" of work. History belongs in CHANGELOG.md (not checked)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
            "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|"
            "(?:twenty|thirty|forty)(?:-(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth))?|"
            "twentieth|thirtieth|fortieth|\\d+(?:st|nd|rd|th)")

#: name → pattern of what a doc must not say (case-insensitive)
FORBIDDEN = {
    "an issue number": re.compile(r"\bissues?\s*#?\s*\d+", re.I),
    "a numbered round of work": re.compile(
        rf"\b(?:{ORDINALS})(?:\s+(?:and|or|to)\s+(?:{ORDINALS}))?\s+(?:review\s+)?"
        r"(?:rounds?|sessions?)\b(?![- ]trips?)|\b(?:rounds?|sessions?)\s+#?\d+\b", re.I),
    "a session of work": re.compile(r"\bsessions?\b", re.I),
}

#: "session" in the serving sense: a client's conversation with a server (BLIS's closed-loop
#: multi-turn sessions), which the docs may name
SERVING_SESSION = re.compile(r"\b(?:closed-loop|multi-turn|chat|client|user|HTTP)\s+sessions?\b", re.I)


def checked_files() -> list[Path]:
    """docs/, README.md, roofcal/**/*.py and bench/*.md; CHANGELOG.md is where history goes."""
    files = [p for p in (ROOT / "docs").rglob("*") if p.is_file() and p.suffix in (".md", ".txt", ".rst")]
    files += [ROOT / "README.md", *sorted((ROOT / "roofcal").rglob("*.py")), *sorted((ROOT / "bench").glob("*.md"))]
    return [p for p in files if p.name != "CHANGELOG.md"]


def findings(text: str) -> list[tuple[int, str, str]]:
    """(line, what, the words) for every forbidden phrase in ``text``."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        cleared = SERVING_SESSION.sub("", line)
        for what, pattern in FORBIDDEN.items():
            for m in pattern.finditer(cleared):
                out.append((n, what, m.group(0)))
    return out


def test_checked_files_exist():
    files = checked_files()
    assert ROOT / "README.md" in files and any(p.parent.name == "docs" for p in files)
    assert any(p.suffix == ".py" for p in files)


def test_no_issue_numbers_rounds_or_sessions():
    bad = [f"{p.relative_to(ROOT)}:{n}: {what}: {words!r}"
           for p in checked_files() for n, what, words in findings(p.read_text(encoding="utf-8"))]
    assert not bad, "history belongs in CHANGELOG.md; say it in the present tense:\n" + "\n".join(bad)


def test_the_patterns_catch_what_they_name():
    for text in ("fixed in issue 31", "see Issue #12", "issues 4 and 5",
                 "the twentieth session's run", "measured in the twenty-second session",
                 "in the sixteenth and seventeenth sessions", "round 3 of review", "this session",
                 "an earlier session found", "the 12th round"):
        assert findings(text), text
    for text in ("BLIS's expansion runs closed-loop sessions", "closed-loop multi-turn sessions",
                 "the file's round trip", "the first round-trip", "rounded to 3 decimals",
                 "vLLM PRs #10511 and #12126", "the first stage, the second fit", "round(x, 4)"):
        assert not findings(text), text
