"""Seeding, generators and RNG state on neuron; checkpointing replays dropout exactly."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

N = "neuron"


pytestmark = pytest.mark.usefixtures("no_fallback")



def _draw():
    x = torch.ones(64, device=N)
    return torch.rand(8, device=N).cpu(), torch.randn(8, device=N).cpu(), F.dropout(x, 0.5).cpu()


@pytest.mark.parametrize("seed", [torch.manual_seed, torch.neuron.manual_seed])
def test_manual_seed_reproduces(seed):
    seed(123)
    first = _draw()
    seed(123)
    for a, b in zip(first, _draw()):
        assert torch.equal(a, b)
    seed(124)
    assert not torch.equal(first[0], _draw()[0])


def test_generator_on_device():
    g = torch.Generator(device=N).manual_seed(7)
    a = torch.rand(8, device=N, generator=g).cpu()
    torch.rand(8, device=N)  # the default generator does not disturb g
    g.manual_seed(7)
    assert torch.equal(a, torch.rand(8, device=N, generator=g).cpu())


def test_rng_state_restores():
    torch.neuron.manual_seed(5)
    state = torch.neuron.get_rng_state()
    a = _draw()
    torch.neuron.set_rng_state(state)
    for x, y in zip(a, _draw()):
        assert torch.equal(x, y)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.b(F.dropout(torch.tanh(self.a(x)), 0.3, training=True))


def test_checkpoint_replays_dropout():
    torch.manual_seed(0)
    block = _Block().to(N)
    x = torch.randn(4, 8, device=N)
    grads = []
    for ckpt in (False, True):
        torch.neuron.manual_seed(11)
        block.zero_grad()
        y = checkpoint(block, x, use_reentrant=False, preserve_rng_state=True) if ckpt else block(x)
        y.square().sum().backward()
        grads.append([p.grad.cpu() for p in block.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
