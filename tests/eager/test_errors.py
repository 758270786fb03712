"""Bad input gets the error PyTorch users expect, never a crash."""
import pytest
import torch

import torchneuron


def test_mixing_devices_raises_pytorchs_error():
    a = torch.ones(3).to("neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3).to("neuron:1")
    # 0-dim CPU tensors take part as scalars, as with CUDA
    torch.testing.assert_close((a + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))



def test_written_tensors_must_be_on_the_device():
    # a 0-dim CPU tensor is a scalar only when read: as an out= tensor or in-place self it is refused
    a = torch.tensor(2.0).to("neuron")
    with pytest.raises(RuntimeError, match="same device, but found at least two devices, neuron:0 and cpu"):
        torch.add(a, a, out=torch.tensor(0.0))
    with pytest.raises(RuntimeError, match="same device, but found at least two devices, neuron:0 and cpu"):
        torch.tensor(1.0).add_(a)


def test_outs_filled_after_the_fact_are_checked_as_pytorch_does():
    # nonzero's out= is filled after the fact (its size depends on the values): a wrong shape warns
    # and is resized, a CPU out is refused
    x = torch.tensor([0.0, 1.0, 2.0]).to("neuron")
    out = torch.zeros(5, dtype=torch.long).to("neuron")
    with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
        torch.nonzero(x, out=out)
    assert out.shape == (2, 1) and out.cpu().flatten().tolist() == [1, 2]
    with pytest.raises(RuntimeError, match="same device"):
        torch.nonzero(x, out=torch.empty(0, dtype=torch.long))


def test_an_out_that_is_also_an_input_is_refused_not_resized_forever():
    x, y = torch.empty(0).to("neuron"), torch.ones(2, 3).to("neuron")
    with pytest.raises(RuntimeError, match="the written-to tensor refer to a single memory location"):
        torch.cat((x, y), out=x)


def test_copying_to_neuron_leaves_the_cpu_tensor_resizable():
    # Tensor.numpy() would mark the storage not resizable for good
    for t in (torch.ones(3), torch.ones(3, dtype=torch.bfloat16)):
        t.to("neuron")
        t.resize_(5)
        assert t.shape == (5,)


def test_shape_errors_are_pytorchs_own():
    a, b = torch.ones(3).to("neuron"), torch.ones(4).to("neuron")
    with pytest.raises(RuntimeError, match="(must match the size of tensor b|broadcast a dimension of length 4)"):
        a + b


def test_unsupported_dtype_names_the_op_and_dtype():
    x = torch.ones(3, dtype=torch.complex32)
    with pytest.raises(TypeError, match="copy_ from torch.complex32 on cpu .* does not support dtype torch.complex32: "
                                        "XLA has no complex32"):
        x.to("neuron")
    with pytest.raises(TypeError, match="aten.zero_.default does not support dtype torch.complex32"):
        torch.zeros(3, dtype=torch.complex32, device="neuron")
    with pytest.raises(TypeError, match="to torch.complex32 on neuron:0 does not support dtype torch.complex32"):
        torch.ones(3, device="neuron").chalf()


# An op with a CPU kernel only: it stays unlowered however coverage grows.
_lib = torch.library.Library("tn_errors", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * 2, "CPU")
FALLBACK_OP = "tn_errors.twice.default"


def test_fallback_can_be_made_an_error(monkeypatch):
    monkeypatch.setattr(torchneuron.config, "FALLBACK", "error")
    x = torch.ones(4).to("neuron")
    with pytest.raises(NotImplementedError, match=FALLBACK_OP):
        torch.ops.tn_errors.twice(x)


def test_fallback_runs_on_cpu_counted_and_warned_once():
    x = torch.arange(8.0).to("neuron")
    before = torchneuron.fallback_stats().get(FALLBACK_OP, 0)
    with pytest.warns(UserWarning, match="twice.default has no lowering") if before == 0 else _no_warning():
        y = torch.ops.tn_errors.twice(x)
    torch.testing.assert_close(y.cpu(), torch.arange(8.0) * 2)
    assert y.device.type == "neuron"
    assert torchneuron.fallback_stats()[FALLBACK_OP] == before + 1


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_out_of_range_index_is_an_error_not_a_crash():
    x = torch.arange(4.0).to("neuron")
    with pytest.raises(IndexError):
        x[10]


def _same_error(fn, *cpu_args):
    """fn raises on neuron what it raises on CPU: the same type and message."""
    with pytest.raises(Exception) as cpu:
        fn(*cpu_args)
    with pytest.raises(type(cpu.value)) as neuron:
        fn(*[a.to("neuron") if isinstance(a, torch.Tensor) else a for a in cpu_args])
    assert type(neuron.value) is type(cpu.value) and str(neuron.value) == str(cpu.value)


@pytest.mark.parametrize("fn", [
    lambda x: torch.add(x, x, out=torch.empty(3, dtype=torch.long, device=x.device)),
    lambda x: torch.add(x, x, out=torch.empty(3, dtype=torch.bool, device=x.device)),
    lambda x: torch.mul(x, 2, out=torch.empty(3, dtype=torch.int32, device=x.device)),
    lambda x: torch.sin(x, out=torch.empty(3, dtype=torch.long, device=x.device)),
    lambda x: torch.atan2(x, x, out=torch.empty(3, dtype=torch.long, device=x.device)),
    lambda x: torch.pow(x, 2, out=torch.empty(3, dtype=torch.long, device=x.device)),
    lambda x: torch.div(x.long(), 2, out=torch.empty(3, dtype=torch.long, device=x.device)),
    lambda x: torch.bitwise_and(x.long(), 1, out=torch.empty(3, dtype=torch.bool, device=x.device)),
    lambda x: torch.addcmul(x, x, x, out=torch.empty(3, dtype=torch.long, device=x.device)),
    lambda x: torch.where(x > 0, x, x, out=torch.empty(3, dtype=torch.long, device=x.device)),
    lambda x: torch.where(x > 0, x, x, out=torch.empty(3, dtype=torch.float64, device=x.device)),
    lambda x: torch.clamp(x, 0, 1, out=torch.empty(3, dtype=torch.long, device=x.device)),
    lambda x: torch.clamp(x, 0, 1, out=torch.empty(3, dtype=torch.float64, device=x.device)),
    lambda x: torch.clamp(x.long(), 0.5, out=torch.empty(3, dtype=torch.long, device=x.device)),
    lambda x: torch.clamp(x, torch.zeros(3, device=x.device), out=torch.empty(3, dtype=torch.long, device=x.device)),
])
def test_unsafe_out_casts_raise_cpus_error(fn):
    _same_error(fn, torch.randn(3))


@pytest.mark.parametrize("fn", [
    lambda x: torch.nonzero(x, out=torch.empty(0, device=x.device)),
    lambda x: torch.nonzero(x, out=torch.empty(0, dtype=torch.int32, device=x.device)),
    lambda x: torch.heaviside(x, x.double()),
    lambda x: torch.heaviside(x, torch.tensor(1.0, dtype=torch.float64)),
    lambda x: torch.heaviside(x, x, out=torch.empty(3, dtype=torch.float64, device=x.device)),
    lambda x: x.clone().heaviside_(x.double()),
    lambda x: torch.heaviside(x.cfloat(), x.cfloat()),
    lambda x: torch.clamp(x),
    lambda x: torch.clamp(x, None, None),
    lambda x: x.clone().clamp_(),
    lambda x: torch.clamp(x, out=torch.empty(3, device=x.device)),
    # a source of another dtype (PyTorch's meta kernels cast it; a cache filled under autocast met it)
    lambda x: x.clone().index_copy_(0, torch.tensor([1], device=x.device), x[:1].bfloat16()),
    lambda x: torch.index_copy(x, 0, torch.tensor([1], device=x.device), x[:1].double()),
    lambda x: x.clone().index_add_(0, torch.tensor([1], device=x.device), x[:1].bfloat16()),
    lambda x: torch.index_add(x, 0, torch.tensor([1], device=x.device), x[:1].double(), alpha=2),
])
def test_op_checks_raise_cpus_error(fn):
    _same_error(fn, torch.randn(3))


def test_checked_ops_still_compute():
    x = torch.tensor([-1.0, 0.0, 2.0])
    v = torch.tensor([0.5, 0.5, 0.5])
    torch.testing.assert_close(torch.heaviside(x.to("neuron"), v.to("neuron")).cpu(), torch.heaviside(x, v))
    torch.testing.assert_close(torch.clamp(x.to("neuron"), min=0).cpu(), torch.clamp(x, min=0))
    index = torch.tensor([2, 0])
    torch.testing.assert_close(x.to("neuron").index_copy_(0, index.to("neuron"), v[:2].to("neuron")).cpu(),
                               x.clone().index_copy_(0, index, v[:2]))
    torch.testing.assert_close(torch.index_add(x.to("neuron"), 0, index.to("neuron"), v[:2].to("neuron"), alpha=3).cpu(),
                               torch.index_add(x, 0, index, v[:2], alpha=3))
    out = torch.empty(0, dtype=torch.long, device="neuron")
    torch.testing.assert_close(torch.nonzero(x.to("neuron"), out=out).cpu(), torch.nonzero(x))
    torch.testing.assert_close(torch.add(x.to("neuron"), 1, out=torch.empty(3, dtype=torch.float64,
                                                                               device="neuron")).cpu(),
                               torch.add(x, 1, out=torch.empty(3, dtype=torch.float64)))
