"""Autocast on neuron follows CUDA's op policy; GradScaler skips steps with infs like on CPU."""
import pytest
import torch
import torch.nn.functional as F

N = "neuron"


pytestmark = pytest.mark.usefixtures("no_fallback")



def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g), torch.randint(0, 8, (4,), generator=g)


# (name, fn(a, w, target, mm), expected dtype (None: the autocast dtype)). The CPU reference runs
# fn with `mm` doing the low-precision matmul by hand and every other op on float32 or as is,
# which is the policy spelled out with manual casts.
CASES = [
    ("mm", lambda a, w, t, mm: mm(a, w), None),
    ("linear", lambda a, w, t, mm: F.linear(a, w) if mm is None else mm(a, w.T), None),
    ("addmm", lambda a, w, t, mm: torch.addmm(w[0], a, w) if mm is None else w[0].to(mm.dt) + mm(a, w), None),
    ("bmm", lambda a, w, t, mm: torch.bmm(a[None], w[None]) if mm is None else mm(a, w)[None], None),
    ("sum", lambda a, w, t, mm: mm(a, w).float().sum() if mm else (a @ w).sum(), torch.float32),
    ("softmax", lambda a, w, t, mm: torch.softmax(_f(mm, a, w), -1), torch.float32),
    ("log_softmax", lambda a, w, t, mm: F.log_softmax(_f(mm, a, w), -1), torch.float32),
    ("layer_norm", lambda a, w, t, mm: F.layer_norm(_f(mm, a, w), (8,)), torch.float32),
    ("exp", lambda a, w, t, mm: torch.exp(_f(mm, a, w)), torch.float32),
    ("pow", lambda a, w, t, mm: torch.pow(_f(mm, a, w), 2), torch.float32),
    ("cross_entropy", lambda a, w, t, mm: F.cross_entropy(_f(mm, a, w), t), torch.float32),
    ("mse_loss", lambda a, w, t, mm: F.mse_loss(_f(mm, a, w), a), torch.float32),
    ("cat", lambda a, w, t, mm: torch.cat([_f(mm, a, w), a]), torch.float32),
    ("relu", lambda a, w, t, mm: torch.relu(a @ w) if mm is None else torch.relu(mm(a, w)), None),
]


def _f(mm, a, w):
    """The matmul's result as the next op sees it: low precision under autocast, float32 by hand."""
    return a @ w if mm is None else mm(a, w).float()


def _manual_mm(low):
    def mm(a, w):
        return a.to(low) @ w.to(low)
    mm.dt = low
    return mm


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name,fn,expected", CASES, ids=[c[0] for c in CASES])
def test_policy_matches_manual_casts_on_cpu(name, fn, expected, low):
    a, w, t = _inputs()
    ref = fn(a, w, t, _manual_mm(low))
    with torch.autocast(N, dtype=low):
        got = fn(a.to(N), w.to(N), t.to(N), None) if name not in ("mm",) else a.to(N) @ w.to(N)
    assert got.dtype == (expected or low)
    tol = 2e-2 if low == torch.bfloat16 else 2e-3
    torch.testing.assert_close(got.cpu().float(), ref.float(), rtol=tol, atol=tol)


def test_sdpa_runs_in_low_precision():
    a, _, _ = _inputs()
    q = a[None, None]
    ref = F.scaled_dot_product_attention(q.bfloat16(), q.bfloat16(), q.bfloat16())
    with torch.autocast(N, dtype=torch.bfloat16):
        got = F.scaled_dot_product_attention(q.to(N), q.to(N), q.to(N))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu().float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_float64_and_disabled():
    a = torch.randn(3, 3, dtype=torch.float64, device=N)
    with torch.autocast(N, dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.float64  # CUDA leaves float64 alone
        with torch.autocast(N, enabled=False):
            assert (a.float() @ a.float()).dtype == torch.float32


def test_backward_through_casts():
    a, w, _ = _inputs()
    grads = []
    for dev in ("cpu", N):
        x, y = a.to(dev).detach().requires_grad_(), w.to(dev).detach().requires_grad_()
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = torch.softmax(x @ y, -1).sum() + (x @ y).float().pow(2).mean()
        loss.backward()
        assert x.grad.dtype == torch.float32
        grads.append((x.grad.cpu(), y.grad.cpu()))
    for g_cpu, g_n in zip(*grads):
        torch.testing.assert_close(g_n, g_cpu, rtol=3e-2, atol=3e-2)


def _train(dev, poison_step):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(dev, init_scale=2.0 ** 10, growth_interval=2)
    history = []
    for step in range(4):
        x = torch.ones(2, 8, device=dev) * (step + 1)
        if step == poison_step:
            x = x * float("inf")
        before = model.weight.detach().cpu().clone()
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        history.append((scaler.get_scale(), torch.equal(before, model.weight.detach().cpu())))
    return history, model.weight.detach().cpu()


def test_grad_scaler_skips_inf_and_updates_scale_like_cpu():
    cpu, w_cpu = _train("cpu", poison_step=1)
    got, w = _train(N, poison_step=1)
    assert got[1][1]  # the step with infs left the weights alone
    assert [s for s, _ in got] == [s for s, _ in cpu]
    assert [skip for _, skip in got] == [skip for _, skip in cpu]
    torch.testing.assert_close(w, w_cpu, rtol=2e-2, atol=2e-2)
