"""Sparse COO tensors on neuron against CPU: construction, conversion, structure, arithmetic,
products, reductions, softmax, autograd, sparse gradients and the optimizers that step on them.
Every comparison checks the layout, nnz, the coalesced flag, the stored indices and values."""
from __future__ import annotations

import pytest
import torch

import torchneuron

pytestmark = pytest.mark.usefixtures("no_fallback")


def to_neuron(x):
    return x.to("neuron") if isinstance(x, torch.Tensor) else x


def assert_same(cpu, dev, rtol=1e-5, atol=1e-6):
    assert isinstance(dev, torch.Tensor) and dev.device.type == "neuron", dev
    assert dev.layout == cpu.layout and dev.is_sparse == cpu.is_sparse
    assert dev.shape == cpu.shape and dev.dtype == cpu.dtype, (dev.shape, cpu.shape, dev.dtype, cpu.dtype)
    if cpu.is_sparse:
        assert (dev.sparse_dim(), dev.dense_dim()) == (cpu.sparse_dim(), cpu.dense_dim())
        assert dev._nnz() == cpu._nnz() and dev.is_coalesced() == cpu.is_coalesced()
        torch.testing.assert_close(dev._indices().cpu(), cpu._indices())
        torch.testing.assert_close(dev._values().cpu(), cpu._values(), rtol=rtol, atol=atol)
    else:
        torch.testing.assert_close(dev.cpu(), cpu, rtol=rtol, atol=atol)


def check(fn, *args, rtol=1e-5, atol=1e-6):
    expected = fn(*args)
    actual = fn(*(to_neuron(a) for a in args))
    for c, d in zip(expected if isinstance(expected, tuple) else (expected,),
                    actual if isinstance(actual, tuple) else (actual,)):
        assert_same(c, d, rtol, atol)
    return actual


def coo(shape=(5, 6), nnz=8, dense=(), dtype=torch.float32, seed=0, coalesced=False):
    """A COO tensor with duplicate entries (uncoalesced) unless `coalesced`."""
    g = torch.Generator().manual_seed(seed)
    indices = torch.stack([torch.randint(0, s, (nnz,), generator=g) for s in shape])
    values = torch.randn(nnz, *dense, generator=g).to(dtype)
    x = torch.sparse_coo_tensor(indices, values, (*shape, *dense), check_invariants=True)
    return x.coalesce() if coalesced else x


# ---------------------------------------------------------------- construction and structure

def test_construct_and_move_both_ways():
    x = coo()
    n = x.to("neuron")
    assert n.is_sparse and n.layout == torch.sparse_coo and n.device.type == "neuron"
    assert_same(x, n)
    assert n._indices().device.type == "neuron" and n._values().device.type == "neuron"
    back = n.cpu()
    assert back.is_sparse and back.device.type == "cpu"
    assert back._nnz() == x._nnz() and back._indices().equal(x._indices()) and back._values().equal(x._values())


@pytest.mark.parametrize("check_invariants", [True, False])
def test_construct_on_neuron_from_neuron_parts(check_invariants):
    i, v = torch.tensor([[0, 1, 1], [2, 0, 2]]), torch.tensor([3.0, 4.0, 5.0])
    check(lambda i, v: torch.sparse_coo_tensor(i, v, (2, 3), check_invariants=check_invariants), i, v)
    check(lambda i, v: torch.sparse_coo_tensor(i, v), i, v)  # size inferred
    check(lambda i, v: torch.sparse_coo_tensor(i, v, (2, 3), is_coalesced=True), i, v)
    n = torch.sparse_coo_tensor(i, v, (2, 3), device="neuron")
    assert n.device.type == "neuron" and n.is_sparse


def test_structure_queries():
    x = coo(dense=(2,))
    n = x.to("neuron")
    assert (n.sparse_dim(), n.dense_dim(), n._nnz(), n.is_coalesced()) == (2, 1, 8, False)
    assert_same(x._indices(), n._indices())
    assert_same(x._values(), n._values())
    c, cn = x.coalesce(), n.coalesce()
    assert_same(c.indices(), cn.indices())
    assert_same(c.values(), cn.values())
    with pytest.raises(RuntimeError, match="coalesced"):
        n.indices()


def test_zeros_and_empty_with_sparse_layout():
    z = torch.zeros(3, 4, layout=torch.sparse_coo, device="neuron")
    assert z.is_sparse and z._nnz() == 0 and z.device.type == "neuron"
    e = torch.empty(3, 4, layout=torch.sparse_coo, device="neuron")
    assert e.is_sparse and e._nnz() == 0
    assert_same(torch.zeros(3, 4, layout=torch.sparse_coo), z)


@pytest.mark.parametrize("dense", [(), (3,)])
def test_coalesce(dense):
    check(lambda x: x.coalesce(), coo(dense=dense))
    check(lambda x: x.coalesce(), coo(shape=(4, 3, 2), nnz=12, dense=dense, seed=1))
    check(lambda x: x.coalesce(), coo(nnz=1))


def test_to_dense_and_to_sparse():
    check(lambda x: x.to_dense(), coo(dense=(2,)))
    d = torch.randn(4, 5)
    d[d < 0.3] = 0
    check(lambda d: d.to_sparse(), d)
    check(lambda d: d.to_sparse(1), torch.randn(4, 3))
    check(lambda x: x.to_sparse(), coo())  # already sparse


def test_resize_and_clear():
    def fn(x):
        x = x.clone()
        x.sparse_resize_((7, 6), 2, 0)
        y = x.clone()
        y.sparse_resize_and_clear_((2, 2, 2), 2, 1)
        return x, y
    check(fn, coo())


def test_clone_copy_and_zero():
    def fn(x, y):
        a = x.clone()
        y.copy_(x)
        b = x.clone().zero_()
        return a, y, b
    check(fn, coo(), coo(seed=3))


# ---------------------------------------------------------------- arithmetic

def _add_cases(a, b):
    def inplace(a, b):
        a = a.clone()
        a.add_(b)
        return a
    return [(lambda a, b: a + b), (lambda a, b: a - b), (lambda a, b: torch.add(a, b, alpha=2.5)), inplace]


def test_add_sub_coalesced():
    """Both coalesced: CPU merges them into a coalesced result, and so does neuron."""
    a, b = coo(coalesced=True), coo(seed=1, coalesced=True)
    for fn in _add_cases(a, b):
        check(fn, a, b)


def test_add_sub_uncoalesced():
    """Either uncoalesced: an uncoalesced result holding the same sum. CPU merges the two entry lists
    pairwise; neuron concatenates them, as CUDA does, so the stored entries differ and the coalesced
    tensors agree."""
    a, b = coo(), coo(seed=1, coalesced=True)
    for fn in _add_cases(a, b):
        expected, actual = fn(a, b), fn(a.to("neuron"), b.to("neuron"))
        assert not actual.is_coalesced() and not expected.is_coalesced()
        assert_same(expected.coalesce(), actual.coalesce())


def test_add_dense_sparse():
    a, d = coo(dense=(2,)), torch.randn(5, 6, 2)
    check(lambda d, a: d + a, d, a)
    check(lambda d, a: d - a, d, a)
    check(lambda d, a: torch.add(d, a, alpha=-0.5), d, a)

    def inplace(d, a):
        d = d.clone()
        d.add_(a, alpha=3)
        return d
    check(inplace, d, a)
    with pytest.raises(RuntimeError, match="add\\(sparse, dense\\) is not supported"):
        coo().to("neuron") + torch.randn(5, 6, device="neuron")


def test_mul():
    a, b = coo(), coo(seed=2, nnz=20)
    check(lambda a: a * 2.5, a)
    check(lambda a: 3 * a, a)
    check(lambda a: a * torch.tensor(1.5), a)
    check(lambda a: a / 4, a)
    check(lambda a, b: a * b, a.coalesce(), b.coalesce())  # both coalesced: the shared entries, as CPU
    # an uncoalesced operand: CPU keeps zero products on some entries, neuron only the shared ones
    expected, actual = a * b, a.to("neuron") * b.to("neuron")
    assert_same(expected.coalesce().to_dense().to_sparse(), actual.coalesce().to_dense().to_sparse())


@pytest.mark.parametrize("name", ["neg", "abs", "sin", "tanh", "sqrt", "expm1", "log1p", "sign", "trunc",
                                  "floor", "ceil", "round", "relu", "isnan", "signbit", "square", "erf", "frac",
                                  "isinf", "deg2rad", "sgn", "asinh"])
def test_elementwise(name):
    x = coo() if name not in ("sqrt", "log1p") else coo().abs()
    check(lambda x: getattr(x, name)(), x)


def test_shape_ops():
    x = coo(dense=(2,))
    check(lambda x: x.permute(1, 0, 2), x)
    check(lambda x: x.unsqueeze(1), x)
    check(lambda x: x.narrow_copy(1, 1, 3), x)
    check(lambda x, y: torch.cat([x, y], 0), x, coo(seed=6, dense=(2,)))
    check(lambda x: x.any(), x)


def test_sparse_mask():
    mask = coo(coalesced=True)
    check(lambda d, m: d.sparse_mask(m), torch.randn(5, 6), mask)
    check(lambda x, m: x.sparse_mask(m), coo(seed=7, nnz=15), mask)


def test_pow_and_nan_to_num():
    check(lambda x: x.pow(2), coo())
    x = coo()
    check(lambda x: x.nan_to_num(), x)


# ---------------------------------------------------------------- reductions

def test_sum():
    x = coo(shape=(4, 5), nnz=10, dense=(3,))
    check(lambda x: x.sum(), x)
    check(lambda x: torch.sparse.sum(x), x)
    for dims in ([0], [1], [2], [0, 1], [1, 2]):
        check(lambda x, dims=dims: torch.sparse.sum(x, dims), x)
    check(lambda x: x.sum(1), x)


# ---------------------------------------------------------------- products

def test_sparse_mm_addmm_matmul():
    a, d = coo(shape=(5, 6), nnz=12), torch.randn(6, 4)
    check(lambda a, d: torch.sparse.mm(a, d), a, d)
    check(lambda a, d: torch.mm(a, d), a, d)
    check(lambda a, d: a @ d, a, d)
    check(lambda a, d: torch.matmul(a, d), a, d)
    check(lambda c, a, d: torch.addmm(c, a, d, beta=0.5, alpha=2.0), torch.randn(5, 4), a, d)
    check(lambda c, a, d: torch.sparse.addmm(c, a, d), torch.randn(5, 4), a, d)
    check(lambda a, v: a @ v, a, torch.randn(6))
    check(lambda d, a: d @ a, torch.randn(3, 5), a)


def test_bmm():
    x = torch.stack([coo(nnz=10).to_dense(), coo(seed=1, nnz=10).to_dense()]).to_sparse()
    check(lambda x, d: torch.bmm(x, d), x, torch.randn(2, 6, 3))
    grads(lambda x, d: torch.bmm(x, d), x, torch.randn(2, 6, 3))


def test_sspaddmm():
    check(lambda s, m, d: torch.sspaddmm(s, m, d, beta=2, alpha=0.5), coo(shape=(5, 4)), coo(shape=(5, 6), seed=2),
          torch.randn(6, 4))


def test_hspmm():
    check(lambda m, d: torch.hspmm(m, d), coo(shape=(5, 6), seed=2), torch.randn(6, 4))


def test_sparse_times_sparse():
    a, b = coo(shape=(5, 6), nnz=12), coo(shape=(6, 4), nnz=10, seed=4)
    check(lambda a, b: torch.sparse.mm(a, b), a, b)
    check(lambda a, b: a @ b, a, b)


def test_index_select():
    x = coo(dense=(2,))
    index = torch.tensor([4, 0, 4, 2])
    check(lambda x, i: x.index_select(0, i), x, index)
    check(lambda x, i: x.index_select(1, i), x, index)
    check(lambda x, i: x.index_select(2, i), x, torch.tensor([1, 1, 0]))


@pytest.mark.parametrize("log", [False, True])
def test_softmax(log):
    f = torch.sparse.log_softmax if log else torch.sparse.softmax
    x = coo(shape=(4, 6), nnz=12, dense=(2,))
    for dim in (0, 1, 2):
        check(lambda x, dim=dim: f(x, dim), x)


# ---------------------------------------------------------------- autograd

def grads(fn, *args):
    """fn's output's squares summed, backward from CPU and neuron leaves; the leaves' grads compared."""
    results = []
    for device in ("cpu", "neuron"):
        leaves = [a.detach().to(device).requires_grad_(a.is_floating_point()) for a in args]
        out = fn(*leaves)
        (out.to_dense() if out.is_sparse else out).pow(2).sum().backward()
        results.append([leaf.grad for leaf in leaves if leaf.requires_grad])
    for c, d in zip(*results):  # (sparse gradients compared coalesced: entry order is the kernels' own)
        assert_same(c.coalesce() if c.is_sparse else c, d.coalesce() if d.is_sparse else d, rtol=1e-4, atol=1e-5)


def test_autograd_through_sparse_ops():
    a, d = coo(coalesced=True), torch.randn(6, 3)
    i, v = a._indices(), a._values()
    grads(lambda v: torch.sparse_coo_tensor(i.to(v.device), v, (5, 6)).to_dense(), v)
    grads(lambda a, d: torch.sparse.mm(a, d), a, d)
    grads(lambda a, d: torch.sparse.addmm(torch.zeros(5, 3, device=d.device), a, d), a, d)
    grads(lambda a: (a * 2).to_dense(), a)
    grads(lambda a, b: (a + b).to_dense(), a, coo(seed=5, coalesced=True))
    grads(lambda a: torch.sparse.sum(a, 1), a)
    grads(lambda a: torch.sparse.softmax(a, 1).to_dense(), a)
    grads(lambda a: torch.sparse.log_softmax(a, 0).to_dense(), a)
    grads(lambda x: x.to_sparse().to_dense() * 3, torch.randn(4, 5))


def test_autograd_through_more_sparse_ops():
    a, d = coo(coalesced=True, dense=(2,)), torch.randn(5, 6, 2)
    grads(lambda a, d: (a * d).to_dense(), a, d)
    grads(lambda a: (-a.abs()).permute(1, 0, 2).to_dense(), a)
    grads(lambda a: torch.sparse.sum(a), a)
    grads(lambda a: torch.sparse.sum(a, [0, 1]), a)
    grads(lambda a: torch.sparse.sum(a, [2]).to_dense(), a)
    grads(lambda a, b: (a - b).to_dense(), a, coo(seed=3, dense=(2,), coalesced=True))
    grads(lambda a, b: (a * b).to_dense(), a, coo(seed=3, dense=(2,), nnz=25, coalesced=True))
    grads(lambda d: d.sparse_mask(a.to(d.device)).to_dense(), d)


# ---------------------------------------------------------------- sparse gradients and optimizers

def test_embedding_sparse_grad():
    weight = torch.randn(10, 4)
    index = torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]])
    out = []
    for device in ("cpu", "neuron"):
        emb = torch.nn.Embedding(10, 4, sparse=True, padding_idx=3).to(device)
        with torch.no_grad():
            emb.weight.copy_(weight)
        emb(index.to(device)).pow(2).sum().backward()
        out.append(emb.weight.grad)
    assert out[1].is_sparse
    assert_same(out[0], out[1])


@pytest.mark.parametrize("mode", ["sum", "mean"])  # (max refuses sparse=True, on CPU too)
def test_embedding_bag_sparse_grad(mode):
    weight = torch.randn(10, 4)
    index, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 5])
    out = []
    for device in ("cpu", "neuron"):
        bag = torch.nn.EmbeddingBag(10, 4, mode=mode, sparse=True).to(device)
        with torch.no_grad():
            bag.weight.copy_(weight)
        bag(index.to(device), offsets.to(device)).pow(2).sum().backward()
        out.append(bag.weight.grad)
    assert_same(out[0], out[1])


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1),
    lambda p: torch.optim.Adagrad(p, lr=0.1),
    lambda p: torch.optim.SparseAdam(p, lr=0.01),
], ids=["SGD", "Adagrad", "SparseAdam"])
def test_optimizers_step_on_sparse_grads(make):
    weight = torch.randn(12, 4)
    batches = [torch.randint(0, 12, (6,), generator=torch.Generator().manual_seed(s)) for s in range(3)]
    finals = []
    for device in ("cpu", "neuron"):
        emb = torch.nn.Embedding(12, 4, sparse=True).to(device)
        with torch.no_grad():
            emb.weight.copy_(weight)
        opt = make(emb.parameters())
        for index in batches:
            opt.zero_grad()
            emb(index.to(device)).pow(2).sum().backward()
            opt.step()
        finals.append(emb.weight.detach())
    assert_same(finals[0], finals[1])


class BagOfEmbeddings(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(50, 8, mode="mean", sparse=True)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, index, offsets):
        return self.head(self.bag(index, offsets))


def test_bag_of_embeddings_classifier_trains_as_on_cpu():
    torch.manual_seed(0)
    reference = BagOfEmbeddings()
    g = torch.Generator().manual_seed(1)
    index, offsets = torch.randint(0, 50, (24,), generator=g), torch.tensor([0, 5, 9, 15, 20])
    data = [(index, offsets, torch.randint(0, 3, (5,), generator=g))] * 10
    losses = []
    for device in ("cpu", "neuron"):
        model = BagOfEmbeddings()
        model.load_state_dict(reference.state_dict())
        model.to(device)
        sparse_opt = torch.optim.SparseAdam(list(model.bag.parameters()), lr=0.05)
        dense_opt = torch.optim.Adam(model.head.parameters(), lr=0.05)
        run = []
        for index, offsets, target in data:
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(index.to(device), offsets.to(device)), target.to(device))
            loss.backward()
            sparse_opt.step()
            dense_opt.step()
            run.append(loss.item())
        losses.append((run, model.bag.weight.detach().cpu(), model.head.weight.detach().cpu()))
    (cpu_run, cpu_bag, cpu_head), (dev_run, dev_bag, dev_head) = losses
    torch.testing.assert_close(torch.tensor(dev_run), torch.tensor(cpu_run), rtol=1e-5, atol=1e-6)
    assert dev_run[-1] < dev_run[0]
    torch.testing.assert_close(dev_bag, cpu_bag, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dev_head, cpu_head, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- what neuron refuses

def test_compressed_layouts_are_refused_by_name():
    d = torch.randn(3, 4, device="neuron")
    for convert, layout in [(lambda: d.to_sparse_csr(), "torch.sparse_csr"),
                            (lambda: d.to_sparse_csc(), "torch.sparse_csc"),
                            (lambda: d.to_sparse_bsr((1, 2)), "torch.sparse_bsr"),
                            (lambda: d.to_sparse(layout=torch.sparse_csr), "torch.sparse_csr")]:
        with pytest.raises(NotImplementedError, match=f"is not supported on neuron.*{layout}"):
            convert()
    csr = torch.randn(3, 4).to_sparse_csr().to("neuron")
    with pytest.raises(NotImplementedError, match="is not supported on neuron for layout torch.sparse_csr"):
        csr.to_dense()
    with pytest.raises(NotImplementedError, match="is not supported on neuron for layout torch.sparse_csr"):
        csr @ torch.randn(4, 2, device="neuron")
    with pytest.raises(NotImplementedError, match="aten::_to_sparse_csr is not supported on neuron for layout "
                                                  "torch.sparse_coo"):
        coo().to("neuron").to_sparse_csr()


def test_uncovered_coo_op_names_op_and_layout():
    with pytest.raises(NotImplementedError, match="aten::_sparse_broadcast_to is not supported on neuron for layout "
                                                  "torch.sparse_coo"):
        torch.ops.aten._sparse_broadcast_to(coo().to("neuron"), [2, 5, 6])
    assert torchneuron.fallback_stats() == torchneuron.fallback_stats()
