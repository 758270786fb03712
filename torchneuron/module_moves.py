"""A module moved onto or off neuron keeps its Parameter objects, as a module moved to CUDA does.

`nn.Module._apply` (`.to`, `.cpu()`, `.half()`, ...) updates a Parameter in place (`param.data =
new`) when `torch._has_compatible_shallow_copy_type(param, new)` says both are dense tensors, and
otherwise replaces it with a new Parameter. PyTorch's rule (`TensorImpl::has_compatible_shallow_copy_type`)
lists the dense backends CPU, CUDA, MPS, HIP, XPU, HPU and MTIA, not PrivateUse1, so without this
every move replaced every Parameter: an optimizer built before `model.to("neuron")` (accelerate's
`prepare(model, optimizer)` builds it so) kept the old CPU tensors, their `.grad` stayed None and it
trained nothing, silently; tied weights came apart.

`_has_compatible_shallow_copy_type` is an ATen op, and the check inside `variable.data = new`
(`VariableHooks::set_data`) calls it through the dispatcher too, so one kernel for the PrivateUse1
keys gives both CUDA's answer: the same rule with neuron counted dense (and sparse, for sparse
neuron tensors). A call sees these keys whenever one of its two tensors is on neuron.
"""
from __future__ import annotations

import torch
from torch._C import DispatchKey

# The backends PyTorch's rule counts as one family, plus neuron's.
DENSE = (DispatchKey.CPU, DispatchKey.CUDA, DispatchKey.MPS, DispatchKey.HIP, DispatchKey.XPU,
         DispatchKey.HPU, DispatchKey.MTIA, DispatchKey.PrivateUse1)
SPARSE = (DispatchKey.SparseCPU, DispatchKey.SparseCUDA, DispatchKey.SparseMPS, DispatchKey.SparseHIP,
          DispatchKey.SparseXPU, DispatchKey.SparsePrivateUse1)

_library = None


def _is_any(keys, family) -> bool:
    return any(keys.has(key) for key in family)


def has_compatible_shallow_copy_type(tensor: torch.Tensor, source: torch.Tensor) -> bool:
    """Whether `tensor.data = source` may keep `tensor`'s object: PyTorch's rule, neuron dense."""
    mine, theirs = torch._C._dispatch_keys(tensor), torch._C._dispatch_keys(source)
    return (mine == theirs
            or (_is_any(mine, DENSE) and _is_any(theirs, DENSE))
            or (_is_any(mine, SPARSE) and _is_any(theirs, SPARSE))
            or (mine.has(DispatchKey.SparseCsr) and theirs.has(DispatchKey.SparseCsr)))


def install() -> None:
    """Register the rule for neuron's keys (Autograd first: it is what a Parameter dispatches to)."""
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("aten", "IMPL")
    for key in ("AutogradPrivateUse1", "PrivateUse1"):
        _library.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type, key)
