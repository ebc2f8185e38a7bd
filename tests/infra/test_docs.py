"""The docs a newcomer reads: every link between them leads somewhere, and no page is a wall.

Every relative link in a tracked Markdown file must name a file that exists and, for a
Markdown target, a heading it has (GitHub's anchors: lowercase, punctuation dropped,
spaces to hyphens, a repeat suffixed -1, -2, ...). The same for the docs/ paths the code,
the Terraform and the manifests quote (an Event note, a variable's description). README.md
stays under 10 KB and every other tracked Markdown page (docs/, infra/, tests/) under 25 KB.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

README_MAX = 10 * 1024
PAGE_MAX = 25 * 1024

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
QUOTED_DOC = re.compile(r"(?<![\w-])((?:infra/|tests/)?docs/[\w.-]+\.md)(#[\w-]+)?")
QUOTING = {".go", ".rs", ".tf", ".py", ".yaml", ".yml", ".sh", ".toml", ".hcl", ".service", ".example", ".json"}


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / line for line in out.stdout.splitlines() if (REPO / line).is_file()]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"^#{1,6} (.*)$", line)
        if fenced or not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        # Code spans may hold link-like text: they are not links.
        line = re.sub(r"`[^`]*`", "", line)
        found.extend((number, target) for target in LINK.findall(line))
    return found


def broken(source: Path, target: str) -> str | None:
    """Why `target`, linked from `source`, leads nowhere; None when it leads somewhere."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):
        return None
    file_part, _, anchor = target.partition("#")
    dest = source if not file_part else (source.parent / file_part).resolve()
    if not dest.exists():
        return f"no file {file_part}"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"no heading #{anchor} in {dest.name}"
    return None


def test_every_link_between_the_docs_leads_somewhere():
    problems = []
    for path in tracked():
        if path.suffix != ".md":
            continue
        for number, target in links(path):
            why = broken(path, target)
            if why:
                problems.append(f"{path.relative_to(REPO)}:{number}: ({target}): {why}")
    assert not problems, "\n".join(problems)


def test_every_docs_path_the_code_quotes_exists_with_its_heading():
    problems = []
    for path in tracked():
        if path.suffix not in QUOTING and path.name != "Dockerfile":
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for m in QUOTED_DOC.finditer(text):
            page = REPO / m.group(1)
            anchor = (m.group(2) or "#")[1:]
            if not page.exists():
                problems.append(f"{path.relative_to(REPO)}: {m.group(1)}: no such page")
            elif anchor and anchor not in anchors(page):
                problems.append(f"{path.relative_to(REPO)}: {m.group(1)}#{anchor}: no such heading")
    assert not problems, "\n".join(problems)


def test_the_readme_and_every_page_stay_readable():
    readme = (REPO / "README.md").stat().st_size
    assert readme < README_MAX, f"README.md is {readme} bytes, over {README_MAX}: move depth to docs/"
    big = [
        f"{p.relative_to(REPO)}: {p.stat().st_size} bytes"
        for p in sorted(tracked())
        if p.suffix == ".md" and p != REPO / "README.md" and p.stat().st_size >= PAGE_MAX
    ]
    assert not big, f"pages over {PAGE_MAX} bytes (split them by topic): {big}"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("The cap, the Lease and the kill switch", "the-cap-the-lease-and-the-kill-switch"),
        ("Rook/Ceph's taint pair and the power cycle", "rookcephs-taint-pair-and-the-power-cycle"),
        ("The container image (Cloud Run)", "the-container-image-cloud-run"),
        ("Active fencing: `ForceOff`", "active-fencing-forceoff"),
    ],
)
def test_anchors_are_spelt_as_github_spells_them(heading, anchor):
    assert slug(heading) == anchor


def test_a_broken_link_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A part\n\n[ok](#a-part) [bad](#nowhere) [gone](missing.md)\n")
    found = {target: broken(page, target) for _, target in links(page)}
    assert found["#a-part"] is None
    assert "no heading" in found["#nowhere"]
    assert "no file" in found["missing.md"]
