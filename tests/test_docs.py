"""The README is a front page (at most 300 lines, the CI's test command verbatim) and every relative link of
the README and docs/ points to a file that exists and, with an anchor, to a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # '# comments' in code blocks are no headings
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_readme_is_a_front_page_with_the_ci_test_command():
    readme = (ROOT / "README.md").read_text().splitlines()
    assert len(readme) <= 300, len(readme)
    assert "    bash scripts/test.sh" in readme and "    bash scripts/demo.sh" in readme  # .ci/run reads the first


def test_relative_links_resolve():
    assert _slug("Pass the tokenizer (SmolVLM / Idefics3, InternVL)") == "pass-the-tokenizer-smolvlm--idefics3-internvl"
    checked = 0
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name}: {target}"
            if anchor:
                assert anchor in _anchors(linked), f"{page.name}: {target} (no such heading)"
            checked += 1
    assert checked >= 20


def test_generated_world_table_lives_between_its_markers_in_docs():
    from hf_specmm.world.tau_table import README_END, README_START, check_readme

    text = check_readme(ROOT / "docs" / "world.md")  # what `world-tau --update-readme` checks before measuring
    assert text.index(README_START) < text.index(README_END)
