"""Shared synthetic clusters for the learn tests (generated once per session, in memory)."""

from __future__ import annotations

import pytest

from unbroken.learn.synth import SynthSpec, generate


@pytest.fixture(scope="session")
def small():
    """12 nodes x 2 days, 3 failures: fast enough for the pure tests."""
    return generate(SynthSpec(seed=7, nodes=12, days=2.0, failures=3, before=1))
