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
