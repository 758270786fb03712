"""Views alias their storage and in-place writes through any view are exact, as on CPU.

A property-based test builds random chains of view ops and in-place ops, runs the same chain on
CPU and on neuron, and compares every tensor (bases and views) and their aliasing after each step.
"""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def _view_ops(t, data):
    """A random view of t (the same choice is replayed on both devices)."""
    nd = t.dim()
    choices = ["t", "slice", "select", "narrow", "diagonal", "unfold", "as_strided", "flatten_or_view",
               "unsqueeze", "permute", "expand", "squeeze"]
    name = data.draw(st.sampled_from(choices))
    if nd == 0 or (name in ("t", "diagonal") and nd < 2):
        name = "unsqueeze"
    if name == "t":
        d0, d1 = data.draw(st.permutations(range(nd)))[:2]
        return name, (lambda x: x.transpose(d0, d1))
    if name == "slice":
        d = data.draw(st.integers(0, nd - 1))
        n = t.shape[d]
        start = data.draw(st.integers(0, max(n - 1, 0)))
        step = data.draw(st.integers(1, 3))
        return name, (lambda x: x.narrow(d, 0, n)[(slice(None),) * d + (slice(start, None, step),)])
    if name == "select" and t.shape[0] > 0:
        i = data.draw(st.integers(-t.shape[0], t.shape[0] - 1))
        return name, (lambda x: x.select(0, i))
    if name == "narrow":
        d = data.draw(st.integers(0, nd - 1))
        n = t.shape[d]
        start = data.draw(st.integers(0, n))
        length = data.draw(st.integers(0, n - start))
        return name, (lambda x: x.narrow(d, start, length))
    if name == "diagonal":
        off = data.draw(st.integers(-2, 2))
        return name, (lambda x: x.diagonal(off, 0, 1))
    if name == "unfold":
        d = data.draw(st.integers(0, nd - 1))
        n = t.shape[d]
        if n == 0:
            return "noop", (lambda x: x)
        size = data.draw(st.integers(1, n))
        step = data.draw(st.integers(1, 3))
        return name, (lambda x: x.unfold(d, size, step))
    if name == "as_strided":
        base_numel = t.untyped_storage().nbytes() // t.element_size()
        shape = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
        stride = tuple(data.draw(st.lists(st.integers(0, 4), min_size=len(shape), max_size=len(shape))))
        span = sum((s - 1) * st_ for s, st_ in zip(shape, stride))
        if span >= base_numel:
            return "noop", (lambda x: x)
        offset = data.draw(st.integers(0, base_numel - 1 - span))
        return name, (lambda x: x.as_strided(shape, stride, offset))
    if name == "flatten_or_view":
        return name, (lambda x: x.reshape(-1) if not x.is_contiguous() else x.view(-1))
    if name == "permute":
        perm = data.draw(st.permutations(range(nd)))
        return name, (lambda x: x.permute(*perm))
    if name == "expand":
        return name, (lambda x: x.unsqueeze(0).expand(2, *x.shape))
    if name == "squeeze":
        return name, (lambda x: x.squeeze())
    d = data.draw(st.integers(0, nd))
    return "unsqueeze", (lambda x: x.unsqueeze(d))


def _inplace_ops(t, data):
    name = data.draw(st.sampled_from(["add_", "mul_", "copy_", "neg_", "sub_tensor", "copy_broadcast"]))
    value = data.draw(st.integers(-3, 3))
    src = torch.randn(t.shape)
    row = torch.randn(t.shape[-1:]) if t.dim() else torch.randn(())
    ops = {
        "add_": lambda x: x.add_(value),
        "mul_": lambda x: x.mul_(value),
        "copy_": lambda x: x.copy_(src.to(x.device)),
        "neg_": lambda x: x.neg_(),
        "sub_tensor": lambda x: x.sub_(src.to(x.device), alpha=2),
        "copy_broadcast": lambda x: x.copy_(row.to(x.device)),
    }
    return name, ops[name]


def _outcome(fn, x):
    try:
        return fn(x), None
    except RuntimeError as e:
        return None, str(e).split("\n")[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), shape=st.lists(st.integers(1, 5), min_size=1, max_size=3))
def test_random_view_and_inplace_chains_match_cpu(data, shape):
    base_cpu = torch.randn(shape)
    base_dev = base_cpu.to("neuron")
    live = [(base_cpu, base_dev)]
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(live) - 1))
        cpu, dev = live[i]
        if data.draw(st.booleans()):
            _, fn = _view_ops(cpu, data)
            (vc, ec), (vd, ed) = _outcome(fn, cpu), _outcome(fn, dev)
            assert ec == ed
            if vc is not None:
                assert vd.shape == vc.shape and vd.stride() == vc.stride()
                assert vd.storage_offset() == vc.storage_offset()
                aliases_cpu = vc.untyped_storage().data_ptr() == base_cpu.untyped_storage().data_ptr()
                aliases_dev = vd.untyped_storage().data_ptr() == base_dev.untyped_storage().data_ptr()
                assert aliases_dev == aliases_cpu
                live.append((vc, vd))
        else:
            _, fn = _inplace_ops(cpu, data)
            if torch._debug_has_internal_overlap(cpu) == 2:
                # elements sharing memory in ways PyTorch cannot tell (unfold): it writes them without
                # an error, and the result depends on its kernel's loop order, which is no reference
                continue
            (_, ec), (_, ed) = _outcome(fn, cpu), _outcome(fn, dev)
            assert (ec is None) == (ed is None), (ec, ed)
        for c, d in live:
            torch.testing.assert_close(d.cpu(), c, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make_view", [
    lambda x: x[::2, 1::3],
    lambda x: x.t(),
    lambda x: x.diagonal(),
    lambda x: x.unfold(1, 2, 2),
    lambda x: x.as_strided((2, 2), (5, 1), 3),
    lambda x: x.view(-1)[3:11].view(2, 4),
    lambda x: x.t()[1:, ::2].transpose(0, 1),
])
def test_inplace_through_views_writes_the_base(make_view):
    cpu = torch.arange(36.0).reshape(6, 6)
    dev = cpu.to("neuron")
    for x in (cpu, dev):
        v = make_view(x)
        v.mul_(-1).add_(0.5)
    torch.testing.assert_close(dev.cpu(), cpu)


def test_overlapping_inplace_reads_before_writing():
    cpu = torch.arange(10.0)
    dev = cpu.to("neuron")
    for x in (cpu, dev):
        x.add_(x)
        x[::2].add_(x[1::2])  # strided, interleaved: allowed, every input read before writing
        x.t_() if x.dim() == 2 else None
    torch.testing.assert_close(dev.cpu(), cpu)


def test_partial_overlap_raises_like_cpu():
    for device in ("cpu", "neuron"):
        x = torch.arange(10.0, device=device)
        with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to"):
            x[2:].add_(x[:-2])


@pytest.mark.parametrize("write, read", [
    (lambda x: x[:1], lambda x: x[0]),                          # a 0-dim view of the written element
    (lambda x: x[:1], lambda x: x[:1].view(())),
    (lambda x: x[:3].view(1, 3), lambda x: x.as_strided((1, 3), (7, 1))),  # another size-1 stride
    (lambda x: x[:3].view(1, 3), lambda x: x[:3].view(1, 3)),  # the same strides: full, allowed
    (lambda x: x[:4].view(2, 2), lambda x: x[:4].view(2, 2).t().t()),
])
def test_same_bytes_with_other_strides_overlap_partially_like_cpu(write, read):
    # ATen calls two views of the same bytes a full overlap (in place, allowed) only when their
    # strides are equal too
    outcomes = []
    for device in ("cpu", "neuron"):
        x = torch.arange(10.0, device=device)
        try:
            write(x).add_(read(x))
            outcomes.append(x.cpu())
        except RuntimeError as e:
            outcomes.append(str(e).split("\n")[0])
    if isinstance(outcomes[0], str):
        assert outcomes[1] == outcomes[0]
    else:
        torch.testing.assert_close(outcomes[1], outcomes[0])


def test_inplace_on_expanded_tensor_raises_like_cpu():
    for device in ("cpu", "neuron"):
        x = torch.zeros(3, device=device).unsqueeze(0).expand(4, 3)
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            x.add_(1)


def test_view_dtype_bitcasts():
    cpu = torch.tensor([1.0, -2.0, 3.5])
    dev = cpu.to("neuron")
    torch.testing.assert_close(dev.view(torch.int32).cpu(), cpu.view(torch.int32))
    dev.view(torch.int32).add_(1)
    cpu.view(torch.int32).add_(1)
    torch.testing.assert_close(dev.cpu(), cpu)


def test_math_bit_views_read_and_write_their_meaning():
    """conj/neg-bit views reach copy_, clone and mm as they are: the driver applies the bits."""
    x = torch.randn(3, 3, dtype=torch.complex64)
    d = x.to("neuron")
    torch.testing.assert_close(d.conj().cpu(), x.conj())
    torch.testing.assert_close(torch.resolve_conj(d.conj()).cpu(), x.conj())
    torch.testing.assert_close((d.conj() @ d).cpu(), x.conj() @ x)
    torch.testing.assert_close(torch.vdot(d[0], d[1]).cpu(), torch.vdot(x[0], x[1]))
    assert d.conj()[0, 0].item() == x.conj()[0, 0].item()
    y = torch.randn(4)
    torch.testing.assert_close(y.to("neuron")._neg_view().cpu(), -y)
    dst = torch.zeros(3, dtype=torch.complex64).to("neuron")
    dst.conj().copy_(d[0])  # stores conj(x[0]) physically
    torch.testing.assert_close(dst.cpu(), x[0].conj())
