import os
import tempfile

# Inductor's cache is shared by every process on the machine under the system temp folder: a file left
# truncated by a process stopped mid-write failed a later run. This run's is its own.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="torchinductor-tests-"))

import pytest
import torch

import torchneuron  # registers the device before torch.testing is imported

torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    """Tests marked `slow` (multi-process runs, full sweeps) run with TORCHNEURON_SLOW_TESTS=1, as CI does."""
    if os.environ.get("TORCHNEURON_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow: TORCHNEURON_SLOW_TESTS=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def no_fallback():
    """Any CPU fallback is an error inside the test, and none may be counted by it."""
    saved = torchneuron.config.FALLBACK
    torchneuron.config.FALLBACK = "error"
    before = torchneuron.fallback_stats()
    yield
    torchneuron.config.FALLBACK = saved
    assert torchneuron.fallback_stats() == before


@pytest.fixture
def lowered_only(no_fallback):
    """Stricter than no_fallback: every op runs as its own lowering, neither on CPU nor through
    a decomposition (the lowering tests' rule)."""
    from torchneuron.eager import fallback
    before = dict(fallback.decomposed)
    yield
    assert dict(fallback.decomposed) == before


@pytest.fixture
def fresh_dynamo():
    """Compile tests start and end with Dynamo's caches empty."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def fresh_accelerate_state():
    """accelerate keeps its device in a process-wide singleton: each test chooses it afresh."""
    import accelerate
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    yield
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
