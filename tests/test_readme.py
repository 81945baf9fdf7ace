"""The README as a user follows it: its set-up commands are the ones CI runs (``.ci/run``), its
test command ends with pytest's summary line, it stays short, and every page it links exists."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_commands() -> list[str]:
    """Every line of the README's ``sh`` blocks, continuation lines joined."""
    text = README.read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def setup_commands() -> tuple[str, str]:
    """(install, test) of the README's set-up: the test command is the one ending in pytest."""
    tests = [c for c in readme_commands() if "pip install" in c and "pytest" in c]
    assert len(tests) == 1, f"README: {len(tests)} set-up commands run pytest, expected 1"
    parts = [p.strip() for p in tests[0].split("&&")]
    install = next(p for p in parts if p.startswith("pip install"))
    return install, parts[-1]


def slow_tier_command() -> str:
    """The README's command of the slow tier (``pytest -m slow``)."""
    slow = [c for c in readme_commands() if "pytest" in c and re.search(r"-m\s+slow\b", c)]
    assert len(slow) == 1, f"README: {len(slow)} commands run the slow tier, expected 1"
    return slow[0]


def test_ci_installs_and_tests_as_the_readme_says():
    """CI installs as the README says and runs both of its test commands: the quick tier (the
    default), then the slow tier."""
    install, test = setup_commands()
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    # CI adds pip's quiet flag; the install is otherwise the README's, word for word
    assert install.replace("pip install", "pip install -q", 1) in ci, (install, ci)
    assert test in ci, (test, ci)
    slow = slow_tier_command()
    assert slow in ci and ci.index(test) < ci.index(slow), (slow, ci)
    assert "set -euo pipefail" in ci                       # a failing tier (or exit 5) fails CI


def test_readme_test_command_prints_the_summary_line(tmp_path):
    """The README's pytest flags together with pyproject's ``addopts`` still print the final
    ``N passed`` line (``-q`` twice is ``-qq``: dots alone), and run the quick tier: a test
    marked ``slow`` (here one that fails) is left to the slow tier's command."""
    _, test = setup_commands()
    argv = shlex.split(test)
    assert argv[:3] == ["python", "-m", "pytest"], test
    (tmp_path / "test_one.py").write_text("import pytest\n\n\ndef test_one():\n    assert True\n\n\n"
                                          "@pytest.mark.slow\ndef test_slow():\n    assert False, 'the slow tier ran'\n",
                                          encoding="utf-8")
    # the project's pytest configuration (pyproject.toml) with the README's flags, on two tests
    proc = subprocess.run([sys.executable, "-m", "pytest", *argv[3:], "-c", str(ROOT / "pyproject.toml"),
                           "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(tmp_path / "test_one.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^1 passed\b", proc.stdout, re.M), f"no summary line:\n{proc.stdout}"


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def test_readme_is_short_and_finished():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README has {len(lines)} lines (a ten-minute read: ≤ 200)"
    assert not [ln for ln in lines if "⟨" in ln], "README has unfilled figures"


def test_every_link_of_the_readme_and_docs_resolves():
    """Every relative link of README.md and docs/*.md names a file that exists, and an anchor
    that is a heading of it (pages moved from the README keep working)."""
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue                                    # http(s), mailto
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
