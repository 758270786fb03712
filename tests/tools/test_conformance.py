"""The OpInfo conformance tool: its classifier on synthetic ops, and a fast slice of op_db."""
from __future__ import annotations

import functools
import json
import os
import warnings

import pytest
import torch

import torchneuron
from torchneuron.conformance import classify, report, run_conformance, runner
from torchneuron.eager import fallback

# isort: split
from torch.testing import make_tensor
from torch.testing._internal.opinfo.core import ErrorInput, OpInfo, SampleInput

# Common ops across the lowering families, most important first; the test runs the first
# CONFORMANCE_SLICE of them (default 40; 50 took 2-6 minutes on 2 busy cores) in float32, forward + backward.
SLICE = [
    "add", "mul", "sub", "div.no_rounding_mode", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos",
    "tanh", "sigmoid", "pow", "clamp", "where", "maximum", "minimum", "eq", "lt", "sum", "mean", "amax",
    "argmax", "var", "cumsum", "softmax", "log_softmax", "logsumexp", "matmul", "mm", "bmm", "addmm", "cat",
    "stack", "reshape", "view", "permute", "transpose", "expand", "squeeze", "unsqueeze", "flatten", "narrow",
    "select", "gather", "index_select", "masked_fill", "tril", "nn.functional.relu", "nn.functional.gelu",
    "nn.functional.silu", "nn.functional.linear", "nn.functional.layer_norm", "nn.functional.embedding",
    "nn.functional.cross_entropy", "nn.functional.mse_loss", "nn.functional.dropout", "zeros_like",
    "full_like", "arange", "scatter_add", "index_add", "sort", "topk", "prod", "std", "erf", "floor",
    "lerp", "addcmul", "repeat", "flip", "roll", "split", "chunk", "clone", "nn.functional.conv2d",
    "nn.functional.max_pool2d",
]

# Records of SLICE known to fail, by OpInfo name (variants included, "addmm.decomposed"), each with why:
# torchax's skiplist, strict. Every other record of the slice must pass, and one of these that passes
# fails the test until it leaves the list. All 80 ops (87 records, float32) passed on 2026-12-07.
EXPECTED_FAILURES: dict[str, str] = {}


def _opinfo(name, fn, supports_autograd=False, supports_forward_ad=False):
    def samples(op, device, dtype, requires_grad, **kwargs):
        yield SampleInput(make_tensor((3, 4), device=device, dtype=dtype, requires_grad=requires_grad))

    return OpInfo(name, op=fn, dtypes=(torch.float32,), sample_inputs_func=samples,
                  supports_autograd=supports_autograd, supports_forward_ad=supports_forward_ad,
                  supports_out=False)


@pytest.fixture
def counted_fallback(monkeypatch):
    monkeypatch.setattr(torchneuron.config, "FALLBACK", "cpu")


def test_pass_with_backward():
    record = runner.run_op_dtype(_opinfo("synthetic_exp", torch.exp, supports_autograd=True), torch.float32)
    assert record["status"] == "pass", record
    assert record["variants"]["backward"]["status"] == "pass"


def test_forward_mode_tangents_are_compared():
    record = runner.run_op_dtype(_opinfo("synthetic_exp", torch.exp, True, True), torch.float32)
    assert record["variants"]["forward_ad"]["status"] == "pass", record
    # equal values, but on neuron the tangent doubles: only the derivative checks can see it
    op = _opinfo("synthetic_tangent", lambda x: x + (x - x.detach()) * (x.device.type == "neuron"), True, True)
    record = runner.run_op_dtype(op, torch.float32)
    assert record["variants"]["forward"]["status"] == "pass"
    assert record["variants"]["forward_ad"]["status"] == "mismatch", record


def test_mismatch_reports_errors():
    op = _opinfo("synthetic_off_by_one", lambda x: x + (x.device.type == "neuron"))
    record = runner.run_op_dtype(op, torch.float32)
    assert record["status"] == "mismatch"
    forward = record["variants"]["forward"]
    assert forward["max_abs"] == pytest.approx(1.0) and forward["max_rel"] > 0


def test_error_names_exception():
    def fails_on_neuron(x):
        if x.device.type == "neuron":
            raise ValueError("no kernel\nsecond line")
        return x

    record = runner.run_op_dtype(_opinfo("synthetic_error", fails_on_neuron), torch.float32)
    assert record["status"] == "error"
    assert record["reason"] == "forward: ValueError: no kernel"


def test_fallback_lists_aten_ops(counted_fallback):
    def falls_back(x):  # goes through the real CPU fallback, as an op without a lowering would
        return fallback.dispatch(torch.ops.aten.sin.default, x) if x.device.type == "neuron" else x.sin()

    record = runner.run_op_dtype(_opinfo("synthetic_fallback", falls_back), torch.float32)
    assert record["status"] == "used-fallback"
    assert record["fallbacks"] == {"aten.sin.default": 1}


def test_cpu_failure_is_skipped():
    def fails_on_cpu(x):
        if x.device.type == "cpu":
            raise RuntimeError("not on cpu")
        return x

    record = runner.run_op_dtype(_opinfo("synthetic_cpu_fails", fails_on_cpu), torch.float32)
    assert record["status"] == "skipped" and record["reason"] == "cpu-fails"


def _opinfo_with(name, fn, samples, supports_autograd=False):
    def sample_inputs(op, device, dtype, requires_grad, **kwargs):
        yield from samples(device, dtype, requires_grad)

    return OpInfo(name, op=fn, dtypes=(torch.float32,), sample_inputs_func=sample_inputs,
                  supports_autograd=supports_autograd, supports_out=False)


def test_partial_views_keep_their_storage():
    # as_strided without a storage offset keeps the input's (5): the copy must keep the base storage
    def samples(device, dtype, requires_grad):
        base = make_tensor((20,), device=device, dtype=dtype)
        yield SampleInput(base[5:15].requires_grad_(requires_grad), (2, 2), (1, 2))
        yield SampleInput(base[5:15].requires_grad_(requires_grad), (2, 2), (1, 2), storage_offset=10)

    op = _opinfo_with("synthetic_as_strided", torch.as_strided, samples, supports_autograd=True)
    record = runner.run_op_dtype(op, torch.float32)
    assert record["status"] == "pass", record
    assert record["variants"]["backward"]["status"] == "pass"


def test_views_of_one_storage_alias_on_neuron():
    def write_then_read(x, y):
        x.add_(1)
        return y.clone()

    def samples(device, dtype, requires_grad):
        base = make_tensor((8,), device=device, dtype=dtype)
        yield SampleInput(base[0:4], args=(base[2:6],))

    record = runner.run_op_dtype(_opinfo_with("synthetic_alias", write_then_read, samples), torch.float32)
    assert record["status"] == "pass", record


def test_host_tensors_stay_on_cpu():
    # tensor_split requires CPU indices on every device; the OpInfo builds them without device=
    op = next(op for op in runner.load_op_db() if op.name == "tensor_split")
    record = runner.run_op_dtype(op, torch.float32, max_samples=4)
    assert record["status"] == "pass", record


def test_device_given_as_a_string_moves_to_neuron():
    def samples(device, dtype, requires_grad):
        yield SampleInput(make_tensor((3,), device=device, dtype=dtype, requires_grad=requires_grad),
                          args=("cpu", torch.float64))

    op = _opinfo_with("synthetic_to", torch.Tensor.to, samples, supports_autograd=True)
    record = runner.run_op_dtype(op, torch.float32)
    assert record["status"] == "pass", record
    assert record["variants"]["backward"]["status"] == "pass"


def test_outputs_compared_after_output_process_fn_grad():
    # as linalg.eigh's samples drop eigenvector signs with abs, which CPU and neuron may choose apart
    def sign_differs(x):
        return -x if x.device.type == "neuron" else x

    def samples(device, dtype, requires_grad):
        yield SampleInput(make_tensor((3, 4), device=device, dtype=dtype, requires_grad=requires_grad),
                          output_process_fn_grad=torch.abs)

    op = _opinfo_with("synthetic_sign", sign_differs, samples, supports_autograd=True)
    record = runner.run_op_dtype(op, torch.float32)
    assert record["status"] == "pass", record


def test_compare_handles_nan_inf_and_structure():
    e = torch.tensor([1.0, float("nan"), float("inf")])
    assert classify.compare(e.to("neuron"), e, 1e-5, 1e-5) is None
    problem = classify.compare(torch.tensor([1.0, 2.0, float("inf")]), e, 1e-5, 1e-5)
    assert problem["max_abs"] == float("inf")
    assert "structure" in classify.compare((e, e), e, 1e-5, 1e-5)["message"]
    assert "int64" in classify.compare(e.long(), e, 1e-5, 1e-5)["message"]


def test_tolerance_follows_each_output_dtype():
    # an int64 sample whose op returns float32 (sin, cosh) is compared with float32's tolerance, as
    # PyTorch's assertEqual does; integer outputs stay exact
    expected = torch.tensor([1.0, 4096.0])
    one_ulp = torch.nextafter(expected, torch.tensor(float("inf")))
    rtol, atol = classify.tolerance(_opinfo("synthetic", torch.sin), torch.int64)
    assert classify.compare(one_ulp, expected, rtol, atol) is None
    assert classify.compare(torch.tensor([2]), torch.tensor([1]), rtol, atol) is not None
    assert classify.compare(one_ulp.double(), expected.double(), rtol, atol) is not None


@pytest.mark.parametrize("worse", ["cpu", "neuron"])
def test_half_mismatch_judged_against_float64(worse):
    # a half-precision result that differs from CPU's passes only when it is at least as close to
    # the float64 result as CPU's
    def third(x):
        if x.device.type == worse and x.dtype == torch.float16:
            return (x.float() / 3 * (1 + 2 ** -8)).half()
        return x / 3

    def samples(op, device, dtype, requires_grad, **kwargs):
        yield SampleInput(make_tensor((3, 4), device=device, dtype=dtype, low=1, high=4, requires_grad=requires_grad))

    op = OpInfo("synthetic_third", op=third, dtypes=(torch.float16,), sample_inputs_func=samples, supports_out=False)
    record = runner.run_op_dtype(op, torch.float16)
    forward = record["variants"]["forward"]
    if worse == "cpu":
        assert record["status"] == "pass" and forward["float64_judged"] == 1, record
    else:
        assert record["status"] == "mismatch" and forward["status"] == "mismatch", record


@pytest.mark.parametrize("worse", ["cpu", "neuron"])
def test_half_tangent_mismatch_judged_against_float64(worse):
    # the same rule for forward-mode AD: values agree, the tangent is 3% off on one side in float16
    def third(x):
        off = (x - x.detach()) * (2 ** -5 / 3) if x.device.type == worse and x.dtype == torch.float16 else 0
        return x / 3 + off

    def samples(op, device, dtype, requires_grad, **kwargs):
        yield SampleInput(make_tensor((3, 4), device=device, dtype=dtype, low=1, high=4, requires_grad=requires_grad))

    op = OpInfo("synthetic_third_tangent", op=third, dtypes=(torch.float16,), sample_inputs_func=samples,
                supports_out=False, supports_forward_ad=True)
    forward_ad = runner.run_op_dtype(op, torch.float16)["variants"]["forward_ad"]
    if worse == "cpu":
        assert forward_ad["status"] == "pass" and forward_ad["float64_judged"] == 1, forward_ad
    else:
        assert forward_ad["status"] == "mismatch", forward_ad


def test_arguments_pytorch_keeps_on_cpu_stay_there():
    # tensor_split takes its tensor of split points on CPU only, as PyTorch's device tests pass it
    op = next(o for o in runner.load_op_db() if o.name == "tensor_split")
    record = runner.run_op_dtype(op, torch.float32, max_samples=4)
    assert record["status"] == "pass", record


def _erring_opinfo(name, fn, error_regex="must be positive", error_type=RuntimeError, **kwargs):
    """An OpInfo whose one error input is a tensor of negatives, which `fn` should reject."""
    def error_inputs(op, device, **kwargs):
        sample = SampleInput(make_tensor((3,), device=device, dtype=torch.float32, low=-2, high=-1))
        yield ErrorInput(sample, error_type=error_type, error_regex=error_regex)

    return OpInfo(name, op=fn, dtypes=(torch.float32,), sample_inputs_func=lambda *a, **k: iter(()),
                  error_inputs_func=error_inputs, supports_out=False, **kwargs)


def _rejects_negatives(neuron_error=None, message="input must be positive"):
    """Raises RuntimeError(message) on CPU for negative input; on neuron raises neuron_error (None:
    raises nothing)."""
    def op(x):
        if (x < 0).any():
            if x.device.type == "cpu":
                raise RuntimeError(message)
            if neuron_error is not None:
                raise neuron_error
        return x.clone()

    return op


def _errors_of(op) -> dict:
    return runner.run_op_dtype(op, torch.float32, variants=("errors",))["variants"]["errors"]


def test_errors_pass_when_neuron_raises_what_cpu_raises():
    op = _erring_opinfo("synthetic_rejects", _rejects_negatives(RuntimeError("input must be positive, got -1")))
    errors = _errors_of(op)
    assert errors["status"] == "pass" and errors["samples"] == 1, errors
    # a subclass of CPU's type is the same error, more precisely (NotImplementedError is a RuntimeError)
    op = _erring_opinfo("synthetic_rejects_subclass", _rejects_negatives(NotImplementedError("must be positive")))
    assert _errors_of(op)["status"] == "pass"


@pytest.mark.parametrize("neuron_error, kind", [
    (None, "no-error"),
    (ValueError("input must be positive"), "other-type"),
    (RuntimeError("bad input"), "other-message"),
])
def test_errors_mismatch_names_what_neuron_did(neuron_error, kind):
    record = runner.run_op_dtype(_erring_opinfo("synthetic_rejects", _rejects_negatives(neuron_error)),
                                 torch.float32, variants=("errors",))
    errors = record["variants"]["errors"]
    assert record["status"] == "mismatch" and errors["status"] == "mismatch", record
    assert errors["kind"] == kind and errors["sample"] == "error input 0"
    assert record["reason"].startswith("errors: error input 0: ")


def test_errors_compare_cpu_message_when_regex_is_stale():
    # CPU's message does not match the OpInfo's regex: neuron's is held to CPU's first line instead
    stale = "an old wording"
    same = _erring_opinfo("synthetic_stale", _rejects_negatives(RuntimeError("input must be positive")), stale)
    assert _errors_of(same)["status"] == "pass"
    other = _erring_opinfo("synthetic_stale", _rejects_negatives(RuntimeError("input must be positive!")), stale)
    assert _errors_of(other)["kind"] == "other-message"


def test_errors_skip_inputs_cpu_accepts():
    op = _erring_opinfo("synthetic_accepts", lambda x: x.clone())
    errors = _errors_of(op)
    assert errors["status"] == "skipped" and errors["cpu_fails"] == 1, errors


def _copy_out(x, *, out=None, check_device=True):
    """A copy with out= as ATen treats it: dtype and device checked, a wrong shape resized with a warning."""
    if out is None:
        return x.clone()
    if out.dtype != x.dtype:
        raise RuntimeError(f"result type {x.dtype} can't be cast to the desired output type {out.dtype}")
    if check_device and out.device != x.device:
        raise RuntimeError(f"Expected out tensor on device {x.device}, but got {out.device}")
    if out.numel() and out.shape != x.shape:
        warnings.warn(f"An output with one or more elements was resized since it had shape {list(out.shape)}")
    return out.resize_(x.shape).copy_(x)


def _out_opinfo(name, fn):
    def samples(op, device, dtype, requires_grad, **kwargs):
        yield SampleInput(make_tensor((3, 4), device=device, dtype=dtype))

    return OpInfo(name, op=fn, dtypes=(torch.float32,), sample_inputs_func=samples, supports_autograd=False)


def test_errors_check_wrong_out_tensors():
    errors = _errors_of(_out_opinfo("synthetic_copy", _copy_out))
    assert errors["status"] == "pass" and errors["samples"] == 3, errors
    # out= tensors on CPU accepted for a neuron op: CUDA would raise
    errors = _errors_of(_out_opinfo("synthetic_copy_any_device", functools.partial(_copy_out, check_device=False)))
    assert errors["status"] == "mismatch" and errors["sample"] == "out= on CPU" and errors["kind"] == "no-error"


def test_errors_report_row_and_cases(tmp_path):
    record = runner.run_op_dtype(_erring_opinfo("synthetic_rejects", _rejects_negatives(None)), torch.float32,
                                 variants=("errors",))
    summary = report.write(tmp_path, [record], {"torch": "", "jax": "", "seconds": 0, "command": "",
                                                "args": {"jobs": 1}})
    assert summary["errors"] == {"pass": 0, "ran": 1, "rate": 0.0}
    assert summary["error_cases"]["kinds"] == {"no-error": 1}
    text = (tmp_path / "conformance.md").read_text()
    assert "| errors | 0.0% (0/1) |" in text
    assert "| synthetic_rejects | float32 | error input 0 | no-error |" in text


def test_fast_slice(tmp_path):
    size = int(os.environ.get("CONFORMANCE_SLICE", "40"))
    summary = run_conformance(SLICE[:size], ["float32"], jobs=2, timeout=240, max_samples=4, out=tmp_path,
                              quiet=True)
    data = json.loads((tmp_path / "conformance.json").read_text())
    assert (tmp_path / "conformance.md").read_text().startswith("# torchneuron OpInfo conformance")
    ran = {r["op"] for r in data["records"] if r["status"] != "skipped"}
    failing = {r["op"]: f"{r['status']}: {r['reason']}" for r in data["records"] if r["status"] not in ("pass", "skipped")}
    unexpected = {op: why for op, why in failing.items() if op not in EXPECTED_FAILURES}
    assert not unexpected, unexpected
    passing = sorted(op for op in EXPECTED_FAILURES if op in ran and op not in failing)
    assert not passing, f"expected to fail, but pass: take them off EXPECTED_FAILURES: {passing}"
    assert summary["fallback_ops"] == {}, summary["fallback_ops"]
    assert summary["backward"]["ran"] > 0


def test_report_summary():
    records = [{"op": "a", "family": "f", "dtype": "float32", "status": s, "reason": "", "variants": {},
                "fallbacks": {}} for s in ("pass", "pass", "mismatch", "skipped")]
    summary = report.summarize(records)
    assert summary["overall"] == {"pass": 2, "ran": 3, "rate": 2 / 3}


def test_merged_records_keep_the_latest_per_op_and_dtype(tmp_path):
    from torchneuron.conformance.cli import merge_records

    def record(op, dtype, status):
        return json.dumps({"op": op, "dtype": dtype, "status": status})

    first, rerun = tmp_path / "first.jsonl", tmp_path / "rerun.jsonl"
    first.write_text("\n".join([record("abs", "float32", "mismatch"), record("abs", "int64", "pass"),
                                record("cos", "float32", "error")]) + "\n")
    rerun.write_text(record("abs", "float32", "pass") + "\n")
    merged = {(r["op"], r["dtype"]): r["status"] for r in merge_records([first, rerun])}
    assert merged == {("abs", "float32"): "pass", ("abs", "int64"): "pass", ("cos", "float32"): "error"}
