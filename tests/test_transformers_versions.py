"""The version policy: transformers older than the tested window is refused at import; a newer one imports with
one warning naming the tested window, and ``enable()`` refuses where a private internal hf_specmm reads is missing
or changed (named, with the installed version and the tested window); pyproject has no upper bound."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from packaging.version import Version

import hf_specmm
from hf_specmm import _compat, testing, versions
from hf_specmm.errors import SpecMMError

ROOT = Path(__file__).resolve().parents[1]
NEWER = Version("5.31.0")


@pytest.fixture
def restore_probes(monkeypatch):
    """Whatever a simulated check finds, the real findings come back after the test."""
    monkeypatch.setattr(_compat, "MISSING_INTERNALS", list(_compat.MISSING_INTERNALS))


def _check(installed: Version) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compat.check_transformers_version(installed)
    return [w for w in caught if issubclass(w.category, versions.UntestedTransformersWarning)]


def test_every_internal_is_present_on_the_installed_version():
    assert _compat.probe_internals() == []
    assert _compat.MISSING_INTERNALS == []


def test_the_tested_window_takes_no_warning(restore_probes):
    assert _check(_compat.MIN_TRANSFORMERS) == []
    assert _check(Version(f"{_compat.NEWEST_TESTED}.3")) == []


def test_a_newer_version_with_every_internal_warns_once_and_enables(restore_probes, monkeypatch):
    # the internals the installed version has (those added later are absent on an older leg of the suite)
    present = tuple(i for i in _compat.INTERNALS if i.applies(versions.INSTALLED))
    monkeypatch.setattr(_compat, "INTERNALS", present)
    caught = _check(NEWER)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert _compat.TESTED_WINDOW in message and str(NEWER) in message and "present as expected" in message
    model = hf_specmm.enable(testing.tiny_target("llava"))
    assert hf_specmm.is_enabled(model)


def test_a_newer_version_without_an_internal_warns_and_enable_refuses(restore_probes, monkeypatch):
    from transformers.generation.utils import GenerationMixin

    monkeypatch.delattr(GenerationMixin, "_prefill")
    caught = _check(NEWER)
    assert len(caught) == 1 and "GenerationMixin._prefill is missing" in str(caught[0].message)
    model = testing.tiny_target("llava")
    with pytest.raises(hf_specmm.UnsupportedTransformersError) as err:
        hf_specmm.enable(model)
    message = str(err.value)
    assert "transformers.generation.utils.GenerationMixin._prefill is missing" in message
    assert str(_compat._INSTALLED) in message and _compat.TESTED_WINDOW in message
    assert isinstance(err.value, SpecMMError) and not hf_specmm.is_enabled(model)


def test_a_changed_signature_or_attribute_is_named(restore_probes, monkeypatch):
    from transformers import cache_utils

    def prefill(self, input_ids, generation_config, model_kwargs):  # is_first_iteration gone
        raise AssertionError("never called")

    monkeypatch.setattr(_compat.GenerationMixin, "_prefill", prefill)
    monkeypatch.setattr(cache_utils.StaticLayer, "__init__", lambda self, max_cache_len, **kw: None)
    problems = _compat.probe_internals(NEWER)
    assert "transformers.generation.utils.GenerationMixin._prefill takes no parameter is_first_iteration" in problems
    assert ("transformers.cache_utils.StaticLayer has no attribute max_cache_len, cumulative_length, is_initialized"
            in problems)


def test_an_internal_added_later_is_not_probed_before_it(monkeypatch):
    from transformers import cache_utils

    monkeypatch.delattr(cache_utils, "DummyLayer", raising=False)
    assert "transformers.cache_utils.DummyLayer is missing" in _compat.probe_internals(Version("5.24.0"))
    assert not any("DummyLayer" in p for p in _compat.probe_internals(Version("5.23.0")))


def test_an_older_version_is_refused_at_import(restore_probes):
    with pytest.raises(ImportError, match=re.escape("transformers 5.16.2 is installed")):
        _compat.check_transformers_version(Version("5.16.2"))


def test_a_real_import_on_a_newer_version_without_an_internal():
    """In a fresh interpreter: transformers reports a newer version and lacks an internal; ``import hf_specmm``
    works with one warning, ``enable()`` refuses naming the internal."""
    script = f"""
import warnings
warnings.simplefilter("always")
import transformers
from transformers import cache_utils
transformers.__version__ = "{NEWER}"
del cache_utils.LinearAttentionLayer
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import hf_specmm
ours = [str(w.message) for w in caught if "hf_specmm is tested with" in str(w.message)]
assert len(ours) == 1, ours
try:
    hf_specmm.enable(None)  # refused before the model is looked at
except hf_specmm.SpecMMError as err:
    print("REFUSED", err)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "REFUSED" in done.stdout and "transformers.cache_utils.LinearAttentionLayer is missing" in done.stdout
    assert f"transformers {NEWER}" in done.stdout


def test_pyproject_has_no_upper_bound_and_the_docs_name_the_window():
    (spec,) = re.findall(r'^\s*"(transformers[^"]*)"', (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert spec.replace(" ", "") == f"transformers>={_compat.MIN_TRANSFORMERS.major}.{_compat.MIN_TRANSFORMERS.minor}"
    window = f"{_compat.MIN_TRANSFORMERS.major}.{_compat.MIN_TRANSFORMERS.minor} to {_compat.NEWEST_TESTED}"
    assert window in (ROOT / "README.md").read_text().split("\n\n")[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"{_compat.MIN_TRANSFORMERS} {_compat.NEWEST_TESTED}.0" in ci
