"""Resampling, N-d pooling, padding, less common activations and losses, order statistics and
searches: each as its own lowering (no CPU fallback, no decomposition), values and gradients
against CPU."""
import pytest
import torch
import torch.nn.functional as F

from tests.reference import check

TOL = {"atol": 1e-5, "rtol": 1e-5}


pytestmark = pytest.mark.usefixtures("lowered_only")


# ----------------------------------------------------------------------------- upsampling
SHAPES = {1: (2, 3, 7), 2: (2, 3, 5, 6), 3: (1, 2, 3, 4, 5)}


def _sizes(kind, shape):
    if kind == "up":
        return {"size": tuple(2 * s for s in shape[2:])}
    if kind == "down":
        return {"size": tuple(max(1, s - 2) for s in shape[2:])}
    if kind == "scale":
        return {"scale_factor": 1.7}
    return {"scale_factor": 0.6, "recompute_scale_factor": False}  # the scale reaches the kernel


@pytest.mark.parametrize("mode,spatial,kind,align", [
    ("nearest", 1, "scale", None), ("nearest", 2, "up", None), ("nearest", 3, "explicit-scale", None),
    ("nearest-exact", 1, "explicit-scale", None), ("nearest-exact", 2, "scale", None),
    ("nearest-exact", 3, "down", None), ("linear", 1, "scale", False), ("linear", 1, "down", True),
    ("bilinear", 2, "explicit-scale", False), ("bilinear", 2, "up", True), ("bicubic", 2, "scale", False),
    ("bicubic", 2, "down", True), ("trilinear", 3, "explicit-scale", False), ("trilinear", 3, "scale", True)])
def test_interpolate(mode, spatial, kind, align):
    shape = SHAPES[spatial]
    check(lambda x: F.interpolate(x, mode=mode, align_corners=align, **_sizes(kind, shape)),
          torch.randn(shape), grad=True, **TOL)


@pytest.mark.parametrize("mode,kw,align", [("bilinear", {"scale_factor": 0.4}, False),
                                           ("bilinear", {"size": (9, 11)}, True),
                                           ("bicubic", {"scale_factor": 0.55, "recompute_scale_factor": False}, False),
                                           ("bicubic", {"size": (3, 2)}, True)])
def test_interpolate_antialias(mode, kw, align):
    check(lambda x: F.interpolate(x, mode=mode, align_corners=align, antialias=True, **kw),
          torch.randn(2, 3, 10, 12), grad=True, **TOL)


def test_interpolate_float64_and_uint8():
    check(lambda x: F.interpolate(x, scale_factor=2.5, mode="bicubic"), torch.randn(1, 2, 4, 5, dtype=torch.float64),
          grad=True)
    check(lambda x: F.interpolate(x, size=(7, 3), mode="nearest"), torch.randint(0, 255, (1, 2, 4, 5), dtype=torch.uint8))


# ----------------------------------------------------------------------------- grid_sample
@pytest.mark.parametrize("mode,padding,align", [("bilinear", "zeros", False), ("bilinear", "border", True),
                                                ("bilinear", "reflection", False), ("nearest", "reflection", True),
                                                ("nearest", "zeros", False), ("bicubic", "reflection", True)])
def test_grid_sample_2d(mode, padding, align):
    check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align),
          torch.randn(2, 3, 5, 6), torch.rand(2, 4, 7, 2) * 2.6 - 1.3, grad=True, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode,padding,align", [("bilinear", "reflection", True), ("nearest", "border", False)])
def test_grid_sample_3d(mode, padding, align):
    check(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align),
          torch.randn(2, 3, 4, 5, 6), torch.rand(2, 3, 4, 2, 3) * 2.6 - 1.3, grad=True, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- pooling
@pytest.mark.parametrize("kw", [{"kernel_size": 3, "stride": 2, "padding": 1},
                                {"kernel_size": (2, 3, 2), "stride": 1, "dilation": 2, "ceil_mode": True}])
def test_max_pool3d(kw):
    check(lambda x: F.max_pool3d(x, return_indices=True, **kw), torch.randn(2, 3, 6, 7, 5), grad=True)


@pytest.mark.parametrize("kw", [{"kernel_size": 3, "stride": 2, "padding": 1},
                                {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True,
                                 "count_include_pad": False},
                                {"kernel_size": 2, "divisor_override": 3}])
def test_avg_pool3d(kw):
    check(lambda x: F.avg_pool3d(x, **kw), torch.randn(2, 3, 6, 7, 5), grad=True, **TOL)


@pytest.mark.parametrize("size", [1, (2, 4, 3)])
def test_adaptive_pool3d(size):
    x = torch.randn(2, 3, 6, 7, 5)
    check(lambda x: F.adaptive_avg_pool3d(x, size), x, grad=True, **TOL)
    check(lambda x: F.adaptive_max_pool3d(x, size, return_indices=True), x, grad=True)


def test_adaptive_max_pool2d():
    check(lambda x: F.adaptive_max_pool2d(x, (4, 5), return_indices=True), torch.randn(2, 3, 6, 7), grad=True)
    check(lambda x: F.adaptive_max_pool1d(x, 3, return_indices=True), torch.randn(2, 3, 7), grad=True)


def test_fractional_max_pool():
    def pool2d(x, s):
        return F.fractional_max_pool2d(x, (3, 2), output_size=(4, 3), return_indices=True,
                                       _random_samples=s.detach())

    def pool3d(x, s):
        return F.fractional_max_pool3d(x, 2, output_size=(3, 4, 2), return_indices=True,
                                       _random_samples=s.detach())

    check(pool2d, torch.randn(2, 3, 9, 8), torch.rand(2, 3, 2), grad=True)
    check(pool3d, torch.randn(2, 3, 7, 8, 6), torch.rand(2, 3, 3), grad=True)


def test_max_unpool():
    out, idx = F.max_pool2d(torch.randn(2, 3, 6, 8), 2, return_indices=True)
    check(lambda o, i: F.max_unpool2d(o, i, 2), out, idx, grad=True)
    out, idx = F.max_pool3d(torch.randn(2, 3, 6, 7, 5), 2, return_indices=True)
    check(lambda o, i: F.max_unpool3d(o, i, 2, output_size=(6, 7, 5)), out, idx, grad=True)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_pad(mode):
    check(lambda x: F.pad(x, (2, 1), mode=mode), torch.randn(2, 3, 6), grad=True)
    check(lambda x: F.pad(x, (2, 1, 0, 3), mode=mode), torch.randn(2, 3, 6, 5), grad=True)
    check(lambda x: F.pad(x, (2, 1, 0, 3, 1, 1), mode=mode), torch.randn(2, 3, 4, 6, 5), grad=True)
    if mode == "replicate":
        check(lambda x: F.pad(x, (-2, 1, 0, -3), mode=mode), torch.randn(2, 3, 6, 5), grad=True)


def test_unfold_fold():
    check(lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)), torch.randn(2, 3, 6, 7), grad=True)
    check(lambda x: F.fold(x, (5, 6), (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)), torch.randn(2, 18, 12),
          grad=True, **TOL)
    check(lambda x: F.fold(x, (4, 4), 2), torch.randn(12, 9), grad=True)


# ----------------------------------------------------------------------------- activations
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_activations(dtype):
    x = torch.randn(3, 4, 6, dtype=dtype)
    check(F.logsigmoid, x, grad=True)
    check(torch.ops.aten.log_sigmoid_forward, x)
    check(lambda x: F.glu(x, 1), x, grad=True)
    check(F.glu, x, grad=True)
    check(F.prelu, x, torch.randn(4, dtype=dtype), grad=True)
    check(F.prelu, x, torch.randn(1, dtype=dtype), grad=True)
    check(lambda x: F.rrelu(x, training=False), x, grad=True)
    check(lambda x: F.channel_shuffle(x, 2), x, grad=True)
    check(lambda x: torch.native_channel_shuffle(x, 2), x)


def test_rrelu_training():
    x = torch.randn(200, device="neuron", requires_grad=True)
    y = F.rrelu(x, 0.1, 0.3, training=True)
    slope = (y / x).detach().cpu()
    positive = x.detach().cpu() > 0
    assert torch.all(slope[positive] == 1)
    assert torch.all((slope[~positive] >= 0.1) & (slope[~positive] <= 0.3))
    assert len(torch.unique(slope[~positive])) > 1
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), slope)


# ----------------------------------------------------------------------------- losses, distances
def test_margin_losses():
    x, y, w = torch.randn(5, 4), torch.randint(0, 4, (5,)), torch.rand(4)
    check(lambda x, y, w: F.multi_margin_loss(x, y, margin=0.7, weight=w.detach()), x, y, w, grad=True, **TOL)
    check(lambda x, y: F.multi_margin_loss(x, y, p=2, reduction="none"), x, y, grad=True, **TOL)
    target = torch.tensor([[2, 0, -1, 1, 1], [3, -1, 0, 0, 0], [0, 1, 2, 3, 4]])
    check(F.multilabel_margin_loss, torch.randn(3, 5), target, grad=True, **TOL)
    # 1-d input: not with reduction="none", where PyTorch's meta kernel says (1,) and its CPU kernel ()
    check(lambda x, y: F.multilabel_margin_loss(x, y, reduction="sum"), torch.randn(5), target[0], grad=True)


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 3.0, float("inf")])
def test_cdist(p):
    check(lambda a, b: torch.cdist(a, b, p=p), torch.randn(2, 5, 3), torch.randn(2, 4, 3), grad=True, **TOL)


def test_cdist_euclidean():
    check(torch.cdist, torch.randn(2, 5, 3), torch.randn(2, 4, 3), grad=True, **TOL)
    check(torch.cdist, torch.randn(30, 3), torch.randn(27, 3), grad=True, atol=1e-4, rtol=1e-4)  # the matmul form


# ----------------------------------------------------------------------------- order statistics
def test_median_kthvalue():
    x = torch.randn(4, 5, 6)
    check(torch.median, x, grad=True)
    check(torch.median, torch.randn(4, 6), grad=True)
    check(lambda x: torch.median(x, 1), x, grad=True)
    check(lambda x: torch.median(x, -1, keepdim=True), x, grad=True)
    check(lambda x: torch.nanmedian(x, 0), x, grad=True)
    check(lambda x: torch.median(x, 0), torch.randperm(20).reshape(4, 5))
    check(lambda x: torch.kthvalue(x, 3, 1), x, grad=True)
    check(lambda x: torch.kthvalue(x, 1, 0, keepdim=True), x, grad=True)


def test_median_nan():
    nan = float("nan")
    x = torch.tensor([[2., nan, 1., nan], [3., 1., 2., 0.], [nan, nan, nan, 5.]])
    check(torch.median, x)
    check(lambda x: torch.median(x, 1), x)
    check(torch.nanmedian, x)
    check(lambda x: torch.nanmedian(x, 1), x)


def test_mode():
    check(lambda x: torch.mode(x, 1), torch.randint(0, 4, (5, 9)).float(), grad=True)
    check(lambda x: torch.mode(x, 0), torch.randint(0, 3, (7, 4)))
    check(torch.mode, torch.tensor([[3., 1., 3., 1., 2., 5.]]))  # a tie: the smaller value, last index


@pytest.mark.parametrize("right", [False, True])
def test_bucketize_searchsorted(right):
    b = torch.tensor([-1., 0., 0.5, 2.])
    check(lambda x, b: torch.bucketize(x, b, right=right), torch.tensor([-2., 0., 0.3, 0.5, 3.]), b)
    check(lambda x, b: torch.bucketize(x, b, right=right, out_int32=True), torch.randn(3, 4), b)
    check(lambda b: torch.bucketize(0.5, b, right=right), b)
    check(lambda s, v: torch.searchsorted(s, v, right=right), torch.sort(torch.randn(3, 6))[0], torch.randn(3, 4))
    check(lambda s, v: torch.searchsorted(s, v, right=right), b, torch.randn(3, 4))
    check(lambda s: torch.searchsorted(s, 0.5, right=right), b)
    check(lambda s, v: torch.searchsorted(s, v, side="right"), b, torch.tensor([0., 0.5]))
    check(lambda s, v, o: torch.searchsorted(s, v, sorter=o), torch.tensor([3., 1., 2.]), torch.tensor([0., 1.5, 2.5]),
          torch.tensor([1, 2, 0]))


@pytest.mark.parametrize("reduce,include_self", [("prod", True), ("mean", False), ("amax", False), ("amin", True)])
def test_index_reduce(reduce, include_self):
    idx = torch.tensor([0, 2, 2, 4, 0])
    check(lambda x, s, i: x.index_reduce(1, i, s, reduce, include_self=include_self),
          torch.randn(3, 6, 2), torch.randn(3, 5, 2), idx, grad=reduce in ("prod", "mean"), **TOL)
    check(lambda x, s, i: x.index_reduce(0, i, s, reduce, include_self=include_self),
          torch.randint(-5, 5, (6, 2)), torch.randint(-5, 5, (5, 2)), idx)


def test_rrelu_with_noise_inplace_writes_self_and_noise():
    x = torch.randn(200)
    d, noise = x.to("neuron"), torch.empty(200).to("neuron")
    torch.ops.aten.rrelu_with_noise_(d, noise, 0.1, 0.3, True)
    got, noise = d.cpu(), noise.cpu()
    negative = x < 0
    assert ((noise[negative] >= 0.1) & (noise[negative] <= 0.3)).all()
    assert (noise[~negative] == 1).all()
    torch.testing.assert_close(got, x * noise)


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, float("inf"), 1.5])
def test_pdist(p):
    check(lambda t: F.pdist(t, p), torch.randn(5, 3), grad=True, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- weight norm
@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm_interface_and_its_backward(dim):
    g_shape = (4, 1, 1) if dim == 0 else (1, 1, 5)
    gen = torch.Generator().manual_seed(0)
    v, g = torch.randn(4, 3, 5, generator=gen), torch.randn(*g_shape, generator=gen)
    w, norms = torch._weight_norm_interface(v, g, dim)
    got_w, got_norms = torch._weight_norm_interface(v.to("neuron"), g.to("neuron"), dim)
    torch.testing.assert_close(got_w.cpu(), w, **TOL)
    torch.testing.assert_close(got_norms.cpu(), norms, **TOL)
    grad = torch.randn(w.shape, generator=gen)
    want = torch.ops.aten._weight_norm_interface_backward(grad, v, g, norms, dim)
    got = torch.ops.aten._weight_norm_interface_backward(*(t.to("neuron") for t in (grad, v, g, norms)), dim)
    for mine, cpu in zip(got, want):
        torch.testing.assert_close(mine.cpu(), cpu, **TOL)


def test_weight_normed_conv_under_compile_lowers_its_backward():
    # wav2vec2's positional convolution: weight_norm over the kernel axis, trained under torch.compile
    from torchneuron.compile import compile_stats

    def model():
        torch.manual_seed(0)
        conv = torch.nn.Conv1d(4, 4, 3, padding=1, groups=2)
        return torch.nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)

    x = torch.randn(2, 4, 7, generator=torch.Generator().manual_seed(1))
    cpu = model()
    cpu(x).square().sum().backward()
    neuron = model().to("neuron")
    torch._dynamo.reset()
    before = compile_stats().get("eager_graphs", 0)
    torch.compile(neuron, backend="neuron")(x.to("neuron")).square().sum().backward()
    assert compile_stats().get("eager_graphs", 0) == before
    for (name, p_cpu), p in zip(cpu.named_parameters(), neuron.parameters()):
        torch.testing.assert_close(p.grad.cpu(), p_cpu.grad, **TOL, msg=name)


@pytest.mark.parametrize("mask", [[True, False], [False, True], [True, True]])
def test_grid_sampler_backward_gives_what_cpu_gives_for_each_output_mask(mask):
    # glm4v samples a learned position table on a fixed grid: only the input's gradient is asked for
    gen = torch.Generator().manual_seed(0)
    inp, grid = torch.randn(1, 2, 4, 4, generator=gen), torch.rand(1, 3, 3, 2, generator=gen) * 2 - 1
    grad = torch.randn(1, 2, 3, 3, generator=gen)
    want = torch.ops.aten.grid_sampler_2d_backward(grad, inp, grid, 0, 0, False, mask)
    got = torch.ops.aten.grid_sampler_2d_backward(grad.to("neuron"), inp.to("neuron"), grid.to("neuron"), 0, 0,
                                                  False, mask)
    for mine, cpu in zip(got, want):
        assert (mine is None) == (cpu is None)
        if cpu is not None:
            torch.testing.assert_close(mine.cpu(), cpu, **TOL)
