"""Optional pytest fixtures for ``fake_hub`` (import into a test module: ``from fake_hub_fixtures import fake_hub``)."""

from __future__ import annotations

import pytest

from fake_hub import FakeHub


@pytest.fixture
def fake_hub():
    """A running :class:`fake_hub.FakeHub`; fails at teardown if the client used a route the FakeHub lacks."""
    with FakeHub() as hub:
        yield hub
    assert hub.unhandled == [], f"FakeHub got requests it does not implement: {hub.unhandled}"
