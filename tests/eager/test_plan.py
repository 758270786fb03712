"""Building a plan: the meta call sees what the CPU kernel sees.

A 0-dim CPU tensor takes part in any op as a scalar: in the meta call it is a meta 0-dim tensor of
its dtype, so meta kernels that check devices accept it and type promotion treats it as CPU does.
"""
import pytest
import torch

BINARY = {
    "copysign": torch.copysign, "atan2": torch.atan2, "fmod": torch.fmod, "remainder": torch.remainder,
    "hypot": torch.hypot, "nextafter": torch.nextafter, "xlogy": torch.xlogy, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax, "heaviside": torch.heaviside,
    "add": torch.add, "mul": torch.mul, "div": torch.div, "floor_divide": torch.floor_divide,
    "logaddexp": torch.logaddexp, "ldexp": torch.ldexp, "eq": torch.eq, "lt": torch.lt,
}
FLOAT_ONLY = {"hypot", "nextafter", "logaddexp", "heaviside", "copysign"}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("scalar_first", [False, True])
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float32, torch.float64),
                                    (torch.int64, torch.float64), (torch.float32, torch.int64)])
def test_binary_ufuncs_take_a_cpu_0dim_operand(name, scalar_first, dtypes):
    fn = BINARY[name]
    tensor_dtype, scalar_dtype = dtypes
    if name in FLOAT_ONLY and torch.int64 in dtypes or name == "heaviside" and tensor_dtype != scalar_dtype:
        pytest.skip("CPU refuses these dtypes")
    x = (torch.randn(6) * 4).to(tensor_dtype)
    s = torch.tensor(-1.5 if scalar_dtype.is_floating_point else -2, dtype=scalar_dtype)
    cpu_args = (s, x) if scalar_first else (x, s)
    dev_args = (s, x.to("neuron")) if scalar_first else (x.to("neuron"), s)
    expected = fn(*cpu_args)
    got = fn(*dev_args)
    assert got.device.type == "neuron" and got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)


@pytest.mark.parametrize("position", [1, 2])
def test_where_takes_a_cpu_0dim_operand(position):
    x = torch.randn(6)
    cond = x > 0
    s = torch.tensor(3.0, dtype=torch.float64)
    cpu_args = [cond, x, x]
    cpu_args[position] = s
    dev_args = [cond.to("neuron"), x.to("neuron"), x.to("neuron")]
    dev_args[position] = s
    expected = torch.where(*cpu_args)
    got = torch.where(*dev_args)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected)


def test_in_place_and_out_take_a_cpu_0dim_operand():
    x = torch.randn(6)
    xn = x.to("neuron")
    s = torch.tensor(-2.0)
    torch.testing.assert_close(xn.clone().copysign_(s).cpu(), x.clone().copysign_(s))
    out = torch.empty(6, device="neuron")
    torch.testing.assert_close(torch.atan2(xn, s, out=out).cpu(), torch.atan2(x, s))


@pytest.mark.parametrize("view", ["columns", "strided", "rows", "transposed"])
def test_functional_copy_of_a_gapped_view_gives_a_fresh_result(view):
    # aten.copy (functional, as AOT graphs call it) keeps `self`'s strides: for a slice with gaps
    # those address more storage than the result's elements (qwen3_5_moe under --compile).
    pick = {"columns": lambda t: t[:, :3], "strided": lambda t: t[:, ::2], "rows": lambda t: t[1:3],
            "transposed": lambda t: t.t()[:, :2]}[view]
    x = torch.randn(4, 6)
    src = torch.randn(pick(x).shape)
    expected = torch.ops.aten.copy.default(pick(x), src)
    got = torch.ops.aten.copy.default(pick(x.to("neuron")), src.to("neuron"))
    torch.testing.assert_close(got.cpu(), expected)
    torch.testing.assert_close((got * 2).sum(0).cpu(), (expected * 2).sum(0))
