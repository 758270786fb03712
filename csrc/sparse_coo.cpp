// Sparse COO tensors on neuron: the SparsePrivateUse1 kernels that are ATen's own device-agnostic code.
//
// A COO tensor on neuron is a SparseTensorImpl whose indices and values are ordinary dense neuron
// tensors. Its dispatch key is SparsePrivateUse1, which PyTorch serves only for SparseCPU, SparseCUDA
// and SparseMeta. The kernels below are the functions native_functions.yaml names for SparseCPU and
// SparseCUDA alike (one device-agnostic symbol on one dispatch line): construction, the structure
// queries, moves and resizes of the two dense tensors, and the element-wise ops that apply a dense op
// to the values of the coalesced tensor. Every dense op they reach dispatches to neuron's kernels.
// Kernels that compute over indices (coalesce, add, mul, sparse_mask, products, softmax, index_select,
// dense -> COO) are Python, built from dense neuron ops: torchneuron/sparse/.
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_to_dense_native.h>
#include <ATen/ops/_to_sparse_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/abs_native.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/any_native.h>
#include <ATen/ops/asin_native.h>
#include <ATen/ops/asinh_native.h>
#include <ATen/ops/atan_native.h>
#include <ATen/ops/atanh_native.h>
#include <ATen/ops/cat_native.h>
#include <ATen/ops/ceil_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/copy_sparse_to_sparse_native.h>
#include <ATen/ops/deg2rad_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/erf_native.h>
#include <ATen/ops/erfinv_native.h>
#include <ATen/ops/expm1_native.h>
#include <ATen/ops/floor_native.h>
#include <ATen/ops/floor_divide_native.h>
#include <ATen/ops/frac_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/isinf_native.h>
#include <ATen/ops/isnan_native.h>
#include <ATen/ops/isneginf_native.h>
#include <ATen/ops/isposinf_native.h>
#include <ATen/ops/log1p_native.h>
#include <ATen/ops/mm_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/mv_native.h>
#include <ATen/ops/nan_to_num_native.h>
#include <ATen/ops/narrow_copy_native.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/permute_native.h>
#include <ATen/ops/pow_native.h>
#include <ATen/ops/rad2deg_native.h>
#include <ATen/ops/relu_native.h>
#include <ATen/ops/resize_as_sparse_native.h>
#include <ATen/ops/round_native.h>
#include <ATen/ops/sgn_native.h>
#include <ATen/ops/sign_native.h>
#include <ATen/ops/signbit_native.h>
#include <ATen/ops/sin_native.h>
#include <ATen/ops/sinh_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/ops/sub_native.h>
#include <ATen/ops/sum_native.h>
#include <ATen/ops/tan_native.h>
#include <ATen/ops/tanh_native.h>
#include <ATen/ops/threshold_backward_native.h>
#include <ATen/ops/trunc_native.h>
#include <ATen/ops/unsqueeze_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/zero_native.h>
#include <ATen/ops/zeros_native.h>
#include <torch/library.h>

namespace {

// Unary ops whose sparse kernel is "coalesce, then the dense op on the values" (zero maps to zero).
#define NEURON_SPARSE_UNARY(op)                        \
  m.impl(#op, at::native::op##_sparse);                \
  m.impl(#op "_", at::native::op##_sparse_);           \
  m.impl(#op ".out", at::native::op##_sparse_out);

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  // construction
  m.impl("_sparse_coo_tensor_with_dims", at::native::new_with_dims_sparse);
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", at::native::new_with_dims_and_tensor_sparse_symint);
  m.impl("empty.memory_format", at::native::empty_sparse);
  m.impl("empty_like", at::native::empty_like_sparse_coo);
  m.impl("zeros.out", at::native::zeros_sparse_out);
  // structure
  m.impl("sparse_dim", at::native::sparse_dim_sparse);
  m.impl("dense_dim", at::native::dense_dim_sparse);
  m.impl("_dimI", at::native::sparse_dim_sparse);
  m.impl("_dimV", at::native::dense_dim_sparse);
  m.impl("_nnz", at::native::_nnz_sparse);
  m.impl("is_coalesced", at::native::is_coalesced_sparse);
  m.impl("_coalesced_", at::native::_coalesced_sparse_);
  m.impl("_indices", at::native::_indices_sparse);
  m.impl("_values", at::native::_values_sparse);
  m.impl("indices", at::native::indices_sparse);
  m.impl("values", at::native::values_sparse);
  // the two dense tensors moved, resized, cleared
  m.impl("clone", at::native::clone_sparse);
  m.impl("copy_", at::native::copy_sparse_wrapper_);
  m.impl("copy_sparse_to_sparse_", at::native::copy_sparse_);
  m.impl("zero_", at::native::zero_sparse_);
  m.impl("sparse_resize_", at::native::sparse_resize_);
  m.impl("sparse_resize_and_clear_", at::native::sparse_resize_and_clear_);
  m.impl("resize_as_sparse_", at::native::resize_as_sparse_);
  m.impl("_to_dense", at::native::sparse_to_dense);  // zeros, then add_ (dense += sparse)
  m.impl("_to_sparse.sparse_dim",
         static_cast<at::Tensor (*)(const at::Tensor&, int64_t)>(at::native::sparse_coo_to_sparse));
  m.impl("_to_sparse", static_cast<at::Tensor (*)(const at::Tensor&, std::optional<at::Layout>,
                                                   at::OptionalIntArrayRef, std::optional<int64_t>)>(
                           at::native::sparse_coo_to_sparse));
  m.impl("permute", at::native::permute_sparse_coo);
  m.impl("unsqueeze", at::native::unsqueeze_sparse);
  m.impl("narrow_copy", at::native::narrow_copy_sparse);
  m.impl("cat", at::native::cat_sparse);
  // arithmetic that forwards to add.out / mul.out (Python) or works on values
  m.impl("add.Tensor", at::native::add_sparse);
  m.impl("add_.Tensor", at::native::add_sparse_);
  m.impl("sub.Tensor", at::native::sub_sparse);
  m.impl("sub_.Tensor", at::native::sub_sparse_);
  m.impl("sub.out", at::native::sub_out_sparse);
  m.impl("mul.Tensor", at::native::mul_sparse);
  m.impl("mul_.Tensor", at::native::mul_sparse_);
  m.impl("div.Tensor", static_cast<at::Tensor (*)(const at::Tensor&, const at::Tensor&)>(at::native::div_sparse));
  m.impl("div_.Tensor", static_cast<at::Tensor& (*)(at::Tensor&, const at::Tensor&)>(at::native::div_sparse_));
  m.impl("div.out", static_cast<at::Tensor& (*)(const at::Tensor&, const at::Tensor&, at::Tensor&)>(
                        at::native::div_out_sparse_zerodim));
  m.impl("floor_divide", at::native::floor_divide_sparse);
  m.impl("floor_divide_.Tensor", at::native::floor_divide_sparse_);
  m.impl("floor_divide.out", at::native::floor_divide_out_sparse_zerodim);
  m.impl("pow.Tensor_Scalar", at::native::pow_sparse_scalar);
  m.impl("pow.Tensor_Scalar_out", at::native::pow_out_sparse_scalar);
  m.impl("neg", at::native::neg_sparse);
  m.impl("neg_", at::native::neg_sparse_);
  m.impl("neg.out", at::native::neg_out_sparse);
  NEURON_SPARSE_UNARY(abs)
  NEURON_SPARSE_UNARY(asin)
  NEURON_SPARSE_UNARY(asinh)
  NEURON_SPARSE_UNARY(atan)
  NEURON_SPARSE_UNARY(atanh)
  NEURON_SPARSE_UNARY(ceil)
  NEURON_SPARSE_UNARY(deg2rad)
  NEURON_SPARSE_UNARY(erf)
  NEURON_SPARSE_UNARY(erfinv)
  NEURON_SPARSE_UNARY(expm1)
  NEURON_SPARSE_UNARY(floor)
  NEURON_SPARSE_UNARY(frac)
  NEURON_SPARSE_UNARY(log1p)
  NEURON_SPARSE_UNARY(rad2deg)
  NEURON_SPARSE_UNARY(round)
  NEURON_SPARSE_UNARY(sgn)
  NEURON_SPARSE_UNARY(sign)
  NEURON_SPARSE_UNARY(sin)
  NEURON_SPARSE_UNARY(sinh)
  NEURON_SPARSE_UNARY(sqrt)
  NEURON_SPARSE_UNARY(tan)
  NEURON_SPARSE_UNARY(tanh)
  NEURON_SPARSE_UNARY(trunc)
  m.impl("relu", at::native::relu_sparse);
  m.impl("relu_", at::native::relu_sparse_);
  m.impl("nan_to_num", at::native::nan_to_num_sparse);
  m.impl("nan_to_num_", at::native::nan_to_num_sparse_);
  m.impl("nan_to_num.out", at::native::nan_to_num_sparse_out);
  m.impl("isnan", at::native::isnan_sparse);
  m.impl("isinf", at::native::isinf_sparse);
  m.impl("isposinf", at::native::isposinf_sparse);
  m.impl("isposinf.out", at::native::isposinf_sparse_out);
  m.impl("isneginf", at::native::isneginf_sparse);
  m.impl("isneginf.out", at::native::isneginf_sparse_out);
  m.impl("signbit", at::native::signbit_sparse);
  m.impl("signbit.out", at::native::signbit_sparse_out);
  m.impl("threshold_backward", at::native::threshold_backward_sparse);
  m.impl("threshold_backward.grad_input", at::native::threshold_backward_sparse_out);
  // reductions and products that reduce to the above
  m.impl("sum", at::native::sum_coo);
  m.impl("sum.dim_IntList", at::native::sum_sparse_coo);
  m.impl("any", at::native::any_sparse);
  m.impl("mm", at::native::_sparse_mm);  // -> addmm, or _sparse_sparse_matmul
  m.impl("mv", at::native::mv_sparse);
}

#undef NEURON_SPARSE_UNARY

}  // namespace
