"""Asserts a program makes on its own values (`torch._assert_async`, torchtitan's RoPE check in
every forward): checked on the device like an index bound, raised at the next synchronisation
(at the call with TORCHNEURON_LAUNCH_BLOCKING=1), never a host sync per call."""
from __future__ import annotations

import torch

from . import lowers, refuses
from .asserts import device_assert

aten = torch.ops.aten

NONZERO = "Expected Tensor with single nonzero value, but got zero"  # CPU's and CUDA's message


def _one_value(self, assert_msg=None) -> None:
    torch._check(self.numel() != 0, lambda: "Boolean value of Tensor with no values is ambiguous")
    torch._check(self.numel() <= 1, lambda: "Boolean value of Tensor with more than one value is ambiguous")


refuses(_one_value, aten._assert_async.default, aten._assert_async.msg)


@lowers(aten._assert_async.default, aten._assert_async.msg, checks=True)
def assert_async(self, assert_msg=None):
    device_assert(self != 0, assert_msg or NONZERO)
    return ()
