"""The top-level ``model_cards/`` folder is the one home of the card template; a non-editable wheel
install (outside the source tree) still renders cards from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_template_and_shipped_cards_live_only_in_the_top_level_folder():
    assert (ROOT / "model_cards" / "draft_card.md").is_file()
    assert not list((ROOT / "hf_specmm").rglob("draft_card.md"))
    for card in (ROOT / "hf_specmm" / "world" / "checkpoints").glob("*/README.md"):
        assert card.is_symlink(), f"{card} should link to model_cards/world/"
        assert card.resolve() == (ROOT / "model_cards" / "world" / f"{card.parent.name}.md").resolve()


def test_wheel_install_renders_a_card(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)], check=True)
    (wheel,) = wheels.glob("hf_specmm-*.whl")
    subprocess.run(pip + ["install", "--no-deps", "--no-compile", "--target", str(site), str(wheel)], check=True)
    script = (
        "import hf_specmm, sys\n"
        "from hf_specmm import testing\n"
        "assert hf_specmm.__file__.startswith(sys.argv[1]), hf_specmm.__file__\n"
        "card = hf_specmm.render_model_card(testing.random_text_draft(testing.tiny_target('llava')))\n"
        "assert 'library_name: hf_specmm' in card and 'text-only' in card\n"
        "from hf_specmm.world.shipped import CHECKPOINTS\n"
        "assert 'hf_specmm' in (CHECKPOINTS / 'text-only-draft' / 'README.md').read_text()\n"
        "print('rendered', len(card))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", script, str(site)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rendered" in out.stdout
