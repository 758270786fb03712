"""Activation checkpointing under torch.compile recomputes random ops in the backward through
PyTorch's RNG-replay operators: the recomputation must draw what the forward drew (compile/backend.py
in our executables, torchneuron/rng_replay.py op by op)."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _doubled_dropout(t):
    return F.dropout(t * 2, 0.5)


@pytest.mark.parametrize("backend", ["neuron", "aot_eager"])
def test_a_checkpointed_dropout_recomputes_the_forwards_mask(backend):
    """out = 2x * mask * 2 with x = 1, so d(sum out)/dx is out itself only if the backward's mask is
    the forward's."""
    torch.manual_seed(0)
    step = torch.compile(lambda x: checkpoint(_doubled_dropout, x, use_reentrant=False), backend=backend)
    x = torch.ones(4096, device="neuron", requires_grad=True)
    out = step(x)
    out.sum().backward()
    kept = (out != 0).float().mean().item()
    assert 0.4 < kept < 0.6  # a real draw
    torch.testing.assert_close(x.grad, out.detach(), rtol=0, atol=0)


class _AttentionBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2 if self.training else 0.0, is_causal=True)
        return attended.transpose(1, 2).reshape(2, 8, 16) + F.dropout(x, 0.1, self.training)


def test_full_activation_checkpointing_of_attention_with_dropout_compiles_and_trains():
    torch.manual_seed(0)
    block = _AttentionBlock().to("neuron")
    step = torch.compile(lambda x: checkpoint(block, x, use_reentrant=False), backend="neuron")
    x = torch.randn(2, 8, 16, device="neuron")
    step(x).square().sum().backward()
    grad = block.qkv.weight.grad.cpu()
    assert grad.isfinite().all() and grad.abs().sum() > 0
    # without dropout, the checkpointed compiled step equals the eager one
    block.eval()
    block.zero_grad()
    step(x).square().sum().backward()
    compiled = block.qkv.weight.grad.cpu()
    block.zero_grad()
    block(x).square().sum().backward()
    torch.testing.assert_close(compiled, block.qkv.weight.grad.cpu(), rtol=1e-4, atol=1e-5)
