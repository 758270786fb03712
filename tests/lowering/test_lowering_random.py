import pytest
import torch

D = "neuron"
N = 100_000


pytestmark = pytest.mark.usefixtures("no_fallback")


SAMPLERS = {
    "rand": lambda: torch.rand(5, 3, device=D),
    "randn": lambda: torch.randn(5, 3, device=D),
    "randint": lambda: torch.randint(0, 10, (5, 3), device=D),
    "randperm": lambda: torch.randperm(20, device=D),
    "uniform_": lambda: torch.empty(5, device=D).uniform_(-2, 3),
    "normal_": lambda: torch.empty(5, device=D).normal_(1, 2),
    "normal_tensor": lambda: torch.normal(torch.zeros(5, device=D), torch.ones(5, device=D)),
    "bernoulli": lambda: torch.bernoulli(torch.full((50,), 0.5, device=D)),
    "bernoulli_p": lambda: torch.empty(50, device=D).bernoulli_(0.5),
    "random_": lambda: torch.empty(5, device=D).random_(0, 100),
    "exponential_": lambda: torch.empty(5, device=D).exponential_(),
    "multinomial": lambda: torch.multinomial(torch.ones(3, 10, device=D), 4),
    "rand_like": lambda: torch.rand_like(torch.zeros(4, device=D)),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_seeded_reproducible_and_fresh(name):
    torch.manual_seed(123)
    a, b = SAMPLERS[name]().cpu(), SAMPLERS[name]().cpu()
    torch.manual_seed(123)
    assert torch.equal(SAMPLERS[name]().cpu(), a)
    assert torch.equal(SAMPLERS[name]().cpu(), b)
    assert not torch.equal(a, b)


def test_generator_argument():
    g = torch.Generator(device=D)
    g.manual_seed(7)
    a = torch.rand(6, device=D, generator=g).cpu()
    g.manual_seed(7)
    assert torch.equal(torch.rand(6, device=D, generator=g).cpu(), a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_shapes_and_dtypes_match_cpu(dtype):
    for make in (lambda d: torch.rand(2, 3, dtype=dtype, device=d), lambda d: torch.randn(4, dtype=dtype, device=d),
                 lambda d: torch.empty(3, 1, dtype=dtype, device=d).uniform_(),
                 lambda d: torch.empty((), dtype=dtype, device=d).normal_(),
                 lambda d: torch.empty(0, 2, dtype=dtype, device=d).normal_(),
                 lambda d: torch.bernoulli(torch.full((3,), 0.5, dtype=dtype, device=d)),
                 lambda d: torch.randint(0, 3, (2, 2), dtype=torch.int32, device=d),
                 lambda d: torch.randperm(5, dtype=torch.int32, device=d)):
        c, n = make("cpu"), make(D)
        assert (c.shape, c.dtype) == (n.shape, n.dtype)


def test_noncontiguous_inplace():
    x = torch.zeros(6, 4, device=D)
    x.t()[::2].uniform_(1, 2)
    y = x.cpu()
    assert ((y[:, ::2] >= 1) & (y[:, ::2] < 2)).all() and (y[:, 1::2] == 0).all()


def _moments(t):
    t = t.double().cpu()
    return t.mean().item(), t.std().item()


def test_uniform_distribution():
    mean, std = _moments(torch.empty(N, device=D).uniform_(-1, 3))
    assert abs(mean - 1) < 0.02 and abs(std - 4 / 12 ** 0.5) < 0.02
    x = torch.rand(N, device=D).cpu()
    assert x.min() >= 0 and x.max() < 1


@pytest.mark.parametrize("make", [
    lambda: torch.randn(N, device=D) * 2 + 1,
    lambda: torch.empty(N, device=D).normal_(1, 2),
    lambda: torch.normal(torch.ones(N, device=D), 2.0),
    lambda: torch.normal(1.0, torch.full((N,), 2.0, device=D)),
    lambda: torch.normal(torch.ones(N, device=D), torch.full((N,), 2.0, device=D)),
    lambda: torch.normal(1.0, 2.0, (N,), device=D),
])
def test_normal_distribution(make):
    mean, std = _moments(make())
    assert abs(mean - 1) < 0.03 and abs(std - 2) < 0.03


def test_bernoulli_rates():
    assert abs(torch.bernoulli(torch.full((N,), 0.3, device=D)).cpu().mean().item() - 0.3) < 0.01
    assert abs(torch.empty(N, device=D).bernoulli_(0.7).cpu().mean().item() - 0.7) < 0.01
    p = torch.full((N,), 0.2, device=D)
    assert abs(torch.empty(N, device=D).bernoulli_(p).cpu().mean().item() - 0.2) < 0.01
    assert abs(torch.bernoulli(torch.zeros(N, device=D), 0.4).cpu().mean().item() - 0.4) < 0.01
    edges = torch.bernoulli(torch.tensor([0.0, 1.0] * 50, device=D)).cpu()
    assert torch.equal(edges, torch.tensor([0.0, 1.0] * 50))


def test_random_ranges():
    x = torch.empty(N, device=D).random_(3, 8).cpu()
    assert x.min() == 3 and x.max() == 7 and torch.equal(x, x.round())
    x = torch.empty(N, dtype=torch.int64, device=D).random_(5).cpu()
    assert x.min() == 0 and x.max() == 4
    x = torch.randint(-4, 4, (N,), device=D).cpu()
    assert x.min() == -4 and x.max() == 3 and x.dtype == torch.int64
    x = torch.empty(N, dtype=torch.uint8, device=D).random_().cpu()
    assert x.min() == 0 and x.max() == 255
    x = torch.empty(N, dtype=torch.bool, device=D).random_().cpu()
    assert 0.45 < x.float().mean() < 0.55
    x = torch.empty(N, dtype=torch.float32, device=D).random_().cpu()
    assert x.min() >= 0 and x.max() <= 2 ** 24 and x.max() > 2 ** 23


def test_other_distributions():
    mean, _ = _moments(torch.empty(N, device=D).exponential_(2.0))
    assert abs(mean - 0.5) < 0.01
    x = torch.empty(N, device=D).geometric_(0.25).cpu()
    assert x.min() >= 1 and abs(x.mean() - 4) < 0.1
    x = torch.empty(N, device=D).log_normal_(0.0, 0.5).cpu()
    assert abs(x.log().mean()) < 0.01 and abs(x.log().std() - 0.5) < 0.01
    x = torch.empty(N, device=D).cauchy_(1.0, 2.0).cpu()
    assert abs(x.median() - 1) < 0.05


def test_randperm_is_permutation():
    for n in (0, 1, 7, 1000):
        p = torch.randperm(n, device=D).cpu()
        assert torch.equal(p.sort().values, torch.arange(n))


def test_multinomial():
    probs = torch.tensor([0.0, 1.0, 3.0, 0.0, 4.0], device=D)
    draws = torch.multinomial(probs, 3).cpu()
    assert sorted(draws.tolist()) == [1, 2, 4]
    counts = torch.bincount(torch.multinomial(probs, N, replacement=True).cpu(), minlength=5)
    assert counts[0] == 0 and counts[3] == 0 and abs(counts[4] / N - 0.5) < 0.01
    rows = torch.multinomial(torch.ones(4, 6, device=D), 6).cpu()
    assert rows.shape == (4, 6) and all(sorted(r.tolist()) == list(range(6)) for r in rows)
