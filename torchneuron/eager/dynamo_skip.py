"""Keep torch.compile's frame evaluator out of the eager kernels.

While Dynamo's frame hook is active (inside and around compiled regions) it would try to
trace every Python frame it meets, our kernels and JAX included. Marking the kernels' code
objects SKIP (recursively) runs them as plain Python at no per-call cost.
"""
from __future__ import annotations

from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

_SKIP_ALL = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)


def skip_recursively(*functions) -> None:
    for fn in functions:
        set_code_exec_strategy(getattr(fn, "__code__", fn), _SKIP_ALL)
