"""What CPU's and CUDA's kernels refuse after their meta functions have accepted a call.

PyTorch checks some arguments in its kernels, not in the meta functions the eager driver runs:
the dtypes a kernel is built for (`abs` of bool raises NotImplementedError, `"abs_cpu" not
implemented for 'Bool'`) and a few rules in the kernels' shared code (`argmax` of bool, `maximum`
of complex, subtracting a bool). Without them neuron computed an answer where CPU and CUDA
raise, and a program that ran on neuron failed on the way back. Each rule here checks a call's
arguments when its plan is built or read back from the persistent cache (once per plan key:
dtypes, shapes and static arguments are in the key) and raises what CPU raises; a refused dtype
names the op as the kernels' dispatch does, without CPU's kernel suffix. Beside them are argument
rules that PyTorch's C++ meta functions or CPU's kernels make and its Python meta functions leave
out (index_add's shapes). Rules that depend on values (integer division by zero, which CUDA does
not check either; a traced scalar's sign) are not here. torch.compile's graphs are traced with
PyTorch's meta functions and do not take them.
"""
from __future__ import annotations

import math
import warnings

import torch

from ..runtime.dtypes import scalar_type_name
from . import KernelRefusal, refuses

aten = torch.ops.aten
_INTEGRAL = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
             torch.uint16, torch.uint32, torch.uint64)


def _bool(dtype) -> bool:
    return dtype == torch.bool


def _complex(dtype) -> bool:
    return dtype.is_complex


def _integral(dtype) -> bool:
    return dtype in _INTEGRAL


def _integral_or_complex(dtype) -> bool:
    return dtype in _INTEGRAL or dtype.is_complex


def _not_integral(dtype) -> bool:
    return dtype not in _INTEGRAL


def _not_integer(dtype) -> bool:
    """Not an integer dtype (bool is none: shifts and gcd refuse it)."""
    return dtype == torch.bool or dtype not in _INTEGRAL


def _bool_or_complex(dtype) -> bool:
    return dtype == torch.bool or dtype.is_complex


def _not_floating(dtype) -> bool:
    return not dtype.is_floating_point


def _not_floating_or_complex(dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex)


def _self_dtype(args, kwargs):
    """The dtype a unary op or a reduction dispatches on: its first tensor's."""
    return next(a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)).dtype


def _common_dtype(args, kwargs):
    """The dtype a binary op dispatches on: its two operands' result type (a Python scalar
    operand is weak, as in TensorIterator)."""
    operands = [a for a in args[:2] if isinstance(a, (torch.Tensor, bool, int, float, complex))]
    return torch.result_type(*operands) if len(operands) == 2 else _self_dtype(args, kwargs)


def _overloads(packets) -> list:
    """Every overload of the packets in this PyTorch: functional, in-place and out=."""
    return [getattr(packet, name) for packet in packets for name in packet.overloads()]


def _dtype_refusal(name: str, refused, dtype_of):
    def check(*args, **kwargs):
        dtype = dtype_of(args, kwargs)
        if refused(dtype):
            raise KernelRefusal(f'"{name}" not implemented for \'{scalar_type_name(dtype)}\'')
    return check


def _dtype_refused(name: str, refused, packets, dtype_of=_self_dtype) -> None:
    """`packets`' kernels are not built for dtypes `refused` says (PyTorch's dispatch error)."""
    refuses(_dtype_refusal(name, refused, dtype_of), *_overloads(packets))


def _raising(message: str, refused, dtype_of, error):
    def check(*args, **kwargs):
        if refused(dtype_of(args, kwargs)):
            raise error(message)
    return check


def _rule(message: str, refused, packets, dtype_of=_self_dtype, error=RuntimeError) -> None:
    """`packets`' kernels raise `error(message)` for dtypes `refused` says."""
    refuses(_raising(message, refused, dtype_of, error), *_overloads(packets))


# ops dispatching on their first tensor's dtype (unary ops, reductions, lerp, dot): op name ->
# dtypes refused (found by running each dtype on CPU)
_ON_SELF = {
    "abs": _bool, "floor": _bool, "ceil": _bool, "trunc": _bool, "round": _bool_or_complex,
    "frac": _integral_or_complex, "logit": _complex, "erf": _complex, "erfinv": _complex, "i0": _complex,
    "lgamma": _complex, "digamma": _complex, "bitwise_not": _not_integral, "lerp": _integral,
    "amax": _complex, "amin": _complex,
    "cummax": _complex, "cummin": _complex, "mode": _complex, "aminmax": _complex, "bincount": _not_integer,
    "dot": _bool, "vdot": _bool, "_softmax": _not_floating,
    "_log_softmax": _not_floating,
}
# binary ops, on their operands' common dtype
_ON_OPERANDS = {
    "lt": _complex, "le": _complex, "gt": _complex, "ge": _complex, "remainder": _bool_or_complex,
    "fmod": _bool_or_complex, "floor_divide": _bool_or_complex, "pow": _bool, "atan2": _complex,
    "hypot": _integral_or_complex, "xlogy": _complex, "copysign": _complex,
    "nextafter": _integral_or_complex, "logaddexp": _integral, "logaddexp2": _integral,
    "bitwise_and": _not_integral, "bitwise_or": _not_integral, "bitwise_xor": _not_integral,
    "__and__": _not_integral, "__or__": _not_integral, "__xor__": _not_integral,
    "__iand__": _not_integral, "__ior__": _not_integral, "__ixor__": _not_integral,
    "bitwise_left_shift": _not_integer, "bitwise_right_shift": _not_integer, "__lshift__": _not_integer,
    "__rshift__": _not_integer, "__ilshift__": _not_integer, "__irshift__": _not_integer,
    "gcd": _not_integer, "lcm": _not_integer, "linalg_cross": _bool,
}


def _packets(name: str) -> tuple:
    """The op and its in-place variant, where ATen has one."""
    inplace = getattr(aten, name + "_", None) if not name.startswith("_") else None
    return (getattr(aten, name),) + ((inplace,) if inplace is not None else ())


for _name, _refused in _ON_SELF.items():
    _dtype_refused(_name.strip("_"), _refused, _packets(_name))
for _name, _refused in _ON_OPERANDS.items():
    _dtype_refused(_name.strip("_"), _refused, _packets(_name), _common_dtype)


def _subtracts_bool(*args, **kwargs) -> None:
    bools = [(a.dtype if isinstance(a, torch.Tensor) else type(a)) in (torch.bool, bool) for a in args[:2]]
    if all(bools):
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported. "
                           "Use the `^` or `logical_xor()` operator instead.")
    if any(bools):
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. "
                           "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.")


refuses(_subtracts_bool, *_overloads((aten.sub, aten.sub_, aten.rsub)))
for _name in ("maximum", "minimum", "fmax", "fmin"):
    _rule(f"{_name} not implemented for complex tensors.", _complex, (getattr(aten, _name),), _common_dtype)
# `max` and `min`: of all elements (a refused dtype), along a dim, and of two tensors (`maximum`'s)
for _name, _pair in (("max", "maximum"), ("min", "minimum")):
    for _op in _overloads((getattr(aten, _name),)):
        _arguments = [a.name for a in _op._schema.arguments]
        if "other" in _arguments:
            refuses(_raising(f"{_pair} not implemented for complex tensors.", _complex, _common_dtype,
                             RuntimeError), _op)
        elif "dim" in _arguments:
            refuses(_raising(f"{_name}(): does not support complex input", _complex, _self_dtype, RuntimeError), _op)
        else:
            refuses(_dtype_refusal(f"{_name}_all", _complex, _self_dtype), _op)
for _name in ("argmax", "argmin"):
    _rule(f"{_name}(): does not support bool input", _bool, (getattr(aten, _name),))
    _rule(f"{_name}(): does not support complex input", _complex, (getattr(aten, _name),))
_rule("signbit is not implemented for complex tensors.", _complex, (aten.signbit,), error=KernelRefusal)
_rule("std and var only support floating point and complex dtypes", _not_floating_or_complex, (aten.std, aten.var))
for _name in ("std_mean", "var_mean"):
    _rule(f"{_name} only support floating point and complex dtypes", _not_floating_or_complex, (getattr(aten, _name),))
for _name in ("floor", "ceil", "trunc"):
    _rule(f"{_name} is not supported for complex inputs", _complex, _packets(_name), error=KernelRefusal)
_rule("In-place abs is not supported for complex tensors.", _complex, (aten.abs_,))
# (CPU's messages, a space before two of them included)
_rule(" Sort does not support complex dtypes on neuron", _complex, (aten.sort,))
_rule("topk does not support bool dtypes on neuron", _bool, (aten.topk,))
_rule(" topk does not support complex dtypes on neuron", _complex, (aten.topk,))
_rule("Boolean inputs not supported for relu", _bool, (aten.relu, aten.relu_))
_rule("clamp is not supported for complex types", _complex,
      (aten.clamp, aten.clamp_, aten.clamp_min, aten.clamp_min_, aten.clamp_max, aten.clamp_max_, aten.relu,
       aten.relu_), error=KernelRefusal)  # (CPU's relu is a clamp)
_rule("Unlike NumPy, torch.sign is not intended to support complex numbers. Please use torch.sgn instead.",
      _complex, (aten.sign, aten.sign_), error=KernelRefusal)


# --- shape and argument rules of single ops (CPU's messages) ----------------------------------

def _index_add_shapes(self, dim, index, source, *args, **kwargs) -> None:
    """ATen's index_add: self and source agree in every dimension but `dim` (PyTorch's Python meta
    function leaves this out)."""
    if not isinstance(dim, int):
        return
    mine, theirs = list(self.shape), list(source.shape)
    if source.dim() and self.dim():
        if not -self.dim() <= dim < self.dim() or dim % self.dim() >= source.dim():
            return  # (the meta kernel's own errors)
        del mine[dim % self.dim()], theirs[dim % self.dim()]
    if mine != theirs:
        raise RuntimeError("source tensor shape must match self tensor shape, excluding the specified dimension. "
                           f"Got self.shape = {list(self.shape)} source.shape = {list(source.shape)}")


refuses(_index_add_shapes, *_overloads((aten.index_add, aten.index_add_)))


def _multinomial_arguments(self, num_samples, replacement=False, *, generator=None, out=None) -> None:
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {scalar_type_name(self.dtype)}")
    if out is not None and out.dtype != torch.int64:
        raise RuntimeError(f"multinomial expects Long tensor out, got: {scalar_type_name(out.dtype)}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if self.dim() and self.shape[-1] > 2**24:
        raise RuntimeError("number of categories cannot exceed 2^24")


refuses(_multinomial_arguments, *_overloads((aten.multinomial,)))


def _masked_scatter_mask(self, mask, source, *args, **kwargs) -> None:
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype "
                           f"{scalar_type_name(mask.dtype)}")


refuses(_masked_scatter_mask, *_overloads((aten.masked_scatter, aten.masked_scatter_)))


def _normal_into(*args, out=None, **kwargs) -> None:
    """normal_ and normal's out= draw floats: an integer tensor to fill is refused."""
    target = out if out is not None else args[0]
    if isinstance(target, torch.Tensor) and not (target.dtype.is_floating_point or target.dtype.is_complex):
        raise KernelRefusal(f'"normal_kernel" not implemented for \'{scalar_type_name(target.dtype)}\'')


refuses(_normal_into, aten.normal_.default, *[op for op in _overloads((aten.normal,)) if "out" in op._schema.overload_name])


def _convolution_arguments(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                           *args, **kwargs) -> None:
    """ATen's convolution checks its geometry before the shapes (`check_shape_forward`)."""
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    if any(p < 0 for p in output_padding):
        raise RuntimeError("negative output_padding is not supported")
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError(f"dilation should be greater than zero, but got {list(dilation)}")


refuses(_convolution_arguments, *_overloads((aten.convolution,)))


def _complex_parts(real, imag, *args, **kwargs) -> None:
    floating = (torch.float16, torch.float32, torch.float64)
    if real.dtype not in floating or imag.dtype not in floating:
        raise RuntimeError(f"Expected both inputs to be Half, Float or Double tensors but got "
                           f"{scalar_type_name(real.dtype)} and {scalar_type_name(imag.dtype)}")
    if real.dtype != imag.dtype:
        raise RuntimeError(f"Expected object of scalar type {scalar_type_name(real.dtype)} but got scalar type "
                           f"{scalar_type_name(imag.dtype)} for second argument")


refuses(_complex_parts, *_overloads((aten.complex,)))


def _reduced_dims_not_empty(name: str, all_empty: str):
    """amax's, amin's and aminmax's rule: no reduced dimension of size zero (no identity)."""
    def check(self, dim=None, keepdim=False, *args, **kwargs):
        dim = kwargs.get("dim", dim)
        dims = [dim] if isinstance(dim, int) else list(dim or ())
        if not dims:
            if self.numel() == 0:
                raise RuntimeError(all_empty)
            return
        for d in dims:
            if self.dim() and -self.dim() <= d < self.dim() and self.shape[d] == 0:
                raise IndexError(f"{name} Expected reduction dim {d} to have non-zero size.")
    return check


for _name in ("amax", "amin"):
    refuses(_reduced_dims_not_empty(
        f"{_name}():", f"{_name}(): Expected reduction dim to be specified for input.numel() == 0. Specify the "
                       "reduction dim with the 'dim' argument."), *_overloads((getattr(aten, _name),)))
refuses(_reduced_dims_not_empty("aminmax:", "aminmax(): cannot compute aminmax over an empty dimension as the "
                                            "operation has no identity."), *_overloads((aten.aminmax,)))


def _selected_dim_not_empty(name: str, dim_at: int, all_empty=None, default=-1):
    """max's, min's, argmax's, argmin's, median's, kthvalue's and mode's rule: the dimension they
    select along (argument `dim_at` counting self, `default` when left out) has elements; a dim of
    None (argmax's) reduces all, refused as `all_empty` (error type, message) for an empty input.
    CPU's message counts the dimension from the front."""
    def check(self, *args, **kwargs):
        dim = kwargs["dim"] if "dim" in kwargs else args[dim_at - 1] if len(args) >= dim_at else default
        if dim is None:
            if all_empty is not None and self.numel() == 0:
                raise all_empty[0](all_empty[1])
        elif isinstance(dim, int) and self.dim() and -self.dim() <= dim < self.dim() and self.shape[dim] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {dim % self.dim()} to have non-zero size.")
    return check


def _input_not_empty(error, message: str):
    def check(self, *args, **kwargs):
        if self.numel() == 0:
            raise error(message)
    return check


def _unless_empty(check):
    def unless_empty(self, *args, **kwargs):
        if self.numel():
            check(self, *args, **kwargs)
    return unless_empty


def _along_dim(packet) -> list:
    return [op for op in _overloads((packet,)) if "dim" in [a.name for a in op._schema.arguments]]


for _name in ("max", "min"):
    _packet = getattr(aten, _name)
    refuses(_selected_dim_not_empty(_name, 1), *_along_dim(_packet))
    refuses(_input_not_empty(RuntimeError, f"{_name}(): Expected reduction dim to be specified for input.numel() == 0. "
                                           "Specify the reduction dim with the 'dim' argument."),
            *[op for op in _overloads((_packet,)) if op not in _along_dim(_packet)
              and "other" not in [a.name for a in op._schema.arguments]])
for _name in ("argmax", "argmin"):
    _message = f"{_name}(): Expected reduction dim to be specified for input.numel() == 0."
    refuses(_selected_dim_not_empty(_name, 1, (IndexError, _message), default=None), *_overloads((getattr(aten, _name),)))
# (nanmedian's message says median; the median of all of an empty input is NaN, of any dtype)
refuses(_selected_dim_not_empty("median", 1), *_along_dim(aten.median), *_along_dim(aten.nanmedian))
for _name in ("median", "nanmedian"):
    _packet = getattr(aten, _name)
    refuses(_dtype_refusal(_name, _bool_or_complex, _self_dtype), *_along_dim(_packet))
    refuses(_unless_empty(_dtype_refusal(_name, _bool_or_complex, _self_dtype)),
            *[op for op in _overloads((_packet,)) if op not in _along_dim(_packet)])
refuses(_selected_dim_not_empty("kthvalue", 2), *_overloads((aten.kthvalue,)))
refuses(_selected_dim_not_empty("mode", 1), *_overloads((aten.mode,)))


def _degrees_of_freedom(name: str, op):
    """std's, var's, std_mean's and var_mean's warning where the correction leaves no degrees of
    freedom (CPU's warn_invalid_degrees_of_freedom). Told when a plan is built, so once per
    signature rather than at every call."""
    names = [a.name for a in op._schema.arguments]

    def check(*args, **kwargs):
        bound = dict(zip(names, args), **kwargs)
        self, dim = bound["self"], bound.get("dim")
        dim = [dim] if isinstance(dim, int) else list(dim or range(self.dim()))
        if any(not isinstance(d, int) for d in dim):
            return  # (named dimensions)
        reduced = {d % max(self.dim(), 1) for d in dim}
        out_numel = math.prod(1 if d in reduced else n for d, n in enumerate(self.shape))
        factor = self.numel() // out_numel if out_numel else 0
        correction = bound.get("correction")
        if correction is None:
            correction = 1 if bound.get("unbiased", True) else 0
        if factor - correction <= 0:
            warnings.warn(f"{name}(): degrees of freedom is <= 0. Correction should be strictly less than the "
                          "reduction factor (input numel divided by output numel).", UserWarning, stacklevel=2)
    return check


for _name in ("std", "var", "std_mean", "var_mean"):
    for _op in _overloads((getattr(aten, _name),)):
        refuses(_degrees_of_freedom(_name, _op), _op)


def _kthvalue_values_apart(self, *args, values=None, **kwargs) -> None:
    """CPU's kthvalue writes its values apart from its input (assert_no_overlap: even the same
    tensor, which in-place ops may be, is refused)."""
    if values is None or not self.numel() or not values.numel():
        return
    handle = self.untyped_storage().data_ptr()
    if not handle or handle != values.untyped_storage().data_ptr():
        return
    dense = torch._prims_common.is_non_overlapping_and_dense_or_false
    if not (dense(self) and dense(values)):
        return  # (ATen's TOO_HARD: not checked)
    a = (self.storage_offset() * self.element_size(), (self.storage_offset() + self.numel()) * self.element_size())
    b = (values.storage_offset() * values.element_size(),
         (values.storage_offset() + values.numel()) * values.element_size())
    if a[0] < b[1] and b[0] < a[1]:
        raise RuntimeError("unsupported operation: some elements of the input tensor and the written-to tensor "
                           "refer to a single memory location. Please clone() the tensor before performing the "
                           "operation.")


refuses(_kthvalue_values_apart, *_overloads((aten.kthvalue,)))


def _cpp(dtype) -> str:
    return _CPP_NAMES.get(dtype, scalar_type_name(dtype))


def _kthvalue_outs(self, *args, values=None, indices=None, **kwargs) -> None:
    if values is not None and values.dtype != self.dtype:
        raise RuntimeError("output values must be of same type as input")
    if indices is not None and indices.dtype != torch.int64:
        raise RuntimeError("output indices must be of scalar type Long")


def _std_var_out(*args, out=None, **kwargs) -> None:
    if out is not None:
        result = args[0].dtype.to_real()
        if not torch.can_cast(result, out.dtype):
            raise RuntimeError(f"result type {scalar_type_name(result)} can't be cast to the desired output type "
                               f"{scalar_type_name(out.dtype)}")


def _frexp_outs(self, *, mantissa=None, exponent=None) -> None:
    if mantissa is not None and mantissa.dtype != self.dtype:
        raise RuntimeError(f"torch.frexp() expects mantissa to have dtype {_cpp(self.dtype)} but got "
                           f"{_cpp(mantissa.dtype)}")
    if exponent is not None and exponent.dtype != torch.int32:
        raise RuntimeError(f"torch.frexp() expects exponent to have int dtype but got {_cpp(exponent.dtype)}")


def _same_dtype_out(self, *args, out=None, **kwargs) -> None:
    if out is not None and out.dtype != self.dtype:
        raise RuntimeError(f"Expected out tensor to have dtype {_cpp(self.dtype)}, but got {_cpp(out.dtype)} instead")


refuses(_kthvalue_outs, *_overloads((aten.kthvalue,)))
refuses(_std_var_out, *[op for op in _overloads((aten.std, aten.var)) if "out" in op._schema.overload_name])
refuses(_frexp_outs, *[op for op in _overloads((aten.frexp,)) if "out" in op._schema.overload_name])
refuses(_same_dtype_out, *[op for op in _overloads((aten.index_add,)) if "out" in op._schema.overload_name])


def _all_any_out(name: str):
    """all's and any's out= holds bool (or uint8, the legacy result of uint8 inputs)."""
    def check(*args, out=None, **kwargs):
        if out is not None and out.dtype not in (torch.bool, torch.uint8):
            raise RuntimeError(f"{name} only supports bool tensor for result, got: {scalar_type_name(out.dtype)}")
    return check


for _name in ("all", "any"):
    refuses(_all_any_out(_name), *[op for op in _overloads((getattr(aten, _name),)) if "out" in op._schema.overload_name])


def _mode_outs(self, *args, values=None, indices=None, **kwargs) -> None:
    if values is not None and values.dtype != self.dtype:
        raise RuntimeError(f"expected scalar type '{scalar_type_name(self.dtype)}' but got "
                           f"'{scalar_type_name(values.dtype)}' for values output")
    if indices is not None and indices.dtype != torch.int64:
        raise RuntimeError(f"expected scalar type 'Long' but got '{scalar_type_name(indices.dtype)}' for indices output")


refuses(_mode_outs, *_overloads((aten.mode,)))


def _aminmax_outs(self, *args, min=None, max=None, **kwargs) -> None:
    for out in (min, max):
        if out is not None and out.dtype != self.dtype:
            raise RuntimeError(f"Expected out tensor to have dtype {_cpp(self.dtype)}, but got {_cpp(out.dtype)} instead")


refuses(_aminmax_outs, *_overloads((aten.aminmax,)))


def _bincount_arguments(self, weights=None, minlength=0, *args, **kwargs) -> None:
    """CPU's checks from shapes (negative values: the lowering, which sees them)."""
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if self.dim() == 1 and self.numel() == 0:
        return
    if self.dim() != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != self.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")


refuses(_bincount_arguments, *_overloads((aten.bincount,)))


# C++'s names of the element types, as CPU's masked_fill_ spells a mask's dtype
_CPP_NAMES = {torch.bool: "bool", torch.uint8: "unsigned char", torch.int8: "signed char", torch.int16: "short int", torch.int32: "int",
              torch.int64: "long int", torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
              torch.bfloat16: "c10::BFloat16", torch.complex64: "c10::complex<float>",
              torch.complex128: "c10::complex<double>"}


def _masked_fill_mask(self, mask, *args, **kwargs) -> None:
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype "
                           f"{_CPP_NAMES.get(mask.dtype, scalar_type_name(mask.dtype))}")


refuses(_masked_fill_mask, *_overloads((aten.masked_fill, aten.masked_fill_)))


# --- advanced indexing: ATen's checkIndexTensorTypes, expandTensors and index_put's value shape ------

_INDEX_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)


def _indexing_result(self, indices) -> list | None:
    """The shape of self[indices] (None where a mask makes it depend on values) after CPU's
    checks of the index tensors' dtypes, masks' shapes and the indices' broadcast."""
    dim, masked, shapes = 0, False, []
    for index in indices:
        if index is None:
            dim += 1
            continue
        if index.dtype not in _INDEX_DTYPES:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        if index.dtype in (torch.bool, torch.uint8):
            for j in range(index.dim()):
                if dim + j < self.dim() and index.shape[j] != self.shape[dim + j]:
                    raise IndexError(f"The shape of the mask {list(index.shape)} at index {j} does not match the "
                                     f"shape of the indexed tensor {list(self.shape)} at index {dim + j}")
            masked, dim = True, dim + index.dim()
        else:
            shapes.append(index.shape)
            dim += 1
    if masked or dim > self.dim():  # (too many indices: the meta kernel's error)
        return None
    try:
        torch.broadcast_shapes(*shapes)
    except RuntimeError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                         + ", ".join(str(list(shape)) for shape in shapes)) from None
    meta = [None if i is None else torch.empty(i.shape, dtype=i.dtype, device="meta") for i in indices]
    return list(aten.index.Tensor(torch.empty(self.shape, device="meta"), meta).shape)


def _index_arguments(self, indices, *args, **kwargs) -> None:
    _indexing_result(self, indices)


def _expands_to(shape, target) -> bool:
    try:
        return list(torch.broadcast_shapes(shape, target)) == list(target)
    except RuntimeError:
        return False


def _index_put_arguments(self, indices, values, accumulate=False, *args, **kwargs) -> None:
    result = _indexing_result(self, indices)
    if result is not None and not _expands_to(values.shape, result):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
                           f"indexing result of shape {result}")
    # CPU fills one mask with one value as masked_fill_ does, which casts it
    defined = [index for index in indices if index is not None]
    fills = (not accumulate and values.numel() == 1 and len(defined) == 1
             and defined[0].dtype in (torch.bool, torch.uint8))
    if values.dtype != self.dtype and not fills:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{scalar_type_name(self.dtype)} for the destination and {scalar_type_name(values.dtype)} "
                           "for the source.")


refuses(_index_arguments, *_overloads((aten.index,)))
refuses(_index_put_arguments, *_overloads((aten.index_put, aten.index_put_, aten._index_put_impl, aten._index_put_impl_)))


def _embedding_weight(weight, indices, *args, **kwargs) -> None:
    if weight.dim() != 2:
        raise RuntimeError("'weight' must be 2-D")


refuses(_embedding_weight, *_overloads((aten.embedding,)))
