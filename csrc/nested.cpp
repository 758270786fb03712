// Strided-layout NestedTensor on neuron: the NestedTensorPrivateUse1 kernels that are ATen's own
// device-agnostic code.
//
// A strided nested tensor (`torch.nested.nested_tensor(...)`, the default layout) is a NestedTensorImpl:
// one dense buffer plus CPU tensors of per-component sizes, strides and offsets. Its dispatch key on
// neuron is NestedTensorPrivateUse1, which PyTorch serves only for CPU, CUDA and HPU. The kernels below
// are the functions native_functions.yaml names for NestedTensorCPU (most on the same line as
// NestedTensorCUDA): they read the CPU metadata on the host and compute on the buffer with dense ops,
// which dispatch to neuron's kernels (bmm and to_padded_tensor are NestedTensorCPU-only lines that are
// generic too). Entries that loop over the buffer's host memory or call CPU kernel stubs
// (sum.dim_IntList, the fused transformer kernels) are left out, and so is every op CPU lacks: such a
// call meets the fallback at the bottom, a NotImplementedError naming the op and the layout. Layer
// norm, whose CPU kernels call CPU's kernel stub, is written here over the buffer.
// The jagged layout is a Python subclass over dense tensors and needs nothing here
// (torchneuron/integrations/nested.py, torchneuron/lowering/nested.py).
#include <ATen/ops/_nested_from_padded_native.h>
#include <ATen/ops/_nested_from_padded_and_nested_example_native.h>
#include <ATen/ops/_nested_select_backward_native.h>
#include <ATen/ops/_nested_tensor_from_mask_native.h>
#include <ATen/ops/_nested_tensor_from_mask_left_aligned_native.h>
#include <ATen/ops/_nested_tensor_size_native.h>
#include <ATen/ops/_nested_tensor_storage_offsets_native.h>
#include <ATen/ops/_nested_tensor_strides_native.h>
#include <ATen/ops/_nested_view_from_buffer_native.h>
#include <ATen/ops/_safe_softmax_native.h>
#include <ATen/ops/_softmax_native.h>
#include <ATen/ops/_softmax_backward_data_native.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/abs_native.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/alias_native.h>
#include <ATen/ops/all_native.h>
#include <ATen/ops/bmm_native.h>
#include <ATen/ops/cat_native.h>
#include <ATen/ops/chunk_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/cos_native.h>
#include <ATen/ops/detach_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/embedding_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/eq_native.h>
#include <ATen/ops/fill_native.h>
#include <ATen/ops/ge_native.h>
#include <ATen/ops/gelu_native.h>
#include <ATen/ops/gelu_backward_native.h>
#include <ATen/ops/gt_native.h>
#include <ATen/ops/is_same_size_native.h>
#include <ATen/ops/isinf_native.h>
#include <ATen/ops/isnan_native.h>
#include <ATen/ops/isneginf_native.h>
#include <ATen/ops/isposinf_native.h>
#include <ATen/ops/linear_native.h>
#include <ATen/ops/linear_backward_native.h>
#include <ATen/ops/logical_not_native.h>
#include <ATen/ops/masked_fill_native.h>
#include <ATen/ops/matmul_native.h>
#include <ATen/ops/matmul_backward_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/narrow_native.h>
#include <ATen/ops/native_dropout_native.h>
#include <ATen/ops/native_dropout_backward_native.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/normal_native.h>
#include <ATen/ops/ones_like_native.h>
#include <ATen/ops/relu_native.h>
#include <ATen/ops/select_native.h>
#include <ATen/ops/sgn_native.h>
#include <ATen/ops/silu_native.h>
#include <ATen/ops/silu_backward_native.h>
#include <ATen/ops/sin_native.h>
#include <ATen/ops/split_with_sizes_native.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/ops/squeeze_native.h>
#include <ATen/ops/sub_native.h>
#include <ATen/ops/tanh_native.h>
#include <ATen/ops/threshold_backward_native.h>
#include <ATen/ops/to_padded_tensor_native.h>
#include <ATen/ops/transpose_native.h>
#include <ATen/ops/unbind_native.h>
#include <ATen/ops/unsqueeze_native.h>
#include <ATen/ops/value_selecting_reduction_backward_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/where_native.h>
#include <ATen/ops/zero_native.h>
#include <ATen/Context.h>
#include <ATen/native/nested/NestedTensorMath.h>
#include <ATen/native/nested/NestedTensorUtils.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <ATen/SDPBackend.h>
#include <torch/library.h>

namespace {

// The math path is the one SDPA path for nested tensors on neuron (CPU's choice for them too).
int64_t nested_fused_sdp_choice(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const std::optional<at::Tensor>&, double, bool, std::optional<double>, bool) {
  return static_cast<int64_t>(at::globalContext().userEnabledMathSDP() ? at::SDPBackend::math
                                                                       : at::SDPBackend::error);
}

// Layer norm over trailing regular dimensions of a contiguous nested tensor is layer norm of its buffer
// as (rows, normalized numel) rows; mean and rstd stay dense (rows, 1), as the backward below reads them.
at::Tensor buffer_rows(const at::Tensor& nested, int64_t n) {
  auto* impl = at::native::get_nested_tensor_impl(nested);
  TORCH_CHECK(at::native::nested_tensor_impl_is_contiguous(impl), "NestedTensor layer_norm needs a contiguous input");
  return impl->get_buffer().view({-1, n});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> nested_layer_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                                  const std::optional<at::Tensor>& weight,
                                                                  const std::optional<at::Tensor>& bias, double eps) {
  TORCH_CHECK(weight && weight->defined() && bias && bias->defined(), "NestedTensor layer_norm requires weight and bias");
  auto* impl = at::native::get_nested_tensor_impl(input);
  const int64_t n = at::native::_check_nested_layer_norm_inputs(*impl, normalized_shape, *weight, *bias).second;
  auto [out, mean, rstd] = at::native_layer_norm(buffer_rows(input, n), {n}, weight->reshape({n}), bias->reshape({n}), eps);
  return {at::native::wrap_buffer(out.view(-1), impl->get_nested_sizes().clone()), mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> nested_layer_norm_backward(
    const at::Tensor& grad, const at::Tensor& input, at::IntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    std::array<bool, 3> mask) {
  const int64_t n = c10::multiply_integers(normalized_shape);
  auto reshaped = [n](const std::optional<at::Tensor>& t) {
    return t && t->defined() ? std::optional<at::Tensor>(t->reshape({n})) : std::nullopt;
  };
  auto [grad_input, grad_weight, grad_bias] = at::native_layer_norm_backward(
      buffer_rows(grad.contiguous(), n), buffer_rows(input, n), {n}, mean, rstd, reshaped(weight), reshaped(bias), mask);
  auto* impl = at::native::get_nested_tensor_impl(input);
  return {grad_input.defined() ? at::native::wrap_buffer(grad_input.view(-1), impl->get_nested_sizes().clone()) : grad_input,
          grad_weight.defined() ? grad_weight.view(weight->sizes()) : grad_weight,
          grad_bias.defined() ? grad_bias.view(bias->sizes()) : grad_bias};
}

void refuse_nested(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "neuron: ", op.schema().operator_name(),
                              " is not supported on nested tensors of layout torch.strided (NestedTensorneuron). "
                              "Use layout=torch.jagged, or convert with torch.nested.to_padded_tensor.");
}

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("native_dropout", TORCH_FN(at::native::native_dropout_nested));
  m.impl("native_dropout_backward", TORCH_FN(at::native::native_dropout_backward));
  m.impl("abs", TORCH_FN(at::native::NestedTensor_abs));
  m.impl("abs_", TORCH_FN(at::native::NestedTensor_abs_));
  m.impl("sgn", TORCH_FN(at::native::NestedTensor_sgn));
  m.impl("sgn_", TORCH_FN(at::native::NestedTensor_sgn_));
  m.impl("add.Tensor", TORCH_FN(at::native::NestedTensor_add_Tensor));
  m.impl("add_.Tensor", TORCH_FN(at::native::NestedTensor_add__Tensor));
  m.impl("all.dim", TORCH_FN(at::native::NestedTensor_all));
  m.impl("logical_not", TORCH_FN(at::native::NestedTensor_logical_not));
  m.impl("logical_not_", TORCH_FN(at::native::NestedTensor_logical_not_));
  m.impl("bmm", TORCH_FN(at::native::bmm_nested));
  m.impl("cat", TORCH_FN(at::native::cat_nested));
  m.impl("chunk", TORCH_FN(at::native::chunk_nested_tensor));
  m.impl("copy_", TORCH_FN(at::native::copy_nested_));
  m.impl("cos", TORCH_FN(at::native::NestedTensor_cos));
  m.impl("div.Tensor", TORCH_FN(at::native::NestedTensor_div_Tensor));
  m.impl("div.Scalar", TORCH_FN(at::native::NestedTensor_div_Scalar));
  m.impl("embedding", TORCH_FN(at::native::NestedTensor_embedding));
  m.impl("empty_like", TORCH_FN(at::native::empty_like_nested));
  m.impl("fill_.Scalar", static_cast<at::Tensor& (*)(at::Tensor&, const at::Scalar&)>(at::native::fill_nested_));
  m.impl("fill_.Tensor", static_cast<at::Tensor& (*)(at::Tensor&, const at::Tensor&)>(at::native::fill_nested_));
  m.impl("isnan", TORCH_FN(at::native::NestedTensor_isnan));
  m.impl("is_same_size", TORCH_FN(at::native::nested_is_same_size));
  m.impl("linear", TORCH_FN(at::native::nested_linear));
  m.impl("linear_backward", TORCH_FN(at::native::nested_linear_backward));
  m.impl("matmul", TORCH_FN(at::native::matmul_nested));
  m.impl("matmul_backward", TORCH_FN(at::native::matmul_backward_nested));
  m.impl("matmul.out", TORCH_FN(at::native::matmul_out_nested));
  m.impl("value_selecting_reduction_backward", TORCH_FN(at::native::value_selecting_reduction_backward_nested_symint));
  m.impl("mul.Tensor", TORCH_FN(at::native::NestedTensor_mul_Tensor));
  m.impl("mul_.Tensor", TORCH_FN(at::native::NestedTensor_mul__Tensor));
  m.impl("mul.Scalar", TORCH_FN(at::native::NestedTensor_mul_Scalar));
  m.impl("mul_.Scalar", TORCH_FN(at::native::NestedTensor_mul__Scalar));
  m.impl("narrow", TORCH_FN(at::native::narrow_nested_symint));
  m.impl("ones_like", TORCH_FN(at::native::ones_like));
  m.impl("neg", TORCH_FN(at::native::NestedTensor_neg));
  m.impl("neg_", TORCH_FN(at::native::NestedTensor_neg_));
  m.impl("relu", TORCH_FN(at::native::NestedTensor_relu));
  m.impl("relu_", TORCH_FN(at::native::NestedTensor_relu_));
  m.impl("gelu_", TORCH_FN(at::native::NestedTensor_gelu_));
  m.impl("gelu", TORCH_FN(at::native::NestedTensor_gelu));
  m.impl("gelu_backward", TORCH_FN(at::native::gelu_backwards_nested));
  m.impl("select.int", TORCH_FN(at::native::select_nested));
  m.impl("_nested_select_backward", TORCH_FN(at::native::_nested_select_backward_symint));
  m.impl("silu", TORCH_FN(at::native::NestedTensor_silu));
  m.impl("silu_", TORCH_FN(at::native::NestedTensor_silu_));
  m.impl("silu_backward", TORCH_FN(at::native::silu_backward_nested));
  m.impl("sin", TORCH_FN(at::native::NestedTensor_sin));
  m.impl("detach", TORCH_FN(at::native::detach));
  m.impl("_softmax", TORCH_FN(at::native::softmax_nested));
  m.impl("_softmax_backward_data", TORCH_FN(at::native::nested_softmax_backward));
  m.impl("split_with_sizes", TORCH_FN(at::native::split_with_sizes_nested));
  m.impl("squeeze", TORCH_FN(at::native::squeeze_nested));
  m.impl("squeeze.dim", static_cast<at::Tensor (*)(const at::Tensor&, int64_t)>(at::native::squeeze_dim_nested));
  m.impl("squeeze.dims", static_cast<at::Tensor (*)(const at::Tensor&, at::IntArrayRef)>(at::native::squeeze_dim_nested));
  m.impl("sqrt", TORCH_FN(at::native::NestedTensor_sqrt));
  m.impl("tanh", TORCH_FN(at::native::NestedTensor_tanh));
  m.impl("tanh_", TORCH_FN(at::native::NestedTensor_tanh_));
  m.impl("threshold_backward", TORCH_FN(at::native::threshold_backwards_nested));
  m.impl("transpose.int", TORCH_FN(at::native::transpose_nested));
  m.impl("_nested_tensor_size", TORCH_FN(at::native::_nested_tensor_size));
  m.impl("_nested_tensor_strides", TORCH_FN(at::native::_nested_tensor_strides));
  m.impl("_nested_tensor_storage_offsets", TORCH_FN(at::native::_nested_tensor_storage_offsets));
  m.impl("_nested_from_padded_and_nested_example", TORCH_FN(at::native::NestedTensor_from_padded_and_nested_example));
  m.impl("unsqueeze", TORCH_FN(at::native::unsqueeze_nested));
  m.impl("where.self", TORCH_FN(at::native::NestedTensor_where));
  m.impl("where.self_out", TORCH_FN(at::native::NestedTensor_where_out));
  m.impl("clone", TORCH_FN(at::native::clone_nested));
  m.impl("zero_", TORCH_FN(at::native::zero_nested_));
  m.impl("sub.Tensor", TORCH_FN(at::native::NestedTensor_sub_Tensor));
  m.impl("values", TORCH_FN(at::native::values_nested));
  m.impl("unbind.int", TORCH_FN(at::native::NestedTensor_unbind));
  m.impl("_to_copy", TORCH_FN(at::native::_to_copy_nested));
  m.impl("masked_fill.Scalar", TORCH_FN(at::native::NestedTensor_masked_fill));
  m.impl("view", TORCH_FN(at::native::view_nested));
  m.impl("eq.Scalar", TORCH_FN(at::native::eq_scalar_nested));
  m.impl("eq.Tensor", TORCH_FN(at::native::eq_tensor_nested));
  m.impl("ge.Scalar", TORCH_FN(at::native::ge_scalar_nested));
  m.impl("gt.Scalar", TORCH_FN(at::native::gt_scalar_nested));
  m.impl("normal_", TORCH_FN(at::native::normal_nested_));
  m.impl("alias", TORCH_FN(at::native::alias_nested));
  m.impl("isinf", TORCH_FN(at::native::NestedTensor_isinf));
  m.impl("isposinf", TORCH_FN(at::native::NestedTensor_isposinf));
  m.impl("isneginf", TORCH_FN(at::native::NestedTensor_isneginf));
  m.impl("to_padded_tensor", TORCH_FN(at::native::NestedTensor_to_padded_tensor_generic));
  m.impl("_safe_softmax", TORCH_FN(at::native::_safe_softmax));
  m.impl("_fused_sdp_choice", nested_fused_sdp_choice);
  m.impl("native_layer_norm", nested_layer_norm);
  m.impl("native_layer_norm_backward", nested_layer_norm_backward);
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_nested>());
}

// Dense neuron tensors in, nested out: a view of a buffer, and padded or masked dense tensors packed.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_nested_view_from_buffer", TORCH_FN(at::native::_nested_view_from_buffer));
  m.impl("_nested_from_padded", TORCH_FN(at::native::nested_from_padded_generic));
  m.impl("_nested_tensor_from_mask", TORCH_FN(at::native::NestedTensor_nested_tensor_from_mask));
  m.impl("_nested_tensor_from_mask_left_aligned", TORCH_FN(at::native::NestedTensor_nested_tensor_from_mask_left_aligned));
}

}  // namespace
