import warnings

import pytest
import torch

from tests.reference import check, check_grad

pytestmark = [pytest.mark.filterwarnings("ignore:var\\(\\)"), pytest.mark.usefixtures("no_fallback")]

NAN = float("nan")
INF = float("inf")


def make(dtype, *shape, layout="contiguous"):
    """Random values of `dtype`; 'transposed' and 'strided' give non-contiguous views."""
    if layout == "transposed":
        return make(dtype, *reversed(shape)).transpose(0, -1)
    if layout == "strided":
        return make(dtype, shape[0] * 2, *shape[1:])[::2]
    if dtype == torch.bool:
        return torch.randint(0, 2, shape).bool()
    if not dtype.is_floating_point:
        return torch.randint(-5, 6, shape).to(dtype)
    return torch.randn(shape).to(dtype)


def tol(dtype):
    return {"rtol": 2e-2, "atol": 2e-2} if dtype in (torch.bfloat16, torch.float16) else {}


LAYOUTS = ["contiguous", "transposed", "strided"]
FLOATS = [torch.float32, torch.float64, torch.bfloat16]
ALL = FLOATS + [torch.int64, torch.int32, torch.bool]
DIMS = [None, 0, -1, (0, 2), ()]


def _kw(dim, keepdim):
    return {} if dim is None else {"dim": dim, "keepdim": keepdim}


# ------------------------------------------------------------------ sums and products
@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_sum_dtypes_and_layouts(dtype, layout):
    x = make(dtype, 3, 4, 2, layout=layout)
    check(lambda t: t.sum(), x, **tol(dtype))
    check(lambda t: t.sum((0, -1)), x, **tol(dtype))
    check(lambda t: t.sum(1, keepdim=True), x, **tol(dtype))


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_mean_dims(dim, keepdim):
    x = make(torch.float32, 2, 3, 4)
    check(lambda t: t.sum(**_kw(dim, keepdim)), x)
    check(lambda t: t.mean(**_kw(dim, keepdim)), x)
    if dim != ():  # nansum's meta kernel reads dim=() as "no dims" while CPU reduces all
        check(lambda t: t.nansum(**_kw(dim, keepdim)), x)


def test_sum_dtype_argument():
    i = make(torch.int32, 3, 4)
    check(lambda t: t.sum(dtype=torch.float64), i)
    check(lambda t: t.sum(0, dtype=torch.int16), i)
    check(lambda t: t.mean(dtype=torch.float32), i)
    check(lambda t: t.prod(1, dtype=torch.float64), i)
    check(lambda t: t.sum(dtype=torch.float32), make(torch.bfloat16, 64))


def test_mean_and_prod():
    for dtype in FLOATS:
        x = make(dtype, 3, 4, layout="transposed")
        check(lambda t: t.mean(), x, **tol(dtype))
        check(lambda t: t.mean(0), x, **tol(dtype))
    for dtype in ALL:
        x = make(dtype, 3, 4)
        check(lambda t: t.prod(), x, **tol(dtype))
        check(lambda t: t.prod(-1, keepdim=True), x, **tol(dtype))


def test_nansum_ignores_nan():
    check(lambda t: t.nansum(0), torch.tensor([[1.0, NAN], [NAN, NAN], [2.0, 3.0]]))


def test_empty_and_zero_dim():
    e = torch.empty(0, 3)
    for fn in (lambda t: t.sum(0), lambda t: t.mean(0), lambda t: t.prod(0), lambda t: t.sum(),
               lambda t: t.logsumexp(0), lambda t: t.var(0), lambda t: t.any(0), lambda t: t.all(0),
               lambda t: torch.count_nonzero(t, 0), lambda t: t.norm(dim=0), lambda t: t.cumsum(0),
               lambda t: t.amax(1), lambda t: t.max(1), lambda t: t.sort(0), lambda t: t.cummax(0)):
        check(fn, e)
    s = torch.tensor(2.5)
    for fn in (lambda t: t.sum(), lambda t: t.sum(0), lambda t: t.mean(-1), lambda t: t.amax(0),
               lambda t: t.max(0), lambda t: t.argmax(), lambda t: t.argmin(0, keepdim=True),
               lambda t: t.var(0), lambda t: t.std(correction=0), lambda t: t.logsumexp(0),
               lambda t: t.cumsum(0), lambda t: t.cumprod(0), lambda t: t.cummin(0), lambda t: t.sort(0),
               lambda t: t.topk(1), lambda t: t.aminmax(dim=0), lambda t: t.any(0), lambda t: t.norm(1),
               lambda t: torch.count_nonzero(t, 0)):
        check(fn, s)


def test_bool_and_int_promotion():
    b = make(torch.bool, 4, 5)
    check(lambda t: t.sum(), b)
    check(lambda t: t.sum(1), b)
    check(lambda t: t.prod(0), b)
    check(lambda t: t.cumsum(1), b)
    check(lambda t: t.cumprod(0), b)
    check(lambda t: t.cumsum(0), make(torch.int8, 4, 5))


# ------------------------------------------------------------------ extrema
@pytest.mark.parametrize("dtype", ALL)
def test_amax_amin_max_min(dtype):
    x = make(dtype, 3, 4, 2, layout="strided")
    for dim in ((), 0, (0, 2)):
        check(lambda t, d: t.amax(d), x, d=dim)
        check(lambda t, d: t.amin(d, keepdim=True), x, d=dim)
    check(lambda t: t.max(), x)
    check(lambda t: t.min(), x)
    check(lambda t: torch.aminmax(t), x)
    check(lambda t: torch.aminmax(t, dim=1, keepdim=True), x)


def test_nan_propagates():
    x = torch.tensor([[1.0, NAN, 3.0], [2.0, -INF, NAN], [0.5, 0.25, 0.0]])
    for fn in (lambda t: t.amax(1), lambda t: t.amin(0), lambda t: t.max(), lambda t: t.min(),
               lambda t: t.max(1), lambda t: t.min(0), lambda t: t.argmax(1), lambda t: t.argmin(1),
               lambda t: t.argmax(), lambda t: t.argmin(), lambda t: torch.aminmax(t, dim=0)):
        check(fn, x)


def test_ties_return_first_index():
    x = torch.tensor([[1, 3, 3, 0, 0], [2, 2, 2, 2, 2]])
    for fn in (lambda t: t.max(1), lambda t: t.min(1), lambda t: t.argmax(1), lambda t: t.argmin(1),
               lambda t: t.argmax(), lambda t: t.max(0, keepdim=True)):
        check(fn, x)
        check(fn, x.float())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_max_min_dim_argmax(layout):
    x = make(torch.float32, 3, 4, 5, layout=layout)
    for dim in (0, 1, -1):
        check(lambda t, d: t.max(d), x, d=dim)
        check(lambda t, d: t.min(d, keepdim=True), x, d=dim)
        check(lambda t, d: t.argmax(d), x, d=dim)
        check(lambda t, d: t.argmin(d, keepdim=True), x, d=dim)
    check(lambda t: t.argmax(keepdim=True), x)


def test_max_min_grad():
    x = torch.randn(3, 4)
    check_grad(lambda t: t.amax(1), x)
    check_grad(lambda t: t.max(1).values, x)


# ------------------------------------------------------------------ moments
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [None, (0, 2)])
def test_var_std(dtype, dim):
    x = make(dtype, 3, 4, 2, layout="transposed")
    for correction in (None, 0, 0.5):
        kw = {} if correction is None else {"correction": correction}
        check(lambda t, kw: torch.var(t, dim, **kw), x, kw=kw, **tol(dtype))
        check(lambda t, kw: torch.std(t, dim, keepdim=True, **kw), x, kw=kw, **tol(dtype))
        check(lambda t, kw: torch.var_mean(t, dim, **kw), x, kw=kw, **tol(dtype))
        check(lambda t, kw: torch.std_mean(t, dim, keepdim=True, **kw), x, kw=kw, **tol(dtype))


def test_var_dims():
    x = make(torch.float32, 3, 4, 2)
    for dim in (0, -1, ()):
        check(lambda t, d: torch.var_mean(t, d, correction=2), x, d=dim)
        check(lambda t, d: torch.std(t, d, keepdim=True), x, d=dim)


def test_var_degenerate():
    check(lambda t: t.var(0), torch.randn(1, 3))  # n - correction == 0
    check(lambda t: t.var(0, correction=5), torch.randn(2, 3))  # clamped at 0


def test_var_grad():
    check_grad(lambda t: t.var(1), torch.randn(3, 4, dtype=torch.float64))


def test_logsumexp():
    for dtype in FLOATS:
        x = make(dtype, 3, 4, layout="strided") * 10
        check(lambda t: t.logsumexp(1), x, **tol(dtype))
        check(lambda t: t.logsumexp((0, 1), keepdim=True), x, **tol(dtype))
    check(lambda t: t.logsumexp(1), make(torch.int64, 3, 4))
    special = torch.tensor([[-INF, -INF], [INF, 1.0], [NAN, 1.0], [-INF, 2.0]])
    check(lambda t: t.logsumexp(1), special)


# ------------------------------------------------------------------ logical
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64, torch.uint8])
def test_any_all(dtype):
    x = make(torch.bool, 3, 4, 5) if dtype == torch.bool else (make(torch.int64, 3, 4, 5) % 2).to(dtype)
    for fn in (lambda t: t.any(), lambda t: t.all(), lambda t: t.any(1), lambda t: t.all(-1, keepdim=True),
               lambda t: t.any((0, 2)), lambda t: t.all(()), lambda t: torch.any(t, dim=()),
               lambda t: t.all((0, 1))):
        check(fn, x)
        check(fn, x.transpose(0, 2))


def test_any_all_nan_is_true():
    check(lambda t: (t.all(), t.any(0)), torch.tensor([[NAN, 0.0], [1.0, 0.0]]))


def test_count_nonzero():
    x = make(torch.int64, 3, 4, 5) % 2
    check(lambda t: torch.count_nonzero(t), x)
    check(lambda t: torch.count_nonzero(t, 1), x)
    check(lambda t: torch.count_nonzero(t, (0, 2)), x.float())
    check(lambda t: torch.ops.aten.count_nonzero.dim_IntList(t, []), x)


# ------------------------------------------------------------------ norms
@pytest.mark.parametrize("ord", [2, 1, INF, -INF, 0, 3, 0.5, -1])
def test_vector_norm(ord):
    x = make(torch.float32, 3, 4, layout="transposed")
    x[0, 0] = 0
    check(lambda t: torch.linalg.vector_norm(t, ord), x)
    check(lambda t: torch.linalg.vector_norm(t, ord, dim=1, keepdim=True), x)
    check(lambda t: torch.ops.aten.norm.ScalarOpt_dim(t, ord, [0]), x)


def test_norm_variants():
    x = make(torch.float32, 3, 4)
    check(lambda t: t.norm(), x)
    check(lambda t: torch.ops.aten.norm.Scalar(t, 3), x)
    check(lambda t: torch.ops.aten.norm.ScalarOpt_dim(t, None, [1]), x)
    check(lambda t: torch.linalg.vector_norm(t, dtype=torch.float64), x)
    check(lambda t: torch.linalg.norm(t), make(torch.bfloat16, 8), **tol(torch.bfloat16))
    check_grad(lambda t: t.norm(dim=1), x)


# ------------------------------------------------------------------ scans
@pytest.mark.parametrize("dtype", ALL)
def test_cumsum_cumprod(dtype):
    x = make(dtype, 3, 4, layout="transposed")
    check(lambda t: t.cumsum(0), x, **tol(dtype))
    check(lambda t: t.cumsum(-1), x, **tol(dtype))
    check(lambda t: t.cumprod(1), x, **tol(dtype))
    check(lambda t: t.cumsum(0, dtype=torch.float64), x)


def test_cumsum_grad():
    check_grad(lambda t: t.cumsum(1), torch.randn(3, 4))


def test_cummax_cummin():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 5.0, 5.0], [NAN, 1.0, NAN, 0.0, -INF, 2.0]])
    check(lambda t: t.cummax(1), x)
    check(lambda t: t.cummin(1), x)
    check(lambda t: t.cummax(0), x)
    for dtype in (torch.int64, torch.bool, torch.float64):
        y = make(dtype, 4, 6, layout="strided")
        check(lambda t: t.cummax(1), y)
        check(lambda t: t.cummin(0), y)


def test_logcumsumexp():
    check(lambda t: t.logcumsumexp(1), torch.randn(3, 5) * 10)
    check(lambda t: t.logcumsumexp(0), torch.tensor([-INF, -INF, 1.0, INF]))


def test_logcumsumexp_backward_after_a_large_value(lowered_only):
    # CPU scans float32 in double; its backward exponentiates differences of outputs near 1e4, so
    # a float32 scan's last-ulp differences showed as 3e-3 relative errors in the gradient
    t = torch.randn(5, 5, 5) * 5
    t[0] = 10000
    check(lambda t: t.logcumsumexp(0), t, grad=True, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ sorting
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable_with_ties(dtype, descending):
    x = (make(torch.int64, 4, 9) % 3).to(dtype)
    check(lambda t: t.sort(stable=True, descending=descending), x)
    check(lambda t: t.sort(dim=0, stable=True, descending=descending), x.t())
    check(lambda t: t.argsort(stable=True, descending=descending), x)


def test_sort_special_values():
    x = torch.tensor([0.0, NAN, -0.0, -INF, 1.0, INF, -NAN, 0.0, -0.0, NAN])
    check(lambda t: t.sort(stable=True), x)
    check(lambda t: t.sort(stable=True, descending=True), x)


def test_sort_unique_values_and_grad():
    x = torch.randperm(20).float().reshape(4, 5)
    check(lambda t: t.sort(), x)
    check(lambda t: t.sort(0, descending=True), x)
    check(lambda t: torch.msort(t), x)
    check_grad(lambda t: t.sort(1).values, torch.randn(3, 5))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [0, -1])
def test_topk(largest, dim):
    x = torch.randperm(30).reshape(5, 6).float()
    check(lambda t: t.topk(3, dim, largest=largest), x)
    check(lambda t: t.topk(2, dim, largest=largest), x.t())
    check(lambda t: t.topk(2, dim, largest=largest), x.long())
    # sorted=False leaves the order unspecified: compare the sorted values only
    check(lambda t: t.topk(3, dim, largest=largest, sorted=False).values.sort(dim).values, x)


def test_topk_nan_and_grad():
    check(lambda t: t.topk(2), torch.tensor([1.0, NAN, 3.0, 2.0]))
    check_grad(lambda t: t.topk(2).values, torch.randn(3, 5))


# ------------------------------------------------------------------ out= and in-place variants
def test_out_variants():
    x = make(torch.float32, 3, 4)

    def sums(t):
        out = torch.empty(0, device=t.device)
        torch.sum(t, 1, out=out)
        values = torch.empty(0, device=t.device)
        indices = torch.empty(0, dtype=torch.long, device=t.device)
        torch.max(t, 0, out=(values, indices))
        cum = torch.empty(3, 4, device=t.device).t()  # non-contiguous out keeps its strides
        torch.cumsum(t.t(), 0, out=cum)
        s = torch.empty(0, device=t.device), torch.empty(0, dtype=torch.long, device=t.device)
        torch.sort(t, 1, out=s)
        return out, values, indices, cum, s

    check(sums, x)


def test_inplace_cumsum():
    check(lambda t: t.clone().cumsum_(1), make(torch.float32, 3, 4))


def test_sum_mean_prod_logsumexp_grad():
    x = torch.randn(3, 4, dtype=torch.float64)
    check_grad(lambda t: (t.sum(0), t.mean(1), t.prod(1), t.logsumexp(1), t.std(0)), x)


def test_unsigned_bool_complex_and_empty_k():
    u = torch.tensor([3, 1, 255, 0, 1], dtype=torch.uint8)
    check(lambda t: (t.sort(stable=True, descending=True), t.topk(2), t.cumsum(0), t.sum(), t.max(0)), u)
    check(lambda t: (t.max(1), t.min(0), t.amax(0)), torch.tensor([[False, True, True], [False, False, False]]))
    check(lambda t: t.topk(0), torch.randn(4, 5))  # an empty result with strides (1, 1)
    check(lambda t: (t.max(0), t.min(0), t.amax()), torch.tensor([0.0, -0.0, -0.0]))
    check(lambda t: (t.sum(0), t.mean(1), t.var(0), t.cumsum(1), t.norm()), torch.randn(3, 4, dtype=torch.complex64))


@pytest.mark.parametrize("args", [(), (10,), (7, -1.0, 1.0), (5, 2.0, 2.0)])
def test_histc_matches_cpu(args):
    check(lambda x: torch.histc(x, *args), torch.rand(64) * 4 + 1)


def test_histc_counts_integers_like_cuda():
    x = torch.randint(0, 8, (50,), dtype=torch.int32)
    out = torch.histc(x.to("neuron"), bins=8, min=0, max=7)
    assert out.dtype == torch.int32
    torch.testing.assert_close(out.cpu(), torch.bincount(x, minlength=8).to(torch.int32))


@pytest.mark.usefixtures("lowered_only")
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_bincount(dtype):
    x = torch.tensor([1, 3, 3, 0, 7], dtype=dtype)
    check(torch.bincount, x)
    check(lambda x: torch.bincount(x, minlength=10), x)
    # float32 weights keep their dtype, all others count in float64
    for w in (torch.rand(5), torch.rand(5, dtype=torch.float64), torch.rand(5).half(), torch.arange(5)):
        check(torch.bincount, x, w)
    check(lambda x: torch.bincount(x, minlength=3), x[:0])


@pytest.mark.usefixtures("lowered_only")
def test_complex_logsumexp_logcumsumexp_branch_like_cpu():
    # CPU shifts by the max real part and accumulates in order, which fixes the imaginary part's
    # branch (a shift by the complex max, or a tree of partial sums, lands 2*pi away)
    x = torch.randn(3, 40, dtype=torch.complex64, generator=torch.Generator().manual_seed(0)) * 3
    for dim in (0, -1):
        check(lambda x, d=dim: torch.logsumexp(x, d), x, rtol=1e-5, atol=1e-5)
        check(lambda x, d=dim: torch.logcumsumexp(x, d), x, rtol=1e-4, atol=1e-4)
    special = torch.tensor([complex(-float("inf"), 2), 1 + 1j, complex(float("nan"), 0), 3j])
    check(lambda x: torch.logcumsumexp(x, 0), special)
    check(lambda x: torch.logcumsumexp(x, 0), torch.zeros(0, 3, dtype=torch.complex64))


def test_trace_renorm_and_inplace_polygamma():
    m = torch.randn(4, 5)
    check(torch.trace, m, grad=True)
    check(torch.trace, torch.arange(12).reshape(3, 4))
    for p, dim in [(2, 0), (1, 1), (float("inf"), 0)]:
        check(lambda t, p=p, dim=dim: torch.renorm(t, p, dim, 0.5), m, atol=1e-6, rtol=1e-5)
    check(lambda t: t.clone().polygamma_(2), torch.rand(6) + 0.5)


@pytest.mark.parametrize("kwargs", [{"bins": 2}, {"bins": 3, "range": (0.0, 4.0)}, {"bins": 7},
                                    {"bins": 5, "range": (-1.0, 1.0), "density": True}])
def test_histogram_bin_count(kwargs):
    torch.manual_seed(0)
    for x in (torch.ones(3), torch.tensor([[1.0, 2.0], [3.0, 9.0]]), torch.randn(100)):
        check(lambda t: torch.histogram(t, **kwargs), x)


def test_histogram_edges_weights_and_out():
    x, edges, w = torch.tensor([1.0, 2.0, 3.0, 4.0, -1.0]), torch.tensor([0.0, 1.5, 3.0, 4.0]), torch.rand(5)
    check(lambda t, e, w: torch.histogram(t, bins=e, weight=w, density=True), x, edges, w)

    def with_out(t):
        hist, bin_edges = torch.empty(0, device=t.device), torch.empty(0, device=t.device)
        torch.histogram(t, bins=3, out=(hist, bin_edges))
        return hist, bin_edges
    check(with_out, x)


def test_hash_tensor_matches_cpu_bits():
    for x in (torch.tensor([[1.5, 2.0], [3.0, -1.0]]), torch.tensor([1, 2, 3]), torch.tensor([True, False]),
              torch.tensor([-1], dtype=torch.int8), torch.randn(3, 4, 5)):
        check(torch.hash_tensor, x)
        check(lambda t: torch.hash_tensor(t, dim=[0], keepdim=True), x)


@pytest.mark.parametrize("reduce", ["sum", "prod", "max", "min", "mean"])
def test_segment_reduce(reduce):
    data, lengths = torch.randn(5, 3), torch.tensor([0, 1, 2, 2])
    offsets = torch.tensor([0, 0, 1, 3, 5])
    check(lambda d, n: torch.segment_reduce(d, reduce, lengths=n), data, lengths, grad=True)
    check(lambda d, o: torch.segment_reduce(d, reduce, offsets=o, initial=2.0), data, offsets, grad=True)
    batched, batched_lengths = torch.arange(12.0).reshape(2, 6), torch.tensor([[1, 2, 3], [3, 3, 0]])
    check(lambda d, n: torch.segment_reduce(d, reduce, lengths=n, axis=1), batched, batched_lengths)


def test_hash_tensor_of_a_scalar():
    check(lambda t: torch.hash_tensor(t, dim=0, keepdim=True), torch.tensor(2.5))
    check(torch.hash_tensor, torch.tensor(2.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.int32, torch.int64, torch.uint8,
                                   torch.bool, torch.complex64], ids=str)
@pytest.mark.parametrize("op", [torch.median, torch.nanmedian], ids=["median", "nanmedian"])
def test_median_of_an_empty_tensor(op, dtype):
    # CPU's NaN converted to the dtype, not a value picked from nothing
    check(op, torch.empty(0, dtype=dtype))
    check(op, torch.empty(2, 0, dtype=dtype))


def test_bincount_of_negative_values_raises_cpus_error():
    with pytest.raises(RuntimeError) as cpu:
        torch.bincount(torch.tensor([-1, 2]))
    with pytest.raises(RuntimeError, match=str(cpu.value).replace(".", "\\.")):
        torch.bincount(torch.tensor([-1, 2], device="neuron")).cpu()


DOF_CALLS = {  # (on a shape of their own: the warning is told once per plan signature)
    "std over a dim": lambda t: torch.std(t, 0, correction=3),
    "var of all": lambda t: torch.var(t, correction=40),
    "var_mean over a dim": lambda t: torch.var_mean(t, 0, correction=2),
    "std_mean of all": lambda t: torch.std_mean(t, correction=35),
    "var of one element": lambda t: torch.var(t[:1, :1]),
    "std with a fractional correction": lambda t: torch.std(t, 0, correction=2.5),
    "var over an empty dim": lambda t: torch.var(t[:, :0], 1),
    "var unbiased": lambda t: torch.var(t, 0),
    "std biased of one element": lambda t: torch.std(t[:1, :1], unbiased=False),
    "var over dims": lambda t: torch.var(t, (0, 1), correction=34),
    "var over dims with one left": lambda t: torch.var(t, (0, 1), correction=33),
}


@pytest.mark.parametrize("name", DOF_CALLS)
def test_degrees_of_freedom_warning_as_cpu(name):
    # CPU warns where the correction leaves no degrees of freedom, and only there
    messages = []
    for device in ("cpu", "neuron"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = DOF_CALLS[name](torch.arange(34.0).view(2, 17).to(device))
            torch.utils._pytree.tree_map(lambda r: r.cpu(), result)
        messages.append([str(w.message).split(" (Triggered internally")[0] for w in caught
                         if "degrees of freedom" in str(w.message)])
    assert messages[1] == messages[0]
