"""The docs link to what exists: every relative link in a tracked Markdown file names a file or folder of the
tree, and its ``#anchor`` a heading of the file it names (GitHub's anchors: lower case, punctuation dropped,
spaces as hyphens)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    heads = (m.group(1) for m in (re.match(r"#+\s+(.*)", line) for line in path.read_text().splitlines()) if m)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_relative_link_and_anchor_resolves():
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    docs = [ROOT / name for name in listed.stdout.split()]
    assert len(docs) > 10
    broken, checked = [], 0
    for doc in docs:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            named = (doc.parent / path).resolve() if path else doc
            checked += 1
            if not named.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such path)")
            elif anchor and named.is_file() and anchor not in anchors(named):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert checked > 100 and broken == [], "\n".join(broken)
