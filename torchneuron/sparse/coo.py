"""Sparse COO kernels that compute over indices, each made of dense neuron ops (so each step runs
through the lowering table on the device, never on CPU).

ATen's device-agnostic COO kernels (construction, structure, element-wise ops on values, the ops
that forward to `add.out` and `mul.out`) are registered in C++ (csrc/sparse_coo.cpp); the ones
here are those CPU and CUDA each implement on their own. Each matches CPU's result: values,
index order where CPU fixes one, and the coalesced flag.

The tools: an entry's sparse coordinates flattened to one int64 key (row-major over the sparse
sizes), sorted keys and segment sums (`index_add_`) for coalescing and grouping, `searchsorted`
to find one tensor's entries in another's. The number of entries a result has is data: reading it
synchronises with the device once per call, as CUDA's kernels do.
"""
from __future__ import annotations

import torch

from ..lowering import redirected, sparse_kernel

aten = torch.ops.aten


def _make(sparse_dim: int, dense_dim: int, size, indices, values, coalesced: bool) -> torch.Tensor:
    return aten._sparse_coo_tensor_with_dims_and_tensors(
        sparse_dim, dense_dim, list(size), indices, values, dtype=values.dtype, layout=torch.sparse_coo,
        device=values.device, pin_memory=False, is_coalesced=coalesced)


def _keys(indices: torch.Tensor, sizes) -> torch.Tensor:
    """Each entry's sparse coordinates as one row-major int64 key."""
    key = torch.zeros(indices.shape[1], dtype=torch.int64, device=indices.device)
    for d, size in enumerate(sizes):
        key = key * size + indices[d]
    return key


def _groups(sorted_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """For sorted keys: each one's group (equal keys share one), the first position of each group
    and the number of groups."""
    n = sorted_keys.shape[0]
    starts = torch.ones(n, dtype=torch.bool, device=sorted_keys.device)
    starts[1:] = sorted_keys[1:] != sorted_keys[:-1]
    group = torch.cumsum(starts.long(), 0) - 1
    count = int(group[-1].item()) + 1
    first = torch.zeros(count, dtype=torch.int64, device=sorted_keys.device)
    first.index_copy_(0, group.flip(0), torch.arange(n - 1, -1, -1, device=sorted_keys.device))
    return group, first, count


def _dense_zeros(shape, like: torch.Tensor, dtype=None) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype or like.dtype, device=like.device)


@sparse_kernel(aten._coalesce.default)
def coalesce(self: torch.Tensor) -> torch.Tensor:
    """Entries sorted by their sparse coordinates, duplicates summed (CPU's order and sums)."""
    sd, dd = self.sparse_dim(), self.dense_dim()
    indices, values = self._indices(), self._values()
    if self._nnz() < 2:
        return _make(sd, dd, self.shape, indices.clone(), values.clone(), True)
    keys, order = torch.sort(_keys(indices, self.shape[:sd]), stable=True)
    group, first, count = _groups(keys)
    summed = _dense_zeros((count, *values.shape[1:]), values).index_add_(0, group, values[order])
    return _make(sd, dd, self.shape, indices[:, order[first]], summed, True)


def _find(keys: torch.Tensor, sorted_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each of `keys` sits in `sorted_keys` (unique), and whether it is there."""
    if sorted_keys.shape[0] == 0:
        return torch.zeros_like(keys), torch.zeros_like(keys, dtype=torch.bool)
    pos = torch.searchsorted(sorted_keys, keys).clamp_(max=sorted_keys.shape[0] - 1)
    return pos, sorted_keys[pos] == keys


def _promoted(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return values if values.dtype == dtype else values.to(dtype)


def _scaled(values: torch.Tensor, alpha) -> torch.Tensor:
    return values if isinstance(alpha, (int, float, bool)) and alpha == 1 else values * alpha


def _into(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """Write `result` into out=: a sparse out takes its indices, values and coalesced flag."""
    if out.is_sparse:
        if out.dtype != result.dtype:
            result = result.to(out.dtype)
        return out.copy_(result)
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out.copy_(result)


@sparse_kernel(aten.add.out)
def add_out(self: torch.Tensor, other: torch.Tensor, *, alpha=1, out: torch.Tensor) -> torch.Tensor:
    """sparse + sparse (entries concatenated; coalesced when both are, as CPU merges them) and
    dense + sparse (the values accumulated into the dense tensor)."""
    if not other.is_sparse:
        raise RuntimeError("add(sparse, dense) is not supported. Use add(dense, sparse) instead.")
    dtype = torch.result_type(self, other)
    if not self.is_sparse:
        torch._check(self.shape == other.shape, lambda: (
            f"add: expected 'self' and 'other' to have same size, but self has size {list(self.shape)} "
            f"while other has size {list(other.shape)}"))
        if out is not self:
            out.resize_(self.shape)
            out.copy_(self)
        indices = tuple(other._indices())
        values = _promoted(_scaled(_promoted(other._values(), dtype), alpha), out.dtype)
        return out.index_put_(indices, values, accumulate=True)
    torch._check(self.shape == other.shape, lambda: (
        f"add: expected sizes of 'self' and 'other' to match, but {list(self.shape)} != {list(other.shape)}"))
    torch._check(self.sparse_dim() == other.sparse_dim(), lambda: (
        f"add: expected 'self' and 'other' to have same sparse dimensions, but {self.sparse_dim()} != "
        f"{other.sparse_dim()}"))
    indices = torch.cat([self._indices(), other._indices()], 1)
    values = torch.cat([_promoted(self._values(), dtype), _scaled(_promoted(other._values(), dtype), alpha)])
    result = _make(self.sparse_dim(), self.dense_dim(), self.shape, indices, values, False)
    if self.is_coalesced() and other.is_coalesced():
        result = coalesce(result)
    return _into(out, result)


def _dense_mul(sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """sparse * dense (same shape, or a dense one that broadcasts): a sparse result on the sparse
    tensor's entries."""
    dtype = torch.result_type(sparse, dense)
    if dense.dim() == 0:  # (a 0-dim CPU tensor takes part as a scalar, as on CUDA)
        dense = dense.to(sparse.device)
    dense = dense.expand(sparse.shape)
    indices = sparse._indices()
    picked = dense[tuple(indices)]
    values = _promoted(sparse._values(), dtype) * picked
    return _make(sparse.sparse_dim(), sparse.dense_dim(), sparse.shape, indices.clone(), values,
                 sparse.is_coalesced())


def _sparse_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The entries both hold, multiplied (CPU coalesces both first); flagged coalesced where both were."""
    dtype = torch.result_type(a, b)
    coalesced = a.is_coalesced() and b.is_coalesced()
    a, b = a.coalesce(), b.coalesce()
    sizes = a.shape[:a.sparse_dim()]
    pos, hit = _find(_keys(a._indices(), sizes), _keys(b._indices(), sizes))
    kept = hit.nonzero().squeeze(1)
    values = _promoted(a._values()[kept], dtype) * _promoted(b._values()[pos[kept]], dtype)
    return _make(a.sparse_dim(), a.dense_dim(), a.shape, a._indices()[:, kept], values, coalesced)


@sparse_kernel(aten.mul.out)
def mul_out(self: torch.Tensor, other, *, out: torch.Tensor) -> torch.Tensor:
    if not isinstance(other, torch.Tensor) or not isinstance(self, torch.Tensor):  # a Python number
        sparse, number = (self, other) if isinstance(self, torch.Tensor) else (other, self)
        values = sparse._values() * number
        result = _make(sparse.sparse_dim(), sparse.dense_dim(), sparse.shape, sparse._indices().clone(), values,
                       sparse.is_coalesced())
    elif self.is_sparse and other.is_sparse:
        torch._check(self.shape == other.shape, lambda: (
            f"mul(sparse, sparse): sizes {list(self.shape)} and {list(other.shape)} differ"))
        result = _sparse_mul(self, other)
    elif other.is_sparse:
        result = _dense_mul(other, self)
    else:
        result = _dense_mul(self, other)
    return _into(out, result)


def _spmm(sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """sparse (m x k, COO) @ dense (k x n): each entry's row of `dense`, scaled, summed into its row."""
    dtype = torch.result_type(sparse, dense)
    rows, cols = sparse._indices()
    contributions = _promoted(sparse._values(), dtype).unsqueeze(1) * _promoted(dense, dtype)[cols]
    return _dense_zeros((sparse.shape[0], dense.shape[1]), dense, dtype).index_add_(0, rows, contributions)


def _addmm(self, mat1, mat2, beta, alpha):
    torch._check(mat1.dim() == 2 and mat2.dim() == 2, lambda: (
        f"addmm: matrices expected, got {mat1.dim()}D, {mat2.dim()}D tensors"))
    torch._check(mat1.shape[1] == mat2.shape[0], lambda: (
        f"mat1 and mat2 shapes cannot be multiplied ({mat1.shape[0]}x{mat1.shape[1]} and "
        f"{mat2.shape[0]}x{mat2.shape[1]})"))
    torch._check(mat1.is_sparse and not mat2.is_sparse and not self.is_sparse, lambda: (
        "addmm on neuron's sparse COO tensors takes a dense self, a sparse mat1 and a dense mat2"))
    product = _scaled(_spmm(mat1, mat2), alpha)
    if beta == 0:
        return product
    return product + _scaled(self.expand(product.shape), beta)


@sparse_kernel(aten.addmm.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _addmm(self, mat1, mat2, beta, alpha)


@sparse_kernel(aten.addmm.out)
def addmm_out(self, mat1, mat2, *, beta=1, alpha=1, out):
    return _into(out, _addmm(self, mat1, mat2, beta, alpha))


@sparse_kernel(aten.addmm_.default)
def addmm_(self, mat1, mat2, *, beta=1, alpha=1):
    return self.copy_(_addmm(self, mat1, mat2, beta, alpha))


def _bmm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """sparse (b x m x k, COO) @ dense (b x k x n): as _spmm, per batch."""
    torch._check(self.is_sparse and not mat2.is_sparse and self.dim() == 3 and mat2.dim() == 3
                 and self.dense_dim() == 0, lambda: "bmm on neuron's sparse COO tensors takes a 3-D sparse self "
                                                    "without dense dimensions and a 3-D dense mat2")
    torch._check(self.shape[0] == mat2.shape[0] and self.shape[2] == mat2.shape[1], lambda: (
        f"bmm: shapes {list(self.shape)} and {list(mat2.shape)} cannot be multiplied"))
    dtype = torch.result_type(self, mat2)
    batch, rows, cols = self._indices()
    b, m, n = self.shape[0], self.shape[1], mat2.shape[2]
    contributions = _promoted(self._values(), dtype).unsqueeze(1) * _promoted(mat2, dtype)[batch, cols]
    out = _dense_zeros((b * m, n), mat2, dtype).index_add_(0, batch * m + rows, contributions)
    return out.view(b, m, n)


@sparse_kernel(aten.bmm.default)
def bmm(self, mat2):
    return _bmm(self, mat2)


@sparse_kernel(aten.bmm.out)
def bmm_out(self, mat2, *, out):
    return _into(out, _bmm(self, mat2))


def _sspaddmm(self, mat1, mat2, beta, alpha) -> torch.Tensor:
    """beta * self + alpha * (mat1 @ mat2), sparse, laid out as CPU's: self's entries scaled, then for
    each row mat1 holds (in order), every column of that row of the product; never coalesced."""
    torch._check(self.is_sparse and mat1.is_sparse and not mat2.is_sparse and mat1.dim() == 2 and mat2.dim() == 2,
                 lambda: "sspaddmm takes a sparse self, a sparse 2-D mat1 and a dense 2-D mat2")
    torch._check(mat1.shape[1] == mat2.shape[0] and tuple(self.shape) == (mat1.shape[0], mat2.shape[1]), lambda: (
        f"sspaddmm: shapes {list(self.shape)}, {list(mat1.shape)} and {list(mat2.shape)} do not match"))
    dtype = torch.result_type(self, mat2)
    n = mat2.shape[1]
    indices, values = [self._indices()], [_scaled(_promoted(self._values(), dtype), beta)]
    rows, product = _held_rows_product(mat1, mat2, dtype)
    if rows.shape[0]:
        columns = torch.arange(n, device=rows.device)
        indices.append(torch.stack([rows.repeat_interleave(n), columns.repeat(rows.shape[0])]))
        values.append(_scaled(product, alpha).reshape(-1))
    return _make(2, 0, self.shape, torch.cat(indices, 1), torch.cat(values), False)


def _held_rows_product(mat1, mat2, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows sparse `mat1` holds (in order) and those rows of mat1 @ mat2."""
    m1 = mat1.coalesce()
    if m1._nnz() == 0:
        return m1._indices()[0], _dense_zeros((0, mat2.shape[1]), mat2, dtype)
    rows, cols = m1._indices()
    group, first, count = _groups(rows)
    contributions = _promoted(m1._values(), dtype).unsqueeze(1) * _promoted(mat2, dtype)[cols]
    return rows[first], _dense_zeros((count, mat2.shape[1]), mat2, dtype).index_add_(0, group, contributions)


def _hspmm(mat1, mat2) -> torch.Tensor:
    """mat1 @ mat2 as a hybrid COO tensor (one sparse dimension): the rows mat1 holds."""
    torch._check(mat1.is_sparse and mat1.dim() == 2 and mat1.dense_dim() == 0 and not mat2.is_sparse
                 and mat2.dim() == 2 and mat1.shape[1] == mat2.shape[0], lambda: (
                     f"hspmm: a 2-D sparse mat1 and a dense 2-D mat2 that multiply expected, got {list(mat1.shape)} "
                     f"and {list(mat2.shape)}"))
    rows, product = _held_rows_product(mat1, mat2, torch.result_type(mat1, mat2))
    return _make(1, 1, (mat1.shape[0], mat2.shape[1]), rows.unsqueeze(0).clone(), product, False)


@sparse_kernel(aten.hspmm.default)
def hspmm(mat1, mat2):
    return _hspmm(mat1, mat2)


@sparse_kernel(aten.hspmm.out)
def hspmm_out(mat1, mat2, *, out):
    return _into(out, _hspmm(mat1, mat2))


@sparse_kernel(aten.sspaddmm.out)
def sspaddmm_out(self, mat1, mat2, *, beta=1, alpha=1, out):
    return _into(out, _sspaddmm(self, mat1, mat2, beta, alpha))


@sparse_kernel(aten._sparse_sparse_matmul.default)
def sparse_sparse_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """COO @ COO: every pair (a's entry (i, k), b's entry (k, j)) joined by k, then coalesced."""
    torch._check(a.dim() == 2 and b.dim() == 2 and a.dense_dim() == 0 and b.dense_dim() == 0, lambda: (
        "sparse @ sparse: 2-D tensors without dense dimensions expected"))
    torch._check(a.shape[1] == b.shape[0], lambda: (
        f"mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and {b.shape[0]}x{b.shape[1]})"))
    dtype = torch.result_type(a, b)
    a, b = a.coalesce(), b.coalesce()
    size = (a.shape[0], b.shape[1])
    empty = _make(2, 0, size, _dense_zeros((2, 0), a._indices()), _dense_zeros((0,), a._values(), dtype), True)
    if a._nnz() == 0 or b._nnz() == 0:
        return empty
    a_rows, a_cols = a._indices()
    b_rows, b_cols = b._indices()  # sorted by row: b's entries of row k are one run
    per_row = torch.bincount(b_rows, minlength=b.shape[0])
    starts = torch.cumsum(per_row, 0) - per_row
    matches = per_row[a_cols]
    total = int(matches.sum().item())
    if total == 0:
        return empty
    pair_of = torch.repeat_interleave(torch.arange(a._nnz(), device=matches.device), matches, output_size=total)
    offset = torch.arange(total, device=matches.device) - (torch.cumsum(matches, 0) - matches)[pair_of]
    in_b = starts[a_cols[pair_of]] + offset
    indices = torch.stack([a_rows[pair_of], b_cols[in_b]])
    values = _promoted(a._values(), dtype)[pair_of] * _promoted(b._values(), dtype)[in_b]
    return coalesce(_make(2, 0, size, indices, values, False))


@sparse_kernel(aten.index_select.default)
def index_select(self: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """CPU's order: for each position j of `index`, the entries at coordinate index[j] along `dim`,
    in their stored order; never coalesced."""
    dim = dim + self.dim() if dim < 0 else dim
    sd, dd = self.sparse_dim(), self.dense_dim()
    indices, values = self._indices(), self._values()
    size = list(self.shape)
    size[dim] = index.numel()
    index = index.reshape(-1)
    if dim >= sd:
        return _make(sd, dd, size, indices.clone(), values.index_select(dim - sd + 1, index), self.is_coalesced())
    position, entry = (indices[dim].unsqueeze(0) == index.unsqueeze(1)).nonzero().unbind(1)
    picked = indices[:, entry].clone()
    picked[dim] = position
    return _make(sd, dd, size, picked, values[entry], False)


def _group_of(self: torch.Tensor, dim: int) -> tuple[torch.Tensor, int]:
    """Each entry's group: the entries that share every sparse coordinate but `dim`'s."""
    sd = self.sparse_dim()
    others = [d for d in range(sd) if d != dim]
    keys = _keys(self._indices()[others], [self.shape[d] for d in others])
    sorted_keys, order = torch.sort(keys, stable=True)
    group_sorted, _, count = _groups(sorted_keys)
    group = torch.empty_like(group_sorted).index_copy_(0, order, group_sorted)
    return group, count


def _segment(values: torch.Tensor, group: torch.Tensor, count: int, reduce: str) -> torch.Tensor:
    """Each group's sum or maximum of `values` (one row per entry): a segment reduction."""
    shape = (count, *values.shape[1:])
    if reduce == "sum":
        return _dense_zeros(shape, values).index_add_(0, group, values)
    index = group.view(-1, *([1] * (values.dim() - 1))).expand(values.shape)
    start = torch.full(shape, float("-inf"), dtype=values.dtype, device=values.device)
    return start.scatter_reduce_(0, index, values, "amax", include_self=True)


def _softmax(self: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    dim = dim + self.dim() if dim < 0 else dim
    x = self.coalesce()
    sd, dd = x.sparse_dim(), x.dense_dim()
    values = x._values()
    if x._nnz() == 0:
        result = values.clone()
    elif dim >= sd:
        f = torch.log_softmax if log else torch.softmax
        result = f(values, dim - sd + 1)
    else:
        group, count = _group_of(x, dim)
        shifted = values - _segment(values, group, count, "amax")[group]
        exp = shifted.exp()
        total = _segment(exp, group, count, "sum")[group]
        result = shifted - total.log() if log else exp / total
    return _make(sd, dd, x.shape, x._indices().clone(), result, True)


def _softmax_backward(grad: torch.Tensor, output: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    dim = dim + output.dim() if dim < 0 else dim
    out = output.coalesce()
    sd = out.sparse_dim()
    sizes = out.shape[:sd]
    g = grad.coalesce()
    pos, hit = _find(_keys(out._indices(), sizes), _keys(g._indices(), sizes))
    g_values = g._values()[pos] * hit.view(-1, *([1] * (g._values().dim() - 1)))
    y = out._values()
    if out._nnz() == 0:
        result = y.clone()
    elif dim >= sd:
        d = dim - sd + 1
        result = (g_values - y.exp() * g_values.sum(d, keepdim=True) if log
                  else y * (g_values - (g_values * y).sum(d, keepdim=True)))
    else:
        group, count = _group_of(out, dim)
        if log:
            result = g_values - y.exp() * _segment(g_values, group, count, "sum")[group]
        else:
            result = y * (g_values - _segment(g_values * y, group, count, "sum")[group])
    return _make(sd, out.dense_dim(), out.shape, out._indices().clone(), result, True)


@sparse_kernel(aten._sparse_softmax.default)
def sparse_softmax(self, dim, half_to_float):
    return _softmax(self, dim, log=False)


@sparse_kernel(aten._sparse_log_softmax.default)
def sparse_log_softmax(self, dim, half_to_float):
    return _softmax(self, dim, log=True)


@sparse_kernel(aten._sparse_softmax_backward_data.default)
def sparse_softmax_backward(grad_output, output, dim, self):
    return _softmax_backward(grad_output, output, dim, log=False)


@sparse_kernel(aten._sparse_log_softmax_backward_data.default)
def sparse_log_softmax_backward(grad_output, output, dim, self):
    return _softmax_backward(grad_output, output, dim, log=True)


@sparse_kernel(aten._sparse_sum_backward.default)
def sparse_sum_backward(grad: torch.Tensor, self: torch.Tensor, dim) -> torch.Tensor:
    """torch.sparse.sum's gradient: each entry of `self` takes the gradient at its coordinates
    without the summed dimensions."""
    sd, dd = self.sparse_dim(), self.dense_dim()
    dims = sorted({d + self.dim() if d < 0 else d for d in dim})
    sparse_summed = [d for d in dims if d < sd]
    kept = [d for d in range(sd) if d not in sparse_summed]
    dense_summed = [d - sd + 1 for d in dims if d >= sd]
    x = self.coalesce()
    indices = x._indices()
    if not kept:  # every sparse dimension summed: grad is dense, the dense dimensions left
        g = grad.to_dense() if grad.is_sparse else grad
        per_entry = g.unsqueeze(0).expand(x._nnz(), *g.shape)
    else:
        g = grad.coalesce()
        sizes = [self.shape[d] for d in kept]
        pos, hit = _find(_keys(indices[kept], sizes), _keys(g._indices()[:len(kept)], sizes))
        gv = g._values()
        per_entry = gv[pos] * hit.view(-1, *([1] * (gv.dim() - 1)))
    for d in dense_summed:
        per_entry = per_entry.unsqueeze(d)
    values = per_entry.expand(x._nnz(), *self.shape[sd:]).clone()
    return _make(sd, dd, self.shape, indices.clone(), values.to(self.dtype), True)


def _at(self: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The values of sparse `self` at `mask`'s entries (duplicates of `self` summed), zero elsewhere."""
    x = self.coalesce()
    sizes = self.shape[:self.sparse_dim()]
    pos, hit = _find(_keys(mask._indices(), sizes), _keys(x._indices(), sizes))
    values = x._values()
    if values.shape[0] == 0:
        return _dense_zeros((mask._nnz(), *values.shape[1:]), values)
    return values[pos] * hit.view(-1, *([1] * (values.dim() - 1)))


@sparse_kernel(aten.sparse_mask.default)
def sparse_mask(self: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`self`'s values at `mask`'s entries, on `mask`'s indices."""
    torch._check(self.shape == mask.shape, lambda: "sparse_mask(): operands have incompatible sizes")
    indices = mask._indices()
    values = _at(self, mask) if self.is_sparse else self[tuple(indices)]
    return _make(mask.sparse_dim(), mask.dense_dim(), mask.shape, indices.clone(), values, mask.is_coalesced())


@sparse_kernel(aten._sparse_mask_projection.default)
def sparse_mask_projection(self: torch.Tensor, mask: torch.Tensor, accumulate_matches: bool = False) -> torch.Tensor:
    return _make(mask.sparse_dim(), mask.dense_dim(), mask.shape, mask._indices().clone(), _at(self, mask),
                 mask.is_coalesced())


def dense_to_sparse(self: torch.Tensor, sparse_dim: int | None = None) -> torch.Tensor:
    """A dense neuron tensor as COO: the coordinates (over the first `sparse_dim` dimensions) where
    any value is nonzero, in order; coalesced."""
    sd = self.dim() if sparse_dim is None else sparse_dim
    torch._check(0 < sd <= self.dim() or (sd == 0 and self.dim() == 0), lambda: (
        f"sparse_dim argument must be in [1, {self.dim()}] but got {sd}"))
    nonzero = self != 0
    if sd < self.dim():
        nonzero = nonzero.flatten(sd).any(-1)
    indices = nonzero.nonzero().t().contiguous()
    return _make(sd, self.dim() - sd, self.shape, indices, self[tuple(indices)], True)


def _dense_to_sparse_layout(self, *, layout=None, blocksize=None, dense_dim=None):
    if layout not in (None, torch.sparse_coo):
        raise NotImplementedError(f"aten::_to_sparse is not supported on neuron for layout {layout}: neuron has "
                                  "sparse COO tensors only (docs/SPARSE.md); convert with x.to_sparse() or run it "
                                  "on CPU")
    return dense_to_sparse(self, self.dim() - (dense_dim or 0))


redirected(dense_to_sparse, aten._to_sparse.sparse_dim)
redirected(_dense_to_sparse_layout, aten._to_sparse.default)
