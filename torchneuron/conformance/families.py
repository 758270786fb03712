"""A simple name-based map from OpInfos to op families, matching the lowering table's families."""
from __future__ import annotations

import fnmatch

_BY_PREFIX = [("linalg.", "linalg"), ("fft.", "fft"), ("special.", "special"), ("masked.", "masked"),
              ("signal.", "factories"), ("sparse.", "sparse"), ("nn.functional.", "nn")]
_BY_CLASS = {"UnaryUfuncInfo": "elementwise", "BinaryUfuncInfo": "elementwise",
             "ReductionOpInfo": "reductions", "SpectralFuncInfo": "fft", "ShapeFuncInfo": "shape"}
_BY_NAME = {
    "random": ["bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal*",
               "uniform", "rand*"],
    "factories": ["arange", "linspace*", "logspace*", "zeros*", "ones*", "full*", "empty*", "new_*", "eye",
                  "scalar_tensor", "tril_indices", "triu_indices"],
    "indexing": ["gather", "scatter*", "index_*", "take*", "put", "masked_*", "__getitem__", "_unsafe_masked*",
                 "nonzero*", "argwhere", "where", "searchsorted", "bucketize", "unique*", "_segment_reduce*"],
    "linalg": ["*mm", "*mm.*", "mv", "addmv", "addr", "addbmm", "baddbmm", "dot", "vdot", "matmul", "__rmatmul__",
               "outer", "inner", "einsum", "tensordot", "kron", "cholesky*", "lu*", "qr", "svd*", "geqrf",
               "ormqr", "triangular_solve", "pinverse", "logdet", "matrix_exp", "trace", "cdist", "dist",
               "block_diag", "chain_matmul", "pca_lowrank"],
    "reductions": ["cum*", "logcumsumexp", "max.reduction*", "min.reduction*", "argmax", "argmin", "sort", "argsort", "msort", "topk", "kthvalue",
                   "median", "nanmedian", "mode", "quantile", "nanquantile", "var*", "std*", "norm*",
                   "logsumexp", "histc", "histogram*", "bincount", "aminmax", "equal", "allclose",
                   "softmax*", "log_softmax*", "_softmax_backward_data", "hash_tensor", "trapz", "trapezoid",
                   "cumulative_trapezoid", "diff", "gradient", "cov", "corrcoef"],
    "shape": ["view*", "reshape*", "permute*", "transpose*", "t", "t_copy", "T", "H", "mT", "mH", "expand*",
              "broadcast_*", "*squeeze*", "flatten", "unflatten", "ravel", "narrow*", "select*", "slice*",
              "split*", "unsafe_split", "*chunk", "tensor_split", "?split", "cat", "*stack", "unbind*",
              "movedim", "flip*", "roll", "rot90", "repeat", "tile", "as_strided*", "diag*", "tril", "triu",
              "atleast_*", "meshgrid*", "unfold*", "alias_copy", "clone", "contiguous", "to", "bfloat16",
              "bool", "byte", "char", "double", "float", "half", "int", "long", "short", "c*float", "cdouble",
              "chalf", "conj*", "resolve_*", "real", "imag", "fill", "zero_", "resize_*", "sum_to_size",
              "combinations", "cartesian_prod", "item", "unravel_index", "constant_pad_nd"],
    "nn": ["native_*", "_native_batch_norm_legit", "_batch_norm_with_update",
           "max_pool2d_with_indices_backward", "grid_sampler_*", "_upsample_*", "native_dropout_backward",
           "torch.ops.aten.*", "torch._scaled_mm*", "_chunk_cat"],
}


def family(op) -> str:
    name = op.name
    for prefix, fam in _BY_PREFIX:
        if name.startswith(prefix):
            return fam
    if name.startswith("_foreach"):
        return "foreach"
    for fam, patterns in _BY_NAME.items():
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return fam
    # the remaining plain OpInfos are elementwise (addcmul, clamp, lerp, polar, ...)
    return _BY_CLASS.get(type(op).__name__, "elementwise")
