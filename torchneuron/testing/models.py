"""Tiny models that exercise what real training needs: an MLP, a CNN and a GPT."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, inputs: int = 16, hidden: int = 32, classes: int = 4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self, channels: int = 3, classes: int = 10, dropout: float = 0.0):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.AvgPool2d(2),
        )
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(16 * 2 * 2, classes)

    def forward(self, x):
        x = self.features(x)
        return self.head(self.dropout(torch.flatten(x, 1)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * width, width))
        self.dropout = dropout

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class NormMLP(nn.Module):
    """A pre-norm residual MLP block (LayerNorm, up, GELU, down): the tensor- and sequence-parallel
    tests' model."""

    def __init__(self, width: int = 8, hidden: int = 16):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class GPT(nn.Module):
    """A small decoder-only transformer (token + position embeddings, pre-norm blocks, tied head)."""

    def __init__(self, vocab: int = 64, width: int = 32, heads: int = 4, layers: int = 2, context: int = 16,
                 dropout: float = 0.0):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=1 / math.sqrt(width))

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def batches(kind: str, steps: int, batch: int = 8, seed: int = 0):
    """Deterministic CPU batches (inputs, targets) for `kind` in mlp, cnn, gpt."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        if kind == "mlp":
            x = torch.randn(batch, 16, generator=g)
            yield x, (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:8].sum(1) > 0).long()
        elif kind == "cnn":
            yield torch.randn(batch, 3, 8, 8, generator=g), torch.randint(0, 10, (batch,), generator=g)
        else:
            seq = torch.randint(0, 64, (batch, 17), generator=g)
            yield seq[:, :-1], seq[:, 1:]


def loss_of(kind: str, model: nn.Module, inputs, targets):
    if kind == "gpt":
        return model(inputs, targets)
    return F.cross_entropy(model(inputs), targets)


MODELS = {"mlp": MLP, "cnn": CNN, "gpt": GPT}


OPTIMIZERS = {"sgd": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9),
              "adam": lambda params, lr: torch.optim.Adam(params, lr=lr),
              "adamw": lambda params, lr: torch.optim.AdamW(params, lr=lr)}


def train_step(kind: str, model: nn.Module, opt: torch.optim.Optimizer, inputs, targets) -> torch.Tensor:
    """One step: the loss, its gradients, the optimizer's update; returns the loss."""
    loss = loss_of(kind, model, inputs, targets)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def train(kind: str, device: str, steps: int, optimizer: str = "adamw", seed: int = 0, lr: float = 1e-2):
    """Train a fresh model (same initial weights for every device) and return its losses."""
    torch.manual_seed(seed)
    model = MODELS[kind]().to(device)
    opt = OPTIMIZERS[optimizer](model.parameters(), lr)
    losses = []
    for inputs, targets in batches(kind, steps):
        losses.append(train_step(kind, model, opt, inputs.to(device), targets.to(device)).item())
    return losses, model
