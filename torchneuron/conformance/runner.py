"""Running one OpInfo for one dtype on neuron and on CPU (inside a worker process)."""
from __future__ import annotations

import itertools
import time
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_map

from . import classify, families, skips
from .report import DEFAULT_VARIANTS


def load_op_db():
    import torchneuron  # noqa: F401  (registers neuron before torch.testing._internal is imported)

    # isort: split
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def full_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _fallback_counts() -> dict[str, int]:
    from torchneuron.eager import fallback

    return dict(fallback.STATS)


class _Mover:
    """Copies a sample to neuron, keeping aliasing (one copy per CPU tensor) so gradients line up.

    A tensor is copied as its whole storage plus the same sizes, strides and storage offset (not with
    `.to()`, which would make a partial view a fresh contiguous tensor), so ops that read the geometry
    (as_strided on a view with an offset, expanded inputs) see what CPU sees; tensors that share a CPU
    storage share one neuron storage.
    """

    def __init__(self, host: list[torch.Tensor] = ()):
        self.copies: dict[int, torch.Tensor] = {id(t): t.detach().clone() for t in host}
        self.storages: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def __call__(self, value):
        return tree_map(self._move, value)

    def _copy(self, v: torch.Tensor) -> torch.Tensor:
        if v.device.type == "meta":  # as an error input puts it, on every device (gradient's)
            return v
        plain = v.layout == torch.strided and v.device.type == "cpu" and not (v.is_conj() or v.is_neg())
        if not plain or v.untyped_storage().nbytes() == 0:
            return v.detach().to("neuron")
        storage = v.untyped_storage()
        key = (storage.data_ptr(), v.dtype)
        if key not in self.storages:
            flat = torch.empty(0, dtype=v.dtype).set_(storage, 0, (storage.nbytes() // v.element_size(),))
            self.storages[key] = flat.to("neuron")
        device_storage = self.storages[key].untyped_storage()
        return torch.empty(0, dtype=v.dtype, device="neuron").set_(
            device_storage, v.storage_offset(), v.shape, v.stride())

    def _move(self, v):
        if isinstance(v, torch.Tensor):
            if id(v) not in self.copies:
                copy = self._copy(v)
                self.copies[id(v)] = copy.requires_grad_() if v.requires_grad else copy
            return self.copies[id(v)]
        if isinstance(v, torch.device) and v.type == "cpu":
            return torch.device("neuron")
        if isinstance(v, str) and v == "cpu":  # a device given as a string, positionally (`to`) or as `device=`
            return "neuron"
        if isinstance(v, torch.Generator):  # a CPU generator cannot drive neuron's random ops
            return None
        return v

    def prepare(self, sample) -> None:
        self([sample.input, sample.args, sample.kwargs])


class _Float64Sample:
    """A sample with its half-precision tensors in float64 (aliasing kept), for the reference that
    judges half-precision mismatches (classify.closer_to_float64)."""

    def __init__(self, sample):
        self.copies: dict[int, torch.Tensor] = {}
        self.input, self.args, self.kwargs = tree_map(self._up, [sample.input, sample.args, sample.kwargs])
        self.output_process_fn_grad = sample.output_process_fn_grad

    def _up(self, v):
        if not isinstance(v, torch.Tensor) or v.dtype not in classify.LOW_PRECISION:
            return v
        if id(v) not in self.copies:
            copy = v.detach().double()
            self.copies[id(v)] = copy.requires_grad_() if v.requires_grad else copy
        return self.copies[id(v)]


def _samples(op, dtype, requires_grad, limit):
    name = full_name(op)
    samples = (s for s in op.sample_inputs("cpu", dtype, requires_grad=requires_grad)
               if not skips.random_sample(name, s))
    return itertools.islice(samples, limit)


def _attempt(fn, *args, **kwargs):
    """(result, None), or (None, exception): any failure of an op is a result to record, not a crash."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001
        return None, exc


def _call(fn, sample, mover=None, **extra):
    if mover is None:
        return fn(sample.input, *sample.args, **sample.kwargs, **extra)
    return fn(mover(sample.input), *mover(sample.args), **mover(sample.kwargs), **extra)


class _Variant:
    """Counts samples of one variant and keeps the first failure."""

    def __init__(self):
        self.compared = self.cpu_fails = 0
        self.failure: dict | None = None
        self.float64_judged = 0  # samples passed as closer to float64 than CPU (classify.closer_to_float64)

    def result(self) -> dict:
        judged = {"float64_judged": self.float64_judged} if self.float64_judged else {}
        if self.failure:
            return {"samples": self.compared, "cpu_fails": self.cpu_fails, **judged, **self.failure}
        if self.compared == 0:
            reason = "cpu-fails" if self.cpu_fails else "no applicable samples"
            return {"status": "skipped", "reason": reason, "samples": 0, "cpu_fails": self.cpu_fails}
        return {"status": "pass", "samples": self.compared, "cpu_fails": self.cpu_fails, **judged}

    def judged(self, problem, actual, expected, tol, wide, reference_fn, *args):
        """`problem`, or None when it is a half-precision mismatch where neuron is as close to the
        float64 result as CPU, or closer: `wide` is the sample in float64 (None: not judged),
        reference_fn(*args) computes that result."""
        if problem and wide is not None:
            reference, exc = _attempt(reference_fn, *args)
            if exc is None and classify.closer_to_float64(actual, expected, reference, *tol):
                self.float64_judged += 1
                return None
        return problem

    def conclude(self, index, problem) -> bool:
        """Records one compared sample; False (stop the variant) at its first mismatch."""
        if problem:
            self.mismatch(index, problem)
            return False
        self.compared += 1
        return True

    def error(self, index, exc):
        detail = classify.error_detail(exc)
        self.failure = {"status": "error", "sample": index, "reason": f"{detail['type']}: {detail['message']}",
                        "exception": detail["type"]}

    def mismatch(self, index, problem):
        self.failure = {"status": "mismatch", "sample": index, "reason": problem["message"],
                        **{k: problem[k] for k in ("max_abs", "max_rel") if k in problem}}


class _ErrorParity:
    """Counts the error cases of one op x dtype (error inputs, wrong out= tensors) and keeps every
    mismatch: unlike a value mismatch, one wrong message says nothing about the next case."""

    MAX_KEPT = 20

    def __init__(self):
        self.checked = self.failed = self.cpu_fails = 0
        self.mismatches: list[dict] = []
        self.skip_reason: str | None = None

    def check(self, case: str, problem: dict | None) -> None:
        self.checked += 1
        if problem and len(self.mismatches) < self.MAX_KEPT:
            self.mismatches.append({"case": case, "kind": problem["kind"], "reason": problem["message"]})
        self.failed += bool(problem)

    def result(self) -> dict:
        counts = {"samples": self.checked, "cpu_fails": self.cpu_fails}
        if self.checked == 0:
            reason = self.skip_reason or ("cpu-fails" if self.cpu_fails else "no error inputs or out= checks")
            return {"status": "skipped", "reason": reason, **counts}
        if not self.failed:
            return {"status": "pass", **counts}
        first = self.mismatches[0]
        return {"status": "mismatch", "sample": first["case"], "kind": first["kind"],
                "reason": f"{first['case']}: {first['reason']}", "mismatched": self.failed, **counts,
                "cases": self.mismatches}


def _forward(op, dtype, tol, shape_only, limit) -> dict:
    v = _Variant()
    for i, sample in enumerate(_samples(op, dtype, False, limit)):
        mover = _Mover(skips.host_tensors(full_name(op), sample))
        mover.prepare(sample)  # copy before the CPU run, which may mutate its inputs
        wide = _Float64Sample(sample) if dtype in classify.LOW_PRECISION else None
        expected, exc = _attempt(_call, op, sample)
        if exc:
            v.cpu_fails += 1
            continue
        actual, exc = _attempt(_call, op, sample, mover)
        if exc:
            v.error(i, exc)
            break
        problem = _compare_processed(sample, actual, expected, tol, shape_only)
        problem = v.judged(problem, actual, expected, tol, None if shape_only else wide, _call, op, wide)
        if not v.conclude(i, problem):
            break
    return v.result()


def _compare_processed(sample, actual, expected, tol, shape_only) -> dict | None:
    """Compares results after the sample's output_process_fn_grad, as PyTorch's test_compare_cpu does:
    linalg samples use it to drop what is not unique (eigenvector signs, singular vector phases)."""
    process = sample.output_process_fn_grad
    return classify.compare(process(actual), process(expected), *tol, shape_only=shape_only)


def _differentiable(out):
    flat, _ = tree_flatten(out)
    return [i for i, o in enumerate(flat) if isinstance(o, torch.Tensor) and o.requires_grad
            and (o.is_floating_point() or o.is_complex())]


def _cpu_grads(op, sample, leaves, generator):
    """CPU gradients of the sample's differentiable outputs under random cotangents, or None."""
    out = tree_flatten(sample.output_process_fn_grad(_call(op, sample)))[0]
    picked = _differentiable(out)
    if not leaves or not picked:
        return None
    seeds = [torch.randn(out[j].shape, dtype=out[j].dtype, generator=generator) for j in picked]
    return torch.autograd.grad([out[j] for j in picked], leaves, seeds, allow_unused=True), picked, seeds


def _backward(op, dtype, tol, limit) -> dict:
    v = _Variant()
    generator = torch.Generator().manual_seed(0)
    for i, sample in enumerate(_samples(op, dtype, True, limit)):
        mover = _Mover(skips.host_tensors(full_name(op), sample))
        mover.prepare(sample)
        wide = _Float64Sample(sample) if dtype in classify.LOW_PRECISION else None
        leaves = list({id(t): t for t in tree_flatten([sample.input, sample.args, sample.kwargs])[0]
                       if isinstance(t, torch.Tensor) and t.requires_grad}.values())
        cpu, exc = _attempt(_cpu_grads, op, sample, leaves, generator)
        if exc:
            v.cpu_fails += 1
            continue
        if cpu is None:  # nothing differentiable in this sample
            continue
        expected, picked, seeds = cpu
        actual, exc = _attempt(_neuron_grads, op, sample, mover, picked, leaves, seeds)
        if exc:
            v.error(i, exc)
            break
        actual, expected = list(actual), list(expected)
        problem = v.judged(classify.compare(actual, expected, *tol), actual, expected, tol, wide,
                           _reference_grads, op, wide, picked, leaves, seeds)
        if not v.conclude(i, problem):
            break
    return v.result()


def _neuron_grads(op, sample, mover, picked, leaves, seeds):
    out = tree_flatten(sample.output_process_fn_grad(_call(op, sample, mover)))[0]
    return torch.autograd.grad([out[j] for j in picked], [mover.copies[id(t)] for t in leaves],
                               [s.to("neuron") for s in seeds], allow_unused=True)


def _reference_grads(op, wide, picked, leaves, seeds):
    out = tree_flatten(wide.output_process_fn_grad(_call(op, wide)))[0]
    return list(torch.autograd.grad([out[j] for j in picked], [wide.copies.get(id(t), t) for t in leaves],
                                    [s.double() for s in seeds], allow_unused=True))


def _forward_ad(op, dtype, tol, limit) -> dict:
    """Forward-mode AD: the sample's floating tensors made dual with random tangents (the same on
    both devices), the op run inside a dual level, the output tangents compared with CPU's."""
    v = _Variant()
    generator = torch.Generator().manual_seed(0)
    for i, sample in enumerate(_samples(op, dtype, False, limit)):
        mover = _Mover(skips.host_tensors(full_name(op), sample))
        mover.prepare(sample)
        wide = _Float64Sample(sample) if dtype in classify.LOW_PRECISION else None
        primals = list({id(t): t for t in tree_flatten([sample.input, sample.args, sample.kwargs])[0]
                        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
                        and id(t) in mover.copies and mover.copies[id(t)].device.type == "neuron"}.values())
        if not primals:
            continue
        # a tangent in its primal's layout where that is dense (make_dual wants views' tangents so)
        tangents = {id(t): (torch.empty_strided(t.shape, t.stride(), dtype=t.dtype) if _dense(t)
                            else torch.empty(t.shape, dtype=t.dtype)).normal_(generator=generator)
                    for t in primals}
        expected, exc = _attempt(_output_tangents, op, sample, None, tangents)
        if exc:
            v.cpu_fails += 1
            continue
        if not any(t is not None for t in expected):
            continue
        actual, exc = _attempt(_output_tangents, op, sample, mover, tangents)
        if exc:
            v.error(i, exc)
            break
        problem = v.judged(classify.compare(actual, expected, *tol), actual, expected, tol, wide,
                           _reference_tangents, op, wide, primals, tangents)
        if not v.conclude(i, problem):
            break
    return v.result()


def _dense(t) -> bool:
    """Whether `t`'s strides describe a dense layout a fresh tangent can copy (no overlap, no gaps)."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false as dense
    return t.numel() > 0 and dense(t)


def _reference_tangents(op, wide, primals, tangents):
    """The output tangents with the sample's half-precision tensors and their tangents in float64."""
    wide_tangents = {}
    for t in primals:
        copy = wide.copies.get(id(t))
        wide_tangents[id(t if copy is None else copy)] = tangents[id(t)] if copy is None else tangents[id(t)].double()
    return _output_tangents(op, wide, None, wide_tangents)


def _output_tangents(op, sample, mover, tangents):
    """The tangents of the op's outputs (after the sample's output processing), as CPU tensors or
    None, with the sample's floating inputs dual on `mover`'s device (CPU when mover is None)."""
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        def dual(value):
            if not isinstance(value, torch.Tensor) or id(value) not in tangents:
                return mover(value) if mover is not None else value
            primal = mover(value) if mover is not None else value
            tangent = tangents[id(value)]
            if mover is not None:
                tangent = tangent.to("neuron")
            return fwad.make_dual(primal, tangent)

        args = tree_map(dual, [sample.input, sample.args, sample.kwargs])
        out = sample.output_process_fn_grad(op(args[0], *args[1], **args[2]))
        flat = tree_flatten(out)[0]
        result = []
        for o in flat:
            tangent = fwad.unpack_dual(o).tangent if isinstance(o, torch.Tensor) else None
            result.append(None if tangent is None else tangent.detach().cpu())
        return result


def _call_out(op, sample, out, mover=None):
    _call(op, sample, mover, out=out)
    return out


def _out(op, dtype, tol, shape_only, limit) -> dict:
    v = _Variant()
    for i, sample in enumerate(_samples(op, dtype, False, limit)):
        mover = _Mover(skips.host_tensors(full_name(op), sample))
        mover.prepare(sample)
        expected, exc = _attempt(_call, op, sample)
        if exc:
            v.cpu_fails += 1
            continue
        flat = tree_flatten(expected)[0]
        if not flat or not all(isinstance(t, torch.Tensor) for t in flat):
            continue
        cpu_out = tree_map(lambda t: t.new_empty(0), expected)
        expected, exc = _attempt(_call_out, op, sample, cpu_out)
        if exc:  # out= as CPU takes it (resized from empty), so the neuron side is held to the same
            v.cpu_fails += 1
            continue
        out = tree_map(lambda t: t.new_empty(0, device="neuron"), cpu_out)
        _, exc = _attempt(_call_out, op, sample, out, mover)
        if exc:
            v.error(i, exc)
            break
        if not v.conclude(i, _compare_processed(sample, out, expected, tol, shape_only)):
            break
    return v.result()


def _inplace(op, dtype, tol, shape_only, limit) -> dict:
    v = _Variant()
    for i, sample in enumerate(_samples(op, dtype, False, limit)):
        if sample.broadcasts_input or not isinstance(sample.input, torch.Tensor):
            continue
        mover = _Mover(skips.host_tensors(full_name(op), sample))
        target = mover(sample.input)
        mover.prepare(sample)
        _, exc = _attempt(_call, op.inplace_variant, sample)
        if exc:
            v.cpu_fails += 1
            continue
        returned, exc = _attempt(_call, op.inplace_variant, sample, mover)
        if exc:
            v.error(i, exc)
            break
        problem = classify.compare(target, sample.input, *tol, shape_only=shape_only)
        if problem is None and returned is not target:
            problem = {"message": "the in-place variant did not return its input"}
        if not v.conclude(i, problem):
            break
    return v.result()


def _raised(fn, *args, **kwargs) -> Exception | None:
    return _attempt(fn, *args, **kwargs)[1]


def _errors(op, dtype, tol, shape_only, limit) -> dict:
    """Error parity: each of the OpInfo's error inputs raises on neuron what it raises on CPU
    (classify.compare_errors), and out= tensors of a wrong dtype, device or shape are treated as CPU
    (or, for the device, CUDA) treats them. Error inputs CPU does not reject are counted in cpu_fails."""
    v = _ErrorParity()
    name = full_name(op)
    if op.error_inputs_func is not None:
        inputs, exc = _attempt(list, op.error_inputs("cpu"))
        if exc:
            detail = classify.error_detail(exc)
            v.skip_reason = f"error-inputs-fail: {detail['type']}: {detail['message']}"
        for i, error_input in enumerate(inputs or ()):
            sample = error_input.sample_input
            mover = _Mover(skips.host_tensors(name, sample))
            moved = _raised(mover.prepare, sample)  # before the CPU run, which may mutate its inputs
            expected = _raised(_call, op, sample)
            if expected is None:
                v.cpu_fails += 1
            elif moved is not None:
                v.check(f"error input {i}", {"kind": "move", "message": f"copying the sample to neuron: "
                                             f"{type(moved).__name__}: {classify.error_detail(moved)['message']}"})
            else:
                v.check(f"error input {i}", classify.compare_errors(_raised(_call, op, sample, mover), expected,
                                                                    error_input.error_regex))
    if op.supports_out:
        _out_errors(op, dtype, tol, shape_only, limit, v)
    return v.result()


# For an output dtype, one it cannot be safely cast to (torch.can_cast is False), for the out= check.
_UNSAFE_OUT_DTYPE = {"complex": torch.float32, "floating": torch.int64, "integral": torch.bool}


def _unsafe_dtype(dtype: torch.dtype) -> torch.dtype | None:
    kind = ("complex" if dtype.is_complex else "floating" if dtype.is_floating_point
            else None if dtype == torch.bool else "integral")
    return _UNSAFE_OUT_DTYPE.get(kind)


def _out_errors(op, dtype, tol, shape_only, limit, v: _ErrorParity) -> None:
    """out= with a wrong dtype, on the wrong device and of a wrong shape, on the first sample whose
    out= call CPU accepts."""
    for sample in _samples(op, dtype, False, limit):
        expected, exc = _attempt(_call, op, sample)
        flat = [] if exc else tree_flatten(expected)[0]
        if flat and all(isinstance(t, torch.Tensor) for t in flat) and \
                _raised(_call_out, op, sample, tree_map(torch.empty_like, expected)) is None:
            break
    else:
        return
    name = full_name(op)

    def run_both(make_out):
        """(CPU outs, exception, warnings), then the same on neuron, each from a fresh sample copy."""
        results = []
        for device in ("cpu", "neuron"):
            mover = _Mover(skips.host_tensors(name, sample)) if device == "neuron" else None
            if mover:
                mover.prepare(sample)
            out = tree_map(lambda t, device=device: make_out(t, device), expected)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                exc = _raised(_call_out, op, sample, out, mover)
            results.append((out, exc, [str(w.message) for w in caught]))
        return results

    if any(_unsafe_dtype(t.dtype) for t in flat):
        (cpu_out, cpu_exc, _), (out, exc, _) = run_both(
            lambda t, device: t.new_empty(t.shape, dtype=_unsafe_dtype(t.dtype) or t.dtype, device=device))
        if cpu_exc is not None:
            v.check("out= of an unsafe dtype", classify.compare_errors(exc, cpu_exc))
        else:
            v.check("out= of an unsafe dtype", _out_agrees(sample, out, exc, cpu_out, [], [], tol, shape_only))

    mover = _Mover(skips.host_tensors(name, sample))
    moved = mover([sample.input, sample.args, sample.kwargs])
    on_neuron = any(isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in tree_flatten(moved)[0])
    if on_neuron and name not in skips.OUT_ANY_DEVICE:
        # no CPU reference: PyTorch's test_out requires a RuntimeError on a device op with CPU outs
        exc = _raised(_call_out, op, sample, tree_map(torch.empty_like, expected), mover)
        v.check("out= on CPU", _device_problem(exc))

    (cpu_out, cpu_exc, cpu_warned), (out, exc, warned) = run_both(
        lambda t, device: t.new_empty((t.numel() + 1,), device=device))
    if cpu_exc is not None:
        v.check("out= of a wrong shape", classify.compare_errors(exc, cpu_exc))
    else:
        v.check("out= of a wrong shape", _out_agrees(sample, out, exc, cpu_out, warned, cpu_warned, tol, shape_only))


def _out_agrees(sample, out, exc, cpu_out, warned, cpu_warned, tol, shape_only) -> dict | None:
    """Where CPU accepted the out= tensors: neuron too, with CPU's values and its resize warning."""
    if exc is not None:
        detail = classify.error_detail(exc)
        return {"kind": "other-type", "message": f"raised {detail['type']}: {detail['message']}; CPU raised nothing"}
    if any("resized" in w for w in cpu_warned) and not any("resized" in w for w in warned):
        return {"kind": "no-warning", "message": f"no warning; CPU warned: {cpu_warned[0][:200]}"}
    problem = _compare_processed(sample, out, cpu_out, tol, shape_only)  # (eigenvector signs dropped)
    return problem and {"kind": "other-value", "message": problem["message"]}


def _device_problem(exc) -> dict | None:
    """None when exc is a RuntimeError (or subclass) about the devices, as CUDA raises: its message
    speaks of a device and names no meta device (which only the driver's meta run would see)."""
    if exc is None:
        return {"kind": "no-error", "message": "no error for out= tensors on CPU (CUDA raises RuntimeError)"}
    detail = classify.error_detail(exc)
    if not isinstance(exc, RuntimeError):
        return {"kind": "other-type", "message": f"raised {detail['type']}: {detail['message']}; expected RuntimeError"}
    if "device" in str(exc).lower() and "meta" not in str(exc):
        return None
    return {"kind": "other-message",
            "message": f"raised {detail['type']}: {detail['message']}; expected a device mismatch error"}


def run_op_dtype(op, dtype, variants=DEFAULT_VARIANTS, max_samples: int = 8) -> dict:
    """The record of one op x dtype: status, reason, each selected variant's result, CPU fallbacks."""
    name = full_name(op)
    record = {"op": name, "family": families.family(op), "dtype": str(dtype).removeprefix("torch.")}
    mode, reason = skips.lookup(name)
    if mode == "skip":
        return {**record, "status": "skipped", "reason": reason, "variants": {}, "fallbacks": {}, "seconds": 0.0}
    shape_only = mode == "shape-only"
    tol = classify.tolerance(op, dtype)
    start, before = time.perf_counter(), _fallback_counts()
    selected, results = set(variants), {}
    if "forward" in selected:
        results["forward"] = _guarded(_forward, op, dtype, tol, shape_only, max_samples)
    differentiable = dtype.is_floating_point and not shape_only
    if "backward" in selected and op.supports_autograd and differentiable:
        results["backward"] = _guarded(_backward, op, dtype, tol, max_samples)
    if "forward_ad" in selected and op.supports_forward_ad and differentiable:
        results["forward_ad"] = _guarded(_forward_ad, op, dtype, tol, max_samples)
    if "out" in selected and op.supports_out:
        results["out"] = _guarded(_out, op, dtype, tol, shape_only, max_samples)
    if "inplace" in selected and op.inplace_variant is not None:
        results["inplace"] = _guarded(_inplace, op, dtype, tol, shape_only, max_samples)
    if "errors" in selected:
        results["errors"] = _guarded(_errors, op, dtype, tol, shape_only, max_samples)
    after = _fallback_counts()
    fallbacks = {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}
    status, why = classify.classify(results, fallbacks)
    if shape_only and status == "pass":
        why = f"compared by shape/dtype only ({reason})"
    return {**record, "status": status, "reason": why, "variants": results, "fallbacks": fallbacks,
            "seconds": round(time.perf_counter() - start, 3)}


def _guarded(variant, *args) -> dict:
    """A variant whose OpInfo sample generator itself fails on CPU is skipped, not failed."""
    result, exc = _attempt(variant, *args)
    if exc is None:
        return result
    detail = classify.error_detail(exc)
    return {"status": "skipped", "reason": f"sample-inputs-fail: {detail['type']}: {detail['message']}"}
