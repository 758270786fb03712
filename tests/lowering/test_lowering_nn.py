import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.reference import assert_same, check, to_neuron

pytestmark = pytest.mark.usefixtures("lowered_only")


FLOATS = [torch.float32, torch.float64]


# ----------------------------------------------------------------------------- convolution
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kw", [{}, {"stride": 2, "padding": 1}, {"dilation": 2, "padding": 2},
                                {"groups": 2, "padding": (1, 0)}, {"padding": "same"}])
def test_conv2d(dtype, kw):
    x, w, b = torch.randn(2, 4, 7, 6, dtype=dtype), torch.randn(6, 4 // kw.get("groups", 1), 3, 3,
                                                                 dtype=dtype), torch.randn(6, dtype=dtype)
    check(lambda x, w, b: F.conv2d(x, w, b, **kw), x, w, b, grad=True)


_CONVS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _string_padding_cases():
    """conv1d/2d/3d with padding "valid" and "same": even kernels make "same" pad one more on the
    right (PyTorch pads the input first), dilation and groups change its amounts."""
    for rank in _CONVS:
        for padding in ("valid", "same"):
            for k in (2, 3):
                for kw in ({}, {"dilation": 2}, {"groups": 2}, {"stride": 2}):
                    if not (padding == "same" and "stride" in kw):  # PyTorch refuses "same" with strides
                        yield rank, padding, k, kw


def string_padding_conv(rank, padding, k, kw, dtype=torch.float64):
    """(fn, x, w, b) for one string-padding case (shared with tests/compile/test_compile.py)."""
    x = torch.randn((2, 4) + (6,) * rank, dtype=dtype)
    w = torch.randn((6, 4 // kw.get("groups", 1)) + (k,) * rank, dtype=dtype)
    return (lambda x, w, b: _CONVS[rank](x, w, b, padding=padding, **kw)), x, w, torch.randn(6, dtype=dtype)


@pytest.mark.parametrize("rank,padding,k,kw", list(_string_padding_cases()))
def test_conv_string_padding(rank, padding, k, kw):
    # "valid" reaches aten.convolution as padding [0] (one entry for every axis) from _convolution_mode
    fn, x, w, b = string_padding_conv(rank, padding, k, kw)
    check(fn, x, w, b, grad=True)


def _on(module: nn.Module, device) -> nn.Module:
    """A copy of `module` on `device`: moving the module itself would move the Parameters the CPU
    run's graph accumulates into (a module keeps its Parameter objects through moves, as on CUDA)."""
    return copy.deepcopy(module).to(device)


def test_conv_string_padding_float32_module():
    conv = nn.Conv2d(4, 6, (2, 3), padding="same", dilation=(1, 2))
    check(lambda x: _on(conv, x.device)(x), torch.randn(2, 4, 7, 6), grad=True, rtol=1e-5, atol=1e-5)


def test_conv1d_3d_no_bias_noncontiguous():
    check(lambda x, w: F.conv1d(x, w, stride=2), torch.randn(2, 7, 3).transpose(1, 2), torch.randn(5, 3, 2),
          grad=True)
    check(lambda x, w: F.conv3d(x, w, padding=1), torch.randn(1, 2, 4, 4, 4), torch.randn(3, 2, 3, 3, 3),
          grad=True)


@pytest.mark.parametrize("kw", [{}, {"stride": 2, "padding": 1, "output_padding": 1},
                                {"groups": 2, "dilation": 2}, {"stride": (2, 3), "output_padding": (1, 2)}])
def test_conv_transpose2d(kw):
    x, w, b = torch.randn(2, 4, 5, 4), torch.randn(4, 3, 3, 3), torch.randn(3 * kw.get("groups", 1))
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, **kw), x, w, b, grad=True)


def test_conv2d_module_bfloat16():
    m = nn.Conv2d(3, 4, 3, padding=1).to(torch.bfloat16)
    check(lambda x: _on(m, x.device)(x), torch.randn(2, 3, 5, 5, dtype=torch.bfloat16), rtol=2e-2, atol=2e-2)


# --------------------------------------------------------------------------------- pooling
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kw", [{"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1},
                                {"kernel_size": (2, 3), "stride": 1, "dilation": 2},
                                {"kernel_size": 3, "stride": 2, "ceil_mode": True}])
def test_max_pool2d(dtype, kw):
    x = torch.randn(2, 3, 7, 8, dtype=dtype)
    check(lambda x: F.max_pool2d(x, return_indices=True, **kw), x, grad=True)


def test_max_pool_module_unbatched_noncontiguous():
    check(nn.MaxPool2d(2), torch.randn(3, 8, 6)[:, ::2].transpose(1, 2), grad=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kw", [{"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1},
                                {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
                                {"kernel_size": 3, "stride": 2, "ceil_mode": True},
                                {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
                                {"kernel_size": 2, "divisor_override": 3}])
def test_avg_pool2d(dtype, kw):
    check(lambda x: F.avg_pool2d(x, **kw), torch.randn(2, 3, 7, 8, dtype=dtype), grad=True)


@pytest.mark.parametrize("kw", [
    # EfficientNet's pooler: AvgPool2d(kernel_size=hidden_dim, ceil_mode=True) over a few pixels
    {"kernel_size": 1280, "ceil_mode": True},
    {"kernel_size": 256, "ceil_mode": True, "divisor_override": 5},
    # windows cut to the input plus padding: overlapping, padded, counting the padding or not
    {"kernel_size": (7, 9), "stride": (2, 3), "padding": (3, 4), "ceil_mode": True},
    {"kernel_size": (7, 9), "stride": (2, 3), "padding": (3, 4), "ceil_mode": True, "count_include_pad": False},
    {"kernel_size": (6, 3), "stride": 1, "padding": (2, 1)},
])
def test_avg_pool2d_kernel_larger_than_input(kw):
    check(lambda x: F.avg_pool2d(x, **kw), torch.randn(2, 3, 3, 2, dtype=torch.float64), grad=True)


@pytest.mark.parametrize("size", [1, 3, (2, 5), (4, 4)])
def test_adaptive_avg_pool2d(size):
    check(nn.AdaptiveAvgPool2d(size), torch.randn(2, 3, 7, 5), grad=True)
    check(nn.AdaptiveAvgPool2d(size), torch.randn(3, 9, 5, dtype=torch.float64).transpose(1, 2), grad=True)


# --------------------------------------------------------------------------- normalization
@pytest.mark.parametrize("dtype", FLOATS)
def test_batch_norm_functional(dtype):
    x, w, b = torch.randn(4, 3, 5, 2, dtype=dtype), torch.randn(3, dtype=dtype), torch.randn(3, dtype=dtype)
    rm, rv = torch.randn(3, dtype=dtype), torch.rand(3, dtype=dtype) + 0.5
    check(lambda x, w, b: F.batch_norm(x, rm.to(x.device), rv.to(x.device), w, b, training=False), x, w, b,
          grad=True)
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b, grad=True)
    check(lambda x: F.batch_norm(x, None, None, training=True), x.transpose(0, 1), grad=True)


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 3), (4, 3, 7)])
def test_batch_norm_module_running_stats(shape):
    cpu = nn.BatchNorm2d(3) if len(shape) == 4 else nn.BatchNorm1d(3)
    dev = to_neuron(cpu.state_dict())
    dev_m = type(cpu)(3).to("neuron")
    dev_m.load_state_dict(dev)
    for step in range(3):
        x = torch.randn(*shape) * (step + 1) + step
        xc, xd = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
        yc, yd = cpu(xc), dev_m(xd)
        torch.testing.assert_close(yd.cpu(), yc, rtol=1e-4, atol=1e-4)
        seed = torch.randn(*shape)
        yc.backward(seed)
        yd.backward(seed.to("neuron"))
        torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    for name, value in cpu.state_dict().items():
        torch.testing.assert_close(dev_m.state_dict()[name].cpu(), value, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dev_m.weight.grad.cpu(), cpu.weight.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dev_m.bias.grad.cpu(), cpu.bias.grad, rtol=1e-4, atol=1e-4)
    cpu.eval(), dev_m.eval()
    x = torch.randn(*shape)
    torch.testing.assert_close(dev_m(x.to("neuron")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm(dtype):
    x = torch.randn(2, 3, 4, 5, dtype=dtype)
    check(lambda x, w, b: F.layer_norm(x, (4, 5), w, b), x, torch.randn(4, 5, dtype=dtype),
          torch.randn(4, 5, dtype=dtype), grad=True)
    check(lambda x: F.layer_norm(x, (5,)), x.transpose(1, 2), grad=True)
    check(lambda x: torch.native_layer_norm(x, (5,), None, None, 1e-5), x, grad=True)


def test_layer_norm_module_and_half():
    m = nn.LayerNorm(6)
    check(lambda x: _on(m, x.device)(x), torch.randn(3, 6), grad=True)
    check(lambda x: F.layer_norm(x, (6,)), torch.randn(3, 6, dtype=torch.bfloat16), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_group_norm(dtype):
    x = torch.randn(2, 6, 3, 4, dtype=dtype)
    check(lambda x, w, b: F.group_norm(x, 3, w, b), x, torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype),
          grad=True)
    check(lambda x: F.group_norm(x, 2), x[:, :, ::2], grad=True)


# ------------------------------------------------------------------------------- softmax
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, -1, 1])
def test_softmax_log_softmax(dtype, dim):
    x = torch.randn(3, 4, 5, dtype=dtype)
    check(lambda x: F.softmax(x, dim), x, grad=True)
    check(lambda x: F.log_softmax(x, dim), x.transpose(0, 2), grad=True)


def test_softmax_edge_cases():
    check(lambda x: F.softmax(x, 0), torch.randn(()), grad=True)
    check(lambda x: F.log_softmax(x, 0), torch.randn(()), grad=True)
    check(lambda x: F.softmax(x, -1), torch.tensor([[0.0, float("-inf")], [1.0, 2.0]]))
    check(lambda x: F.softmax(x, -1, dtype=torch.float32), torch.randn(3, 4, dtype=torch.float16),
          rtol=1e-3, atol=1e-3)
    check(lambda x: F.log_softmax(x, -1), torch.randn(3, 4, dtype=torch.bfloat16), rtol=2e-2, atol=2e-2)


# -------------------------------------------------------------------------------- losses
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction):
    x, t, w = torch.randn(5, 4).log_softmax(-1), torch.tensor([0, 3, 1, -100, 2]), torch.rand(4)
    check(lambda x: F.nll_loss(x, t.to(x.device), reduction=reduction), x, grad=True)
    check(lambda x: F.nll_loss(x, t.to(x.device), w.to(x.device), reduction=reduction), x, grad=True)
    check(lambda x: F.nll_loss(x, t[0].to(x.device), reduction=reduction), x[0], grad=True)
    t2 = torch.randint(0, 4, (2, 3, 3))
    t2[0, 0, 0] = 1
    check(lambda x: F.nll_loss(x, t2.to(x.device), reduction=reduction, ignore_index=1),
          torch.randn(2, 4, 3, 3, dtype=torch.float64), grad=True)


@pytest.mark.parametrize("kw", [{}, {"ignore_index": 2}, {"label_smoothing": 0.1},
                                {"label_smoothing": 0.2, "ignore_index": 0, "reduction": "sum"}])
def test_cross_entropy(kw):
    x, t = torch.randn(6, 5), torch.tensor([0, 2, 4, 2, 1, 3])
    check(lambda x: F.cross_entropy(x, t.to(x.device), **kw), x, grad=True)


def test_cross_entropy_probabilities_and_weight():
    x, p = torch.randn(4, 3), torch.randn(4, 3).softmax(-1)
    check(lambda x, p: F.cross_entropy(x, p), x, p, grad=True)
    t = torch.tensor([0, 2, 1, 1])
    w = torch.rand(3)
    check(lambda x: F.cross_entropy(x, t.to(x.device), w.to(x.device)), x, grad=True)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_regression_losses(reduction, dtype):
    x, y = torch.randn(3, 4, dtype=dtype) * 2, torch.randn(3, 4, dtype=dtype)
    check(lambda x, y: F.mse_loss(x, y, reduction=reduction), x, y, grad=True)
    check(lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.5), x, y, grad=True)
    check(lambda x, y: F.huber_loss(x, y, reduction=reduction, delta=0.7), x, y, grad=True)
    p, t = torch.rand(3, 4, dtype=dtype) * 0.98 + 0.01, torch.rand(3, 4, dtype=dtype)
    # target detached: its gradient needs aten.logit (elementwise family)
    check(lambda p: F.binary_cross_entropy(p, t.to(p.device), reduction=reduction), p, grad=True)
    w = torch.rand(4, dtype=dtype)
    check(lambda p: F.binary_cross_entropy(p, t.to(p.device), w.to(p.device), reduction=reduction), p,
          grad=True)


# --------------------------------------------------------------------- embedding, dropout, gelu
@pytest.mark.parametrize("kw", [{}, {"padding_idx": 1}, {"scale_grad_by_freq": True},
                                {"padding_idx": 0, "scale_grad_by_freq": True}])
def test_embedding(kw):
    idx = torch.tensor([[1, 0, 3], [3, 3, 2]])
    check(lambda w: F.embedding(idx.to(w.device), w, **kw), torch.randn(5, 4), grad=True)
    check(lambda w: F.embedding(idx[:, ::2].to(w.device), w, **kw), torch.randn(5, 4, dtype=torch.float64),
          grad=True)


def test_embedding_module():
    m = nn.Embedding(7, 3, padding_idx=2)
    check(lambda i: m.to(i.device)(i), torch.tensor([0, 2, 6, 2]))


def test_dropout_scale_and_identity():
    x = torch.ones(64, 64)
    xd = x.to("neuron").requires_grad_()
    y = F.dropout(xd, 0.25)
    kept = y.cpu() != 0
    assert y.shape == x.shape
    assert torch.all(y.cpu()[kept] == 1 / 0.75)
    assert 0.6 < kept.float().mean() < 0.9
    y.backward(torch.ones(64, 64).to("neuron"))
    assert torch.equal(xd.grad.cpu(), y.detach().cpu())
    check(lambda x: F.dropout(x, 0.0), torch.randn(3, 4), grad=True)
    check(lambda x: F.dropout(x, 0.5, training=False), torch.randn(3, 4), grad=True)
    check(lambda x: F.dropout(x, 1.0), torch.randn(3, 4), grad=True)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_gelu(approximate, dtype):
    check(lambda x: F.gelu(x, approximate=approximate), torch.randn(4, 5, dtype=dtype).t(), grad=True)


# -------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"scale": 0.3}, {"enable_gqa": True}])
def test_sdpa(dtype, kw):
    q = torch.randn(2, 4, 5, 8, dtype=dtype)
    kv_heads = 2 if kw.get("enable_gqa") else 4
    k, v = torch.randn(2, kv_heads, 6, 8, dtype=dtype), torch.randn(2, kv_heads, 6, 8, dtype=dtype)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), q, k, v, grad=True)


def test_sdpa_masks_and_noncontiguous():
    q, k, v = torch.randn(2, 5, 3, 8).transpose(1, 2), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    bool_mask = torch.rand(5, 6) > 0.3
    bool_mask[:, 0] = True
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask.to(q.device)), q, k, v,
          grad=True)
    float_mask = torch.randn(2, 1, 5, 6)
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, float_mask,
          grad=True)
    # a fully masked row gives zeros, as on CPU
    bool_mask[1] = False
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask.to(q.device)), q, k, v)


# ------------------------------------------------------------------------ direct op coverage
def test_backward_ops_with_output_mask():
    x, w = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
    check(lambda x, w: F.conv2d(x, w.detach()), x, w, grad=True)
    check(lambda x, w: F.conv2d(x.detach(), w), x, w, grad=True)
    check(lambda x, w, b: F.layer_norm(x.detach(), (5,), w, b), x, torch.randn(5), torch.randn(5), grad=True)


def test_native_batch_norm_ops():
    x, w, b, rm, rv = torch.randn(4, 3, 2), torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 1
    check(lambda *a: torch.ops.aten._native_batch_norm_legit_functional(*a, True, 0.1, 1e-5), x, w, b, rm, rv)
    check(lambda *a: torch.ops.aten._native_batch_norm_legit_no_training(*a, 0.1, 1e-5)[0], x, w, b, rm, rv)
    check(lambda *a: torch.ops.aten.native_batch_norm(*a, True, 0.1, 1e-5), x, w, b, None, None)
    # the mutating op writes the new running stats into its arguments
    check(lambda x, w, b, rm, rv: (torch.ops.aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.3, 1e-5), rm,
                                   rv), x, w, b, rm, rv)


def test_batch_norm_with_and_without_update():
    """The batch norm ops of torch.export: running stats written (with_update) or read (no_update);
    eval batch norms leave the saved statistics empty, as CPU does."""
    aten = torch.ops.aten
    x, w, b, g = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2), torch.randn(3, 2, 4)
    for update in (True, False):
        stats_cpu, stats_dev = [torch.zeros(2), torch.ones(2)], [torch.zeros(2).to("neuron"), torch.ones(2).to("neuron")]
        if update:
            cpu = aten._batch_norm_with_update(x, w, b, *stats_cpu, 0.1, 1e-5)
            dev = aten._batch_norm_with_update(*(t.to("neuron") for t in (x, w, b)), *stats_dev, 0.1, 1e-5)
        else:
            cpu = aten._batch_norm_no_update(x, w, b, *stats_cpu, 0.1, 1e-5)
            dev = aten._batch_norm_no_update(*(t.to("neuron") for t in (x, w, b)), *stats_dev, 0.1, 1e-5)
        assert_same(cpu, dev, rtol=1e-5, atol=1e-5)
        assert_same(stats_cpu, stats_dev, rtol=1e-5, atol=1e-5)
        grads_cpu = aten.batch_norm_backward(g, x, w, *stats_cpu, cpu[1], cpu[2], update, 1e-5, [True] * 3, cpu[3])
        grads_dev = aten.batch_norm_backward(g.to("neuron"), x.to("neuron"), w.to("neuron"), *stats_dev,
                                             dev[1], dev[2], update, 1e-5, [True] * 3, dev[3])
        assert_same(grads_cpu, grads_dev, rtol=1e-4, atol=1e-4)
    cpu = torch.native_batch_norm(x, None, None, torch.zeros(2), torch.ones(2), False, 0.1, 1e-5)
    dev = torch.native_batch_norm(x.to("neuron"), None, None, torch.zeros(2).to("neuron"),
                                  torch.ones(2).to("neuron"), False, 0.1, 1e-5)
    assert_same(cpu, dev, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("functional", [False, True])
def test_batch_norm_with_update_without_weight_or_bias(functional):
    """An affine-free batch norm (BatchNorm2d(affine=False)) passes weight and bias as None."""
    aten = torch.ops.aten
    op = aten._batch_norm_with_update_functional if functional else aten._batch_norm_with_update
    x = torch.randn(4, 3, 5, 5)
    stats_cpu, stats_dev = [torch.zeros(3), torch.ones(3)], [torch.zeros(3).to("neuron"), torch.ones(3).to("neuron")]
    cpu = op(x, None, None, *stats_cpu, 0.1, 1e-5)
    dev = op(x.to("neuron"), None, None, *stats_dev, 0.1, 1e-5)
    assert_same(cpu, dev, rtol=1e-5, atol=1e-5)
    assert_same(stats_cpu, stats_dev, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("param_dtype", ["same", torch.float32])
def test_half_norm_statistics_dtype_like_cpu(dtype, param_dtype):
    """CPU saves a half input's mean and inverse std in the input's dtype, or in float32 when a
    parameter is float32; PyTorch's meta kernels say float32 (group norm: the input's) always."""
    aten = torch.ops.aten
    pd = dtype if param_dtype == "same" else param_dtype
    x, w, rm = torch.randn(2, 3, 4, dtype=dtype), torch.randn(3, dtype=pd), torch.zeros(3, dtype=pd)
    tol = {"rtol": 2e-2, "atol": 2e-2}
    check(lambda x, w: aten.native_layer_norm(x, (3,), w, w, 1e-5), x.mT, w, **tol)
    check(lambda x, w: aten.native_group_norm(x, w, w, 2, 3, 4, 3, 1e-5), x, w, **tol)
    for training in (True, False):
        check(lambda x, w, rm, rv, t=training: aten.native_batch_norm(x, w, w, rm, rv, t, 0.1, 1e-5), x, w, rm,
              rm + 1, **tol)
        check(lambda x, w, rm, rv, t=training: (aten._native_batch_norm_legit(x, w, w, rm, rv, t, 0.1, 1e-5), rm, rv),
              x, w, rm, rm + 1, **tol)
    check(lambda x, w, rm, rv: (aten._batch_norm_with_update(x, w, w, rm, rv, 0.1, 1e-5)[:3], rm, rv),
          x, w, rm, rm + 1, **tol)
    check(lambda x: aten._native_batch_norm_legit(x, None, None, True, 0.1, 1e-5), x, **tol)
    check(lambda x: F.layer_norm(x, (4,)), x, grad=True, **tol)  # the backward reads the saved statistics


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_out_variants(training):
    aten = torch.ops.aten
    x = torch.randn(3, 2, 4)
    for op in (aten.native_batch_norm.out, aten._native_batch_norm_legit.out):
        stats = {"cpu": [torch.zeros(2), torch.ones(2)], "neuron": [torch.zeros(2).to("neuron"), torch.ones(2).to("neuron")]}
        outs = {d: [torch.empty(0, device=d) for _ in range(3)] for d in stats}
        for d, running in stats.items():
            op(x.to(d), None, None, *running, training, 0.1, 1e-5, out=outs[d][0], save_mean=outs[d][1],
               save_invstd=outs[d][2])
        assert_same(outs["cpu"], outs["neuron"], rtol=1e-5, atol=1e-5)
        assert_same(stats["cpu"], stats["neuron"], rtol=1e-5, atol=1e-5)
