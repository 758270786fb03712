"""Comparing neuron results with CPU results, and classifying an op x dtype from its variants."""
from __future__ import annotations

import math
import re

import torch
from torch.utils._pytree import tree_flatten

# (rtol, atol) per dtype of a compared tensor: XLA's kernels differ from ATen's in rounding and summation
# order, so these are looser than assert_close's same-device defaults. As in PyTorch's assertEqual, a
# tensor gets its own dtype's default (sin of an int64 tensor is compared as float32), widened by the
# toleranceOverride the OpInfo declares for the sample dtype.
DEFAULT_TOLERANCE = {
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-3),
    torch.complex64: (1e-5, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
# Sample dtypes whose mismatches are judged against a float64 reference (closer_to_float64).
LOW_PRECISION = (torch.float16, torch.bfloat16)
# Variant statuses, worst first: a record takes the worst status among its variants.
SEVERITY = ("error", "mismatch", "used-fallback", "pass", "skipped")


def tolerance(op, dtype) -> tuple[float, float]:
    """The toleranceOverride the OpInfo declares for sample dtype, (0, 0) without one: the floor
    that `compare` widens each tensor's own dtype default to."""
    from torch.testing._internal.common_device_type import toleranceOverride

    rtol, atol = 0.0, 0.0
    for info in getattr(op, "decorators", ()):
        for dec in getattr(info, "decorators", [info]):
            if isinstance(dec, toleranceOverride) and dtype in dec.d:
                rtol, atol = max(rtol, dec.d[dtype].rtol), max(atol, dec.d[dtype].atol)
    return rtol, atol


def _errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """Max abs and rel error; NaN where the other side is not NaN counts as infinite."""
    wide = torch.complex128 if expected.is_complex() or actual.is_complex() else torch.float64
    a, e = actual.detach().cpu().to(wide), expected.detach().to(wide)
    diff = (a - e).abs()
    both_nan = a.isnan() & e.isnan()
    same = (a == e) | both_nan  # equal infinities give inf - inf = nan
    diff = torch.where(same, torch.zeros_like(diff), torch.nan_to_num(diff, nan=math.inf))
    if diff.numel() == 0:
        return 0.0, 0.0
    rel = diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
    return float(diff.max()), float(torch.where(same, torch.zeros_like(rel), rel).max())


def compare(actual, expected, rtol: float = 0.0, atol: float = 0.0, shape_only: bool = False) -> dict | None:
    """None when actual (neuron) matches expected (CPU), else a mismatch detail. Each tensor is held to
    its dtype's DEFAULT_TOLERANCE, Python floats to float64's, widened to at least (rtol, atol)."""
    a_flat, a_spec = tree_flatten(actual)
    e_flat, e_spec = tree_flatten(expected)
    if len(a_flat) != len(e_flat):
        return {"message": f"output structure {a_spec} != {e_spec}"}
    for i, (a, e) in enumerate(zip(a_flat, e_flat)):
        problem = _compare_leaf(a, e, rtol, atol, shape_only)
        if problem:
            problem["message"] = f"output {i}: {problem['message']}"
            return problem
    return None


def _compare_leaf(a, e, rtol, atol, shape_only) -> dict | None:
    if isinstance(e, torch.Tensor):
        if not isinstance(a, torch.Tensor):
            return {"message": f"got {type(a).__name__}, expected a tensor"}
        if a.shape != e.shape or a.dtype != e.dtype:
            return {"message": f"got {a.dtype}{list(a.shape)}, expected {e.dtype}{list(e.shape)}"}
        if shape_only or e.layout != torch.strided:
            return None
        rtol, atol = _widened(e.dtype, rtol, atol)
        try:
            torch.testing.assert_close(a.detach().cpu(), e.detach(), rtol=rtol, atol=atol, equal_nan=True,
                                       check_device=False, check_stride=False)
        except AssertionError:
            max_abs, max_rel = _errors(a, e)
            return {"message": f"max abs {max_abs:.3g}, max rel {max_rel:.3g} (rtol {rtol:g}, atol {atol:g})",
                    "max_abs": max_abs, "max_rel": max_rel}
        return None
    if isinstance(e, float) and isinstance(a, float) and not shape_only:
        rtol, atol = _widened(torch.float64, rtol, atol)
        if math.isclose(a, e, rel_tol=rtol, abs_tol=atol) or (math.isnan(a) and math.isnan(e)):
            return None
        return {"message": f"got {a!r}, expected {e!r}", "max_abs": abs(a - e)}
    if shape_only or a == e:
        return None
    return {"message": f"got {a!r}, expected {e!r}"}


def closer_to_float64(actual, expected, reference, rtol: float = 0.0, atol: float = 0.0) -> bool:
    """Whether neuron's result (actual) is at least as close to the float64 result (reference) as
    CPU's (expected) wherever the two differ: ATen computes some half-precision kernels in half and
    XLA in float32, or the reverse, so neither matches the other bit for bit. Each differing
    half-precision output must have an RMSE against the reference no larger than CPU's (PyTorch's
    accuracy check for compiled half-precision results, torch._dynamo.utils.same, allows 2-3 times
    CPU's); every other output must match as `compare` requires."""
    a_flat, e_flat, r_flat = (tree_flatten(x)[0] for x in (actual, expected, reference))
    if not len(a_flat) == len(e_flat) == len(r_flat):
        return False
    for a, e, r in zip(a_flat, e_flat, r_flat):
        if _compare_leaf(a, e, rtol, atol, False) is None:
            continue
        if not (isinstance(e, torch.Tensor) and e.dtype in LOW_PRECISION and isinstance(r, torch.Tensor)
                and r.dtype == torch.float64 and a.shape == e.shape == r.shape and a.dtype == e.dtype):
            return False
        if not _rmse(a, r) <= _rmse(e, r):
            return False
    return True


def _rmse(x: torch.Tensor, reference: torch.Tensor) -> float:
    """Root mean square error against reference; a NaN or infinity the reference lacks is infinite."""
    x, r = x.detach().cpu().double(), reference.detach().double()
    same = (x == r) | (x.isnan() & r.isnan())
    diff = torch.where(same, torch.zeros_like(x), torch.nan_to_num(x - r, nan=math.inf))
    return float(diff.square().mean().sqrt()) if diff.numel() else 0.0


def _widened(dtype, rtol: float, atol: float) -> tuple[float, float]:
    default_rtol, default_atol = DEFAULT_TOLERANCE.get(dtype, (0.0, 0.0))
    return max(rtol, default_rtol), max(atol, default_atol)


def error_detail(exc: BaseException) -> dict:
    lines = str(exc).strip().splitlines()
    return {"type": type(exc).__name__, "message": lines[0][:300] if lines else ""}


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def _device_neutral(message: str) -> str:
    """The message with neuron's device names written as CPU's, so the same error reads the same."""
    return re.sub(r"\bneuron(:\d+)?", "cpu", message)


def compare_errors(actual: BaseException | None, expected: BaseException, regex=None) -> dict | None:
    """None when neuron's exception (actual; None: it raised nothing) matches CPU's (expected), else
    a mismatch detail with its kind: 'no-error', 'other-type' or 'other-message'. The type must be
    CPU's or a subclass. The message must match `regex` (an ErrorInput's error_regex) when CPU's
    does; otherwise its first line must be CPU's, device names aside."""
    cpu = f"{type(expected).__name__}: {_first_line(expected)}"
    if actual is None:
        return {"kind": "no-error", "message": f"no error; CPU raised {cpu}"[:300]}
    neuron = f"{type(actual).__name__}: {_first_line(actual)}"
    if not isinstance(actual, type(expected)):
        return {"kind": "other-type", "message": f"raised {neuron}; CPU raised {cpu}"[:300]}
    if regex is not None and re.search(regex, str(expected)):
        if re.search(regex, str(actual)):
            return None
        pattern = getattr(regex, "pattern", regex)
        return {"kind": "other-message", "message": f"raised {neuron}; not matching {pattern!r}"[:300]}
    if _device_neutral(_first_line(actual)) == _device_neutral(_first_line(expected)):
        return None
    return {"kind": "other-message", "message": f"raised {neuron}; CPU raised {cpu}"[:300]}


def classify(variants: dict[str, dict], fallbacks: dict[str, int]) -> tuple[str, str]:
    """(status, reason) of an op x dtype from its variants' results and the CPU fallbacks it caused."""
    ran = {k: v for k, v in variants.items() if v["status"] != "skipped"}
    if not ran:
        first = variants.get("forward") or next(iter(variants.values()), {})
        return "skipped", first.get("reason", "no variant ran")
    for status in ("error", "mismatch"):
        for name, v in ran.items():
            if v["status"] == status:
                return status, f"{name}: {v['reason']}"
    if fallbacks:
        return "used-fallback", "CPU fallback: " + ", ".join(sorted(fallbacks))
    return "pass", ""
