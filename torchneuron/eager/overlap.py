"""PyTorch's memory-overlap rules for written tensors (ATen's MemoryOverlap), on layouts.

The meta kernels cannot see overlap (meta storages have no addresses), so the driver checks
written tensors itself and raises PyTorch's own errors.
"""
from __future__ import annotations

from ..runtime.layout import Layout

INTERNAL = ("unsupported operation: more than one element of the written-to tensor refers to a single "
            "memory location. Please clone() the tensor before performing the operation.")
PARTIAL = ("unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
           "single memory location. Please clone() the tensor before performing the operation.")


def _dense(layout: Layout) -> bool:
    return layout.dense_order() is not None


def has_internal_overlap(layout: Layout) -> bool:
    if layout.numel == 0 or _dense(layout):
        return False
    return any(s == 0 and n > 1 for n, s in zip(layout.shape, layout.stride))


def partial_overlap(a: Layout, b: Layout) -> bool:
    """True where ATen's get_overlap_status says PARTIAL for two tensors of one storage."""
    if a.numel == 0 or b.numel == 0 or not _dense(a) or not _dense(b):
        return False
    a_start, a_end = a.offset, a.offset + a.numel
    b_start, b_end = b.offset, b.offset + b.numel
    if a_start == b_start and a_end == b_end:
        # full overlap (the in-place case, allowed) only with the same strides, as ATen compares
        # them: a 0-dim view of a one-element tensor's element, or another stride of a size-1
        # dimension, covers the same bytes and is still partial
        return a.stride != b.stride
    return a_start < b_end and b_start < a_end


def check(layouts: list[Layout], groups: list[int], written: set[int], itemsizes: list[int]) -> None:
    for w in written:
        if has_internal_overlap(layouts[w]):
            raise RuntimeError(INTERNAL)
        for r in range(len(layouts)):
            if r in written or groups[r] != groups[w] or itemsizes[r] != itemsizes[w]:
                continue
            if partial_overlap(layouts[w], layouts[r]):
                raise RuntimeError(PARTIAL)
