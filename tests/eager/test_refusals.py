"""What CPU's kernels refuse after their meta functions accepted a call, neuron refuses at the call.

Each op runs on CPU and on neuron for every dtype family; where CPU raises, neuron raises the
same exception type (for the rules in the kernels' shared code, the same message), at the call:
in fused eager, before anything is recorded. Where CPU runs, neuron runs and agrees.
"""
import pytest
import torch

DTYPES = [torch.bool, torch.uint8, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.complex64]


def _values(dtype, device):
    # no zero among the integers: integer division by zero raises on CPU only (a value check,
    # which CUDA does not make)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.tensor([0.5, -1.0, 2.0, 1.5], device=device).to(dtype)
    return torch.tensor([1, 2, 3, 1], device=device).to(dtype)


UNARY = {
    "abs": torch.abs, "floor": torch.floor, "round": torch.round, "frac": torch.frac, "erf": torch.erf,
    "bitwise_not": torch.bitwise_not, "sign": torch.sign, "signbit": torch.signbit, "logit": torch.logit,
    "relu": torch.relu, "clamp_min": lambda x: x.clamp(min=0), "argmax": torch.argmax, "max": torch.max,
    "max_dim": lambda x: torch.max(x, 0), "amax": torch.amax, "median": torch.median,
    "cummax": lambda x: torch.cummax(x, 0), "std": torch.std, "var_mean": torch.var_mean,
    "sort": torch.sort, "topk": lambda x: torch.topk(x, 1), "softmax": lambda x: torch.softmax(x, 0),
    "abs_": lambda x: x.abs_(), "floor_out": lambda x: torch.floor(x, out=torch.empty_like(x)),
}
BINARY = {
    "sub": torch.sub, "rsub_scalar": lambda x, y: torch.rsub(x, 1), "sub_python_bool": lambda x, y: x - True,
    "maximum": torch.maximum, "max_other": torch.max, "fmin": torch.fmin, "lt": torch.lt,
    "remainder": torch.remainder, "floor_divide": torch.floor_divide, "pow": torch.pow,
    "atan2": torch.atan2, "hypot": torch.hypot, "bitwise_and": torch.bitwise_and,
    "lshift": torch.bitwise_left_shift, "gcd": torch.gcd, "logaddexp": torch.logaddexp,
    "lerp": lambda x, y: torch.lerp(x, y, 0.5), "dot": torch.dot,
}
CASES = [(name, fn, 1) for name, fn in UNARY.items()] + [(name, fn, 2) for name, fn in BINARY.items()]


def _outcome(fn, arity, dtype, device):
    x = _values(dtype, device)
    try:
        result = fn(x) if arity == 1 else fn(x, _values(dtype, device).flip(0))
    except (RuntimeError, NotImplementedError) as e:
        return type(e), str(e).split("\n")[0]
    results = result if isinstance(result, tuple) else (result,)
    return None, [r.cpu() for r in results]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name, fn, arity", CASES, ids=[c[0] for c in CASES])
def test_neuron_refuses_what_cpu_refuses_and_runs_the_rest(name, fn, arity, dtype):
    cpu_error, cpu = _outcome(fn, arity, dtype, "cpu")
    neuron_error, neuron = _outcome(fn, arity, dtype, "neuron")
    if cpu_error is None:
        assert neuron_error is None, neuron
        for c, n in zip(cpu, neuron):
            torch.testing.assert_close(n, c, rtol=1e-2, atol=1e-2, equal_nan=True)
        return
    assert neuron_error is not None, (cpu, neuron)
    # the same kind: NotImplementedError (a dtype refused) or a RuntimeError that is not one
    assert issubclass(neuron_error, NotImplementedError) == issubclass(cpu_error, NotImplementedError), (cpu, neuron)
    assert issubclass(neuron_error, RuntimeError)
    if "not implemented for '" in cpu:  # a refused dtype: the op's name without CPU's kernel suffix
        assert neuron.endswith(cpu[cpu.index(" not implemented for '"):])
    else:
        assert neuron == cpu.replace("on CPU", "on neuron")


def _kthvalue_into(a, values_of):
    values = values_of(a)
    return torch.kthvalue(a, 1, 0, keepdim=values.dim() == a.dim(),
                          out=(values, torch.empty(values.shape, dtype=torch.long, device=a.device)))[0]


ARGUMENT_RULES = {
    "index_add other shapes": lambda d: torch.index_add(torch.ones(3, 2, device=d), 0, torch.tensor([0, 1], device=d),
                                                        torch.ones(2, device=d)),
    "index_add same shapes": lambda d: torch.ones(3, 2, device=d).index_add_(-1, torch.tensor([0, 1], device=d),
                                                                             torch.ones(3, 2, device=d)),
    "multinomial of integers": lambda d: torch.multinomial(torch.ones(3, dtype=torch.long, device=d), 1),
    "multinomial into doubles": lambda d: torch.multinomial(torch.ones(3, device=d), 1,
                                                            out=torch.empty(1, dtype=torch.double, device=d)),
    "multinomial of no samples": lambda d: torch.multinomial(torch.ones(3, device=d), 0),
    "masked_scatter byte mask": lambda d: torch.ones(3, device=d).masked_scatter(
        torch.ones(3, dtype=torch.uint8, device=d), torch.ones(3, device=d)),
    "normal_ of integers": lambda d: torch.ones(3, dtype=torch.long, device=d).normal_(),
    "normal into integers": lambda d: torch.normal(torch.ones(3, device=d), torch.ones(3, device=d),
                                                   out=torch.empty(3, dtype=torch.long, device=d)),
    "conv3d negative padding": lambda d: torch.nn.functional.conv3d(
        torch.ones(1, 1, 3, 3, 3, device=d), torch.ones(1, 1, 1, 1, 1, device=d), padding=-1),
    "conv2d zero stride": lambda d: torch.nn.functional.conv2d(torch.ones(1, 1, 3, 3, device=d),
                                                               torch.ones(1, 1, 1, 1, device=d), stride=0),
    "conv2d zero dilation": lambda d: torch.nn.functional.conv2d(torch.ones(1, 1, 3, 3, device=d),
                                                                 torch.ones(1, 1, 1, 1, device=d), dilation=0),
    "complex of int": lambda d: torch.complex(torch.ones(2, device=d), torch.ones(2, dtype=torch.int32, device=d)),
    "complex of two dtypes": lambda d: torch.complex(torch.ones(2, device=d), torch.ones(2, dtype=torch.float64, device=d)),
    "complex of doubles": lambda d: torch.complex(torch.ones(2, dtype=torch.float64, device=d),
                                                  torch.ones(2, dtype=torch.float64, device=d)),
    "amax over an empty dim": lambda d: torch.amax(torch.ones(2, 0, device=d), 1),
    "amin over empty dims": lambda d: torch.amin(torch.ones(2, 0, device=d), (0, -1)),
    "amax of an empty tensor": lambda d: torch.amax(torch.ones(2, 0, device=d)),
    "amax over a full dim": lambda d: torch.amax(torch.ones(2, 0, device=d), 0),
    "aminmax over an empty dim": lambda d: torch.aminmax(torch.ones(2, 0, device=d), dim=1)[0],
    "aminmax of an empty tensor": lambda d: torch.aminmax(torch.ones(2, 0, device=d))[0],
    "max over an empty dim": lambda d: torch.max(torch.ones(0, 3, device=d), -2, keepdim=True)[0],
    "min of an empty tensor": lambda d: torch.min(torch.ones(0, 3, device=d)),
    "max over a full dim": lambda d: torch.max(torch.ones(0, 3, device=d), 1)[1],
    "max into out over an empty dim": lambda d: torch.max(torch.ones(0, 3, device=d), 0, out=(
        torch.empty(0, device=d), torch.empty(0, dtype=torch.long, device=d)))[0],
    "argmax over an empty dim": lambda d: torch.argmax(torch.ones(0, 3, device=d), 0),
    "argmin of an empty tensor": lambda d: torch.argmin(torch.ones(0, 3, device=d)),
    "argmin over a full dim": lambda d: torch.argmin(torch.ones(0, 3, device=d), 1),
    "median over an empty dim": lambda d: torch.median(torch.ones(0, 3, device=d), 0)[0],
    "nanmedian over an empty dim": lambda d: torch.nanmedian(torch.ones(0, 3, device=d), -2)[1],
    "median over a full dim": lambda d: torch.median(torch.ones(0, 3, device=d), 1)[0],
    "kthvalue over an empty dim": lambda d: torch.kthvalue(torch.ones(3, 0, device=d), 1)[0],
    "kthvalue over a full dim": lambda d: torch.kthvalue(torch.ones(0, 3, device=d), 2, 1)[0],
    "mode over an empty dim": lambda d: torch.mode(torch.ones(0, device=d))[0],
    "median of an empty bool tensor": lambda d: torch.median(torch.ones(0, dtype=torch.bool, device=d)),
    "nanmedian of an empty complex tensor": lambda d: torch.nanmedian(torch.ones(0, dtype=torch.complex64, device=d)),
    "median of bools over a dim": lambda d: torch.median(torch.ones(2, dtype=torch.bool, device=d), 0)[0],
    "all into floats": lambda d: torch.all(torch.ones(2, 3, device=d), out=torch.empty(0, device=d)),
    "any into longs": lambda d: torch.any(torch.ones(2, 3, device=d), 1, out=torch.empty(0, dtype=torch.long, device=d)),
    "all into bytes": lambda d: torch.all(torch.ones(2, 3, device=d), 0, out=torch.empty(0, dtype=torch.uint8, device=d)),
    "any of bytes into bytes": lambda d: torch.any(torch.ones(2, 3, dtype=torch.uint8, device=d),
                                                   out=torch.empty(0, dtype=torch.uint8, device=d)),
    "any of bytes into bools": lambda d: torch.any(torch.tensor([[1, 0], [0, 0]], dtype=torch.uint8, device=d), 0,
                                                   out=torch.empty(0, dtype=torch.bool, device=d)),
    "all of bytes over dims into bools": lambda d: torch.all(torch.tensor([[1, 2], [0, 3]], dtype=torch.uint8, device=d),
                                                             (0, 1), keepdim=True,
                                                             out=torch.empty(0, dtype=torch.bool, device=d)),
    "mode of complex": lambda d: torch.mode(torch.ones(2, 3, dtype=torch.complex64, device=d))[0],
    "mode into float indices": lambda d: torch.mode(torch.ones(2, 3, device=d), out=(
        torch.empty(0, device=d), torch.empty(0, device=d)))[0],
    "mode into double values": lambda d: torch.mode(torch.ones(2, 3, device=d), out=(
        torch.empty(0, dtype=torch.double, device=d), torch.empty(0, dtype=torch.long, device=d)))[0],
    "bincount of floats": lambda d: torch.bincount(torch.ones(3, device=d)),
    "bincount of bools": lambda d: torch.bincount(torch.ones(3, dtype=torch.bool, device=d)),
    "bincount of two dims": lambda d: torch.bincount(torch.ones(2, 3, dtype=torch.long, device=d)),
    "bincount weights of another length": lambda d: torch.bincount(torch.tensor([1, 2], device=d), torch.ones(3, device=d)),
    "bincount weights of two dims": lambda d: torch.bincount(torch.tensor([1, 2], device=d), torch.ones(2, 1, device=d)),
    "bincount negative minlength": lambda d: torch.bincount(torch.tensor([1, 2], device=d), minlength=-1),
    "bincount of nothing": lambda d: torch.bincount(torch.tensor([], dtype=torch.long, device=d), minlength=3),
    "aminmax of complex": lambda d: torch.aminmax(torch.ones(3, dtype=torch.complex64, device=d))[0],
    "aminmax into doubles": lambda d: torch.aminmax(torch.ones(3, device=d), out=(
        torch.empty(0, dtype=torch.double, device=d), torch.empty(0, device=d)))[0],
    "kthvalue into its input": lambda d: _kthvalue_into(torch.ones(1, 3, device=d), lambda a: a),
    "kthvalue into its input's row": lambda d: _kthvalue_into(torch.ones(2, 3, device=d), lambda a: a[0]),
    "kthvalue into another tensor": lambda d: torch.kthvalue(torch.ones(2, 3, device=d), 1, 0, out=(
        torch.empty(3, device=d), torch.empty(3, dtype=torch.long, device=d)))[0],
    "kthvalue into long values": lambda d: torch.kthvalue(torch.ones(2, 3, device=d), 1, out=(
        torch.empty(0, dtype=torch.long, device=d), torch.empty(0, dtype=torch.long, device=d)))[0],
    "kthvalue into float indices": lambda d: torch.kthvalue(torch.ones(2, 3, device=d), 1, out=(
        torch.empty(0, device=d), torch.empty(0, device=d)))[0],
    "std into longs": lambda d: torch.std(torch.ones(2, 3, device=d), 0, out=torch.empty(0, dtype=torch.long, device=d)),
    "var into doubles": lambda d: torch.var(torch.ones(2, 3, device=d), out=torch.empty(0, dtype=torch.double, device=d)),
    "frexp into long mantissas": lambda d: torch.frexp(torch.ones(3, device=d), out=(
        torch.empty(0, dtype=torch.long, device=d), torch.empty(0, dtype=torch.int32, device=d)))[0],
    "frexp into long exponents": lambda d: torch.frexp(torch.ones(3, device=d), out=(
        torch.empty(0, device=d), torch.empty(0, dtype=torch.long, device=d)))[0],
    "index_add into bools": lambda d: torch.index_add(torch.ones(2, 3, dtype=torch.long, device=d), 0,
                                                      torch.tensor([0], device=d), torch.ones(1, 3, dtype=torch.long, device=d),
                                                      out=torch.empty(0, dtype=torch.bool, device=d)),
    "aminmax of longs into bools": lambda d: torch.aminmax(torch.ones(3, dtype=torch.long, device=d), out=(
        torch.empty(0, dtype=torch.bool, device=d), torch.empty(0, dtype=torch.bool, device=d)))[0],
    "embedding of a 0-d weight": lambda d: torch.nn.functional.embedding(torch.tensor([0], device=d),
                                                                         torch.ones((), device=d)),
}


@pytest.mark.filterwarnings("ignore:masked_scatter_ received a mask with dtype torch.uint8")
@pytest.mark.parametrize("name", ARGUMENT_RULES)
def test_argument_rules_of_single_ops_match_cpu(name):
    outcomes = []
    for device in ("cpu", "neuron"):
        try:
            result = ARGUMENT_RULES[name](device)
            outcomes.append((None, result.cpu()))
        except (RuntimeError, NotImplementedError, IndexError) as e:
            outcomes.append((type(e), str(e).split("\n")[0]))
    (cpu_error, cpu), (neuron_error, neuron) = outcomes
    if cpu_error is None:
        assert neuron_error is None, neuron
        torch.testing.assert_close(neuron, cpu, equal_nan=True)
    elif issubclass(cpu_error, NotImplementedError):
        assert neuron_error is not None and issubclass(neuron_error, NotImplementedError), neuron
        assert neuron.endswith(cpu[cpu.index(" not implemented for '"):])
    else:
        assert (neuron_error, neuron) == (cpu_error, cpu)


def test_a_refused_call_raises_at_the_call_in_fused_eager():
    x = torch.ones(3, dtype=torch.complex64, device="neuron")
    with torchneuron_fused():
        y = x * 2  # recorded, pending
        with pytest.raises(RuntimeError, match="argmax\\(\\): does not support complex input"):
            torch.argmax(y)
        torch.testing.assert_close(y.cpu(), torch.full((3,), 2, dtype=torch.complex64))


def torchneuron_fused():
    import torchneuron
    return torchneuron.eager_mode("fused")


STORED_PLAN = """
import json, sys, torch, torchneuron
from torchneuron import lowering
if sys.argv[1] == "unchecked":  # a process that stores the plan without the rule
    lowering.load_all()
    for record in lowering.RECORDS.values():
        record.refusals.clear()
x = torch.ones(3, 2, device="neuron")
try:
    torch.index_add(x, 0, torch.tensor([0, 1], device="neuron"), torch.ones(2, device="neuron"))
    print(json.dumps({"raised": None}))
except RuntimeError as e:
    print(json.dumps({"raised": str(e)}))
"""


def test_a_plan_read_back_from_the_persistent_cache_is_still_checked(tmp_path):
    from torchneuron.testing.processes import runs_sharing_a_cache
    unchecked, checked = runs_sharing_a_cache(STORED_PLAN, tmp_path, argvs=(("unchecked",), ("checked",)))
    assert unchecked["raised"] is None
    assert checked["raised"].startswith("source tensor shape must match self tensor shape")
