"""Package layout only (metadata lives in pyproject.toml): the top-level ``model_cards/`` folder, the one
home of the draft card templates, is installed as ``hf_specmm.model_cards`` so an installed wheel renders
cards too."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["hf_specmm", "hf_specmm.*"]) + ["hf_specmm.model_cards"],
    package_dir={"hf_specmm.model_cards": "model_cards"},
    package_data={"hf_specmm": ["world/checkpoints/*.json", "world/checkpoints/*/*"],
                  "hf_specmm.model_cards": ["*.md"]},
)
