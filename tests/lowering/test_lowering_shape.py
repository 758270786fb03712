import pytest
import torch
import torch.nn.functional as F

from tests.reference import check, check_grad
from torchneuron.eager import fallback

pytestmark = pytest.mark.usefixtures("no_fallback")
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.bool]


def make(dtype, *shape):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape).bool()
    if not dtype.is_floating_point:
        return torch.randint(-50, 50, shape).to(dtype)
    return torch.randn(shape).to(dtype)


def layouts(x):
    """x contiguous, transposed (non-contiguous, same values) and sliced with a step."""
    return [x, x.t().contiguous().t(), torch.cat([x, x], 0)[::2]]


# ------------------------------------------------------------------ what common code reaches
def test_common_calls_reach_only_lowerings_or_views():
    x = torch.randn(3, 4).to("neuron")
    fallback.decomposed.clear()
    torch.cat([x, x]), torch.stack([x, x], 1), x.repeat(2, 1), x.tile(2), F.pad(x, (1, 2))
    x.flip(0), torch.roll(x, 1, 0), torch.roll(x, 1), torch.tril(x), torch.triu(x, 1)
    x.to(torch.float64), x.double(), x.to(torch.bfloat16), x.T.contiguous(), x.T.reshape(-1)
    torch.diag_embed(x), torch.split(x, [1, 2]), torch.hstack([x, x]), torch.rot90(x)
    assert not fallback.decomposed, fallback.decomposed


# ------------------------------------------------------------------ cat / stack
@pytest.mark.parametrize("dtype", DTYPES)
def test_cat_dtypes_and_layouts(dtype):
    a, b, c = layouts(make(dtype, 3, 4))
    check(lambda x, y, z: torch.cat([x, y, z]), a, b, c)
    check(lambda x, y, z: torch.cat([x, y, z], dim=-1), a, b, c)
    check(lambda x, y: torch.stack([x, y], 1), a, c)


def test_cat_promotes_types():
    f, i, b = make(torch.float32, 2, 3), make(torch.int64, 2, 3), make(torch.bool, 2, 3)
    check(lambda x, y: torch.cat([x, y]), f, i)
    check(lambda x, y: torch.cat([x, y], 1), b, i)
    check(lambda x, y: torch.cat([x, y]), make(torch.bfloat16, 1, 3), make(torch.float16, 2, 3))
    check(lambda x, y: torch.cat([x, y]), make(torch.int8, 1, 3), make(torch.uint8, 2, 3))
    check(lambda x, y: torch.stack([x, y]), i, f.double())


def test_cat_empty_tensors():
    x = make(torch.float32, 2, 3)
    check(lambda a, e: torch.cat([a, e, a]), x, torch.empty(0))  # legacy 1-D empty: skipped
    check(lambda a, e: torch.cat([e, a], 1), x, torch.empty(2, 0))
    check(lambda a, e: torch.cat([a, e]), x, torch.empty(0, dtype=torch.float64))  # still promotes
    check(lambda e: torch.cat([e, e]), torch.empty(0, 3))


def test_cat_out_and_grad():
    x, y = make(torch.float32, 2, 3), make(torch.float32, 1, 3)

    def into_out(a, b):
        out = torch.empty(0, device=a.device)
        torch.cat([a, b], out=out)
        strided = torch.empty(3, 3, device=a.device).t()  # a non-contiguous out keeps its strides
        torch.cat([a, b], out=strided)
        return out, strided

    check(into_out, x, y)
    check_grad(lambda a, b: torch.cat([a, b]), x, y)
    check_grad(lambda a, b: torch.stack([a, b[0].expand(2, 3)], 2), x, y)


# ------------------------------------------------------------------ copies and dtype conversions
@pytest.mark.parametrize("dtype", DTYPES)
def test_dtype_conversions(dtype):
    for x in layouts(make(torch.float32, 3, 4) * 40):
        check(lambda t: t.to(dtype), x)
    for x in layouts(make(dtype, 3, 4)):
        check(lambda t: (t.to(torch.float64), t.double(), t.to(torch.bfloat16), t.int(), t.bool()), x)


def test_clone_and_contiguous():
    x = make(torch.float32, 3, 4)
    check(lambda t: t.T.contiguous(), x)
    check(lambda t: t.T.clone(), x)  # preserve_format keeps the transposed strides
    check(lambda t: t.T.clone().stride(), x)
    check(lambda t: t.T.clone(memory_format=torch.contiguous_format).stride(), x)
    check(lambda t: t[::2, 1:].reshape(-1), x)
    check(lambda t: t.T.flatten(), x)
    check(lambda t: t[:, :1].expand(3, 4).clone(), x)
    img = make(torch.float32, 2, 3, 4, 5)
    check(lambda t: t.contiguous(memory_format=torch.channels_last), img)
    check(lambda t: t.contiguous(memory_format=torch.channels_last).stride(), img)
    check_grad(lambda t: t.T.contiguous(), x)


# ------------------------------------------------------------------ padding
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_constant_pad(dtype):
    for x in layouts(make(dtype, 3, 4)):
        check(lambda t: F.pad(t, (1, 2)), x)
        check(lambda t: F.pad(t, (1, 0, 0, 2), value=1), x)
        check(lambda t: F.pad(t, (-1, 2, 1, -2)), x)  # negative pads crop
        check(lambda t: F.pad(t[None], (0, 0, 0, 0, 2, 1)), x)


def test_constant_pad_grad():
    check_grad(lambda t: F.pad(t, (1, -1, 2, 0), value=3.5), make(torch.float32, 3, 4))


# ------------------------------------------------------------------ flip / roll / repeat
@pytest.mark.parametrize("dtype", DTYPES)
def test_flip_roll_repeat(dtype):
    for x in layouts(make(dtype, 3, 4)):
        check(lambda t: t.flip(0), x)
        check(lambda t: t.flip((0, -1)), x)
        check(lambda t: torch.fliplr(t), x)
        check(lambda t: torch.rot90(t, 1), x)
        check(lambda t: torch.roll(t, 1, 0), x)
        check(lambda t: torch.roll(t, (-2, 5), (1, 0)), x)
        check(lambda t: torch.roll(t, 5), x)  # no dims: the flattened tensor rolls
        check(lambda t: t.repeat(2, 3), x)
        check(lambda t: t.repeat(2, 1, 2), x)  # more repeats than dims
        check(lambda t: t.tile(2), x)


def test_flip_roll_repeat_edges():
    s = torch.tensor(1.5)
    check(lambda t: (t.flip(0), torch.roll(t, 1), t.repeat(2), t.repeat(())), s)
    e = torch.empty(0, 3)
    check(lambda t: (t.flip(0), torch.roll(t, 1, 1), t.repeat(2, 2)), e)
    check(lambda t: t.flip(()), make(torch.float32, 2, 3))


def test_flip_roll_repeat_grad():
    x = make(torch.float32, 3, 4)
    check_grad(lambda t: t.flip(1), x)
    check_grad(lambda t: torch.roll(t, 2, 1), x)
    check_grad(lambda t: t.repeat(2, 1), x)


# ------------------------------------------------------------------ triangles and diagonals
@pytest.mark.parametrize("dtype", DTYPES)
def test_tril_triu(dtype):
    for x in layouts(make(dtype, 4, 5)):
        for diagonal in (0, 2, -1, -7):
            check(lambda t, d: torch.tril(t, d), x, d=diagonal)
            check(lambda t, d: torch.triu(t, d), x, d=diagonal)
    check(lambda t: (t.tril(), t.triu(1)), make(dtype, 2, 3, 4))


def test_tril_inplace_out_grad():
    x = make(torch.float32, 4, 4)

    def variants(t):
        a = t.clone()
        a.tril_(1)
        b = t.clone().t()
        b.triu_()  # in place on a transposed view
        out = torch.empty(0, device=t.device)
        torch.tril(t, -1, out=out)
        return a, b, out

    check(variants, x)
    check_grad(lambda t: torch.triu(t, 1), x)


def test_diag_embed():
    x = make(torch.float32, 2, 3)
    for offset, dim1, dim2 in ((0, -2, -1), (1, 0, 2), (-2, 2, 0), (2, 1, 0)):
        check(lambda t, o, a, b: torch.diag_embed(t, o, a, b), x, o=offset, a=dim1, b=dim2)
    check(lambda t: torch.diag_embed(t), make(torch.int64, 3, 2).t())
    check(lambda t: (torch.diag(t), torch.diag(t, -1)), make(torch.bool, 4))
    check_grad(lambda t: torch.diag_embed(t, 1), x)


def test_unfold_backward_overlapping_windows():
    x = torch.randn(3, 10)
    check(lambda t: t.unfold(1, 4, 2), x, grad=True)  # windows overlap: gradients add
    check(lambda t: t.unfold(-1, 3, 3), x, grad=True)
    check(lambda t: t.unfold(0, 2, 1), x, grad=True)
