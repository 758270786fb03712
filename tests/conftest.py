import pytest
import torch

import torchneuron  # registers the device before torch.testing is imported

torch.manual_seed(0)


@pytest.fixture
def no_fallback():
    """Any CPU fallback is an error inside the test, and none may be counted by it."""
    saved = torchneuron.config.FALLBACK
    torchneuron.config.FALLBACK = "error"
    before = torchneuron.fallback_stats()
    yield
    torchneuron.config.FALLBACK = saved
    assert torchneuron.fallback_stats() == before
