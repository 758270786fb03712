import pytest
import torch
import torch.nn.functional as F

from tests.reference import check

pytestmark = pytest.mark.usefixtures("lowered_only")
aten = torch.ops.aten

MODES = ("sum", "mean", "max")
INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
OFFSETS = torch.tensor([0, 4, 4, 6])  # an empty bag, and bags of 4, 2 and 2


def bags(mode, offsets=OFFSETS, **kwargs):
    def run(weight, per_sample_weights=None):
        device = weight.device
        return F.embedding_bag(INDICES.to(device), weight, offsets.to(device), mode=mode,
                               per_sample_weights=per_sample_weights, **kwargs)
    return run


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
def test_modes_values_and_gradients(dtype, mode, padding_idx, scale_grad_by_freq):
    if mode == "max" and scale_grad_by_freq:
        pytest.skip("max mode ignores scale_grad_by_freq")
    check(bags(mode, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq),
          torch.randn(10, 3, dtype=dtype), grad=True)


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("offsets", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scale_grad_by_freq_with_repeated_indices(mode, offsets, weighted, dtype):
    # index 1 three times, indices after it in sorted order once each: CPU divides each group of
    # equal sorted indices by the count of the group's rank-th sorted index, as the backward must
    if weighted and mode != "sum":
        pytest.skip("per_sample_weights needs mode='sum'")
    indices = torch.tensor([3, 1, 1, 1, 4, 0])

    def run(weight, per_sample_weights=None):
        i = indices.to(weight.device)
        o = torch.tensor([0, 0, 3, 3, 6], device=weight.device) if offsets else None
        if not offsets:
            i = i.view(2, 3)
            per_sample_weights = None if per_sample_weights is None else per_sample_weights.view(2, 3)
        return F.embedding_bag(i, weight, o, mode=mode, scale_grad_by_freq=True,
                               per_sample_weights=per_sample_weights)
    args = (torch.randn(6, dtype=dtype),) if weighted else ()
    check(run, torch.arange(1.0, 11.0, dtype=dtype).view(5, 2), *args, grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_per_sample_weights_gradients(dtype, padding_idx):
    check(bags("sum", padding_idx=padding_idx), torch.randn(10, 3, dtype=dtype), torch.rand(8, dtype=dtype),
          grad=True)


@pytest.mark.parametrize("mode", MODES)
def test_include_last_offset(mode):
    check(bags(mode, include_last_offset=True, offsets=torch.tensor([0, 4, 4, 8])), torch.randn(10, 3), grad=True)
    # a last offset short of the end: CPU's fast path (float32 sums and means) stops the last bag there
    check(bags(mode, include_last_offset=True), torch.randn(10, 3))


@pytest.mark.parametrize("op", [aten._embedding_bag.default, aten._embedding_bag_forward_only.default])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("padding_idx", [-1, 2])
def test_auxiliary_outputs_as_cpu(op, mode, dtype, include_last_offset, padding_idx):
    # offset2bag (empty on CPU's summing fast path), bag sizes, max indices: shapes and values
    check(lambda w, i, o: op(w, i, o, False, mode, False, None, include_last_offset, padding_idx),
          torch.randn(10, 3, dtype=dtype), INDICES, OFFSETS)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_layouts_and_index_dtypes(mode):
    def run(w, i, o):
        return aten._embedding_bag(w, i, o, False, mode, False, None, False, -1)
    check(lambda w, i, o: run(w.t(), i, o), torch.randn(3, 10), INDICES, OFFSETS)
    check(lambda w, i, o: run(w[:, ::2], i, o), torch.randn(10, 6), INDICES, OFFSETS)
    check(run, torch.randn(10, 3), INDICES.int(), OFFSETS.int())
    check(run, torch.randn(10, 3), INDICES, OFFSETS.int())
    check(run, torch.randn(10, 3), torch.tensor([], dtype=torch.long), torch.tensor([0, 0]))


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("padding_idx", [-1, 1, 4])
def test_max_with_nan_and_ties(mode, padding_idx):
    # CPU keeps a bag's first row and replaces it only by strictly greater ones
    nan = float("nan")
    weight = torch.tensor([[1.0, 1.0], [1.0, nan], [2.0, 0.0], [2.0, 5.0], [nan, 7.0]])
    indices, offsets = torch.tensor([0, 1, 2, 3, 1, 1, 0, 4, 2]), torch.tensor([0, 4, 6, 7])
    check(lambda w, i, o: aten._embedding_bag(w, i, o, False, mode, False, None, False, padding_idx),
          weight, indices, offsets)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
def test_half_precision(dtype, mode):
    check(bags(mode), torch.randn(10, 4).to(dtype), grad=True, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("mode", MODES)
def test_two_dimensional_input_and_max_norm(mode):
    indices = torch.tensor([[1, 2, 4], [5, 4, 3]])
    check(lambda w: F.embedding_bag(indices.to(w.device), w, mode=mode), torch.randn(10, 3), grad=True)
    check(lambda w: (F.embedding_bag(indices.to(w.device), w, mode=mode, max_norm=1.0, norm_type=1.0), w),
          torch.randn(10, 3) * 2)


def test_embedding_max_norm_renormalises_rows_in_place():
    check(lambda w: (F.embedding(torch.tensor([[0, 2], [2, 5]], device=w.device), w, max_norm=1.5), w),
          torch.randn(8, 4) * 2)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("mode", MODES)
def test_compiled_graph(mode):
    # graphs record CUDA's auxiliary shapes for a non-CPU device; backward must read them
    check(torch.compile(bags(mode, include_last_offset=True, offsets=torch.tensor([0, 4, 4, 8])), backend="neuron"),
          torch.randn(10, 3), grad=True)
