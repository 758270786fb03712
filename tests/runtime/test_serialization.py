"""torch.save / torch.load of neuron tensors and state dicts."""
import io

import torch
from torch import nn


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_tensor_roundtrip_keeps_device_and_values():
    x = torch.randn(3, 4).to("neuron:1")
    y = _roundtrip(x)
    assert y.device == torch.device("neuron:1")
    torch.testing.assert_close(y.cpu(), x.cpu())


def test_views_keep_sharing_their_storage():
    x = torch.randn(4, 4).to("neuron")
    a, b = _roundtrip([x, x.t()[1:]])
    assert b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    torch.testing.assert_close(b.cpu(), x.t()[1:].cpu())


def test_state_dict_with_map_location():
    model = nn.Linear(4, 3).to("neuron")
    state = _roundtrip(model.state_dict(), map_location="cpu")
    assert all(v.device.type == "cpu" for v in state.values())
    fresh = nn.Linear(4, 3)
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.weight, model.weight.cpu())
    moved = _roundtrip(nn.Linear(2, 2).state_dict(), map_location="neuron:1")
    assert all(v.device == torch.device("neuron:1") for v in moved.values())
