"""One record per op: each registered overload has exactly one record, everything registered about
it is on that record, and each fact names something that exists (an argument of the op's schema, an
overload the table lowers, a kernel the dispatcher has)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import torchneuron  # noqa: F401  (registers the kernels)
from torchneuron import lowering
from torchneuron.lowering import NO_RECORD, RECORDS, Facet, OpRecord, record_of
from torchneuron.lowering.collectives import Collective

lowering.load_all()
aten = torch.ops.aten
FACTS = [f.name for f in dataclasses.fields(OpRecord) if f.name != "op"]


def _has_kernel(op, key="PrivateUse1") -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)


def test_each_op_has_one_record_that_holds_something():
    assert all(found.op is op for op, found in RECORDS.items())
    empty = [op for op, found in RECORDS.items()
             if all(getattr(found, f) in (None, (), []) for f in FACTS)]
    assert not empty, f"records with nothing on them: {empty}"
    assert record_of(aten.add.Tensor) is RECORDS[aten.add.Tensor]
    assert record_of(object()) is NO_RECORD and all(getattr(NO_RECORD, f) in (None, (), []) for f in FACTS)


def test_the_tables_the_drivers_read_are_views_of_the_records():
    assert lowering.LOWERINGS[aten.add.Tensor] is RECORDS[aten.add.Tensor].lowering
    assert set(lowering.LOWERINGS) == {op for op, r in RECORDS.items() if r.lowering is not None}
    assert set(lowering.META_OVERRIDES) == {op for op, r in RECORDS.items() if r.meta is not None}
    assert aten.add.Tensor not in Facet("refused") and aten.quantize_per_tensor.default in Facet("refused")


def test_a_second_lowering_of_an_op_is_refused():
    with pytest.raises(ValueError, match="lowered twice"):
        lowering.lowers(aten.add.Tensor)(lambda self, other, alpha=1: self)
    with pytest.raises(ValueError, match="two meta overrides"):
        lowering.overrides_meta(aten._fused_sgd.default)(lambda *a, **k: None)


def test_argument_rules_are_one_registry_reached_from_the_record():
    # index_add's dtype rule (CPU's, not PyTorch's meta kernel's) is a refusal of each overload
    for op in (aten.index_add.default, aten.index_add_.default, aten.index_add.out):
        assert RECORDS[op].refusals, op
    x = torch.ones(3, 2)
    with pytest.raises(RuntimeError, match="must have the same scalar type"):
        lowering.run_meta(aten.index_add.default, (x.to("meta"), 0, torch.tensor([0, 1], device="meta"),
                                                    torch.ones(2, 2, dtype=torch.float64, device="meta")), {})
    with pytest.raises(RuntimeError, match="must have the same scalar type"):
        torch.index_add(x.to("neuron"), 0, torch.tensor([0, 1], device="neuron"),
                        torch.ones(2, 2, dtype=torch.float64, device="neuron"))


def _computed_by(op):
    """The lowering that computes `op`'s values: its own, or its functional's (an in-place op's)."""
    from torchneuron.eager.schema import parse
    return record_of(op).lowering or record_of(parse(op).functional).lowering


def _named(op, names) -> bool:
    arguments = {a.name for a in op._schema.arguments}
    return set(names) <= arguments


def test_every_fact_names_what_exists():
    problems = []
    for op, found in RECORDS.items():
        if found.host_operands and not _named(op, found.host_operands):
            problems.append(f"{op}: host operands {found.host_operands} are not its arguments")
        for target, what in ((found.functional, "functional"), (found.runs_as, "runs_as")):
            if target is not None and _computed_by(target) is None:
                problems.append(f"{op}: its {what} {target} has no lowering")
        if found.out_from is not None and not _has_kernel(found.out_from):
            problems.append(f"{op}: it runs {found.out_from}, which has no neuron kernel")
        if found.true_shapes is not None and found.lowering is None:
            problems.append(f"{op}: a size rule without a lowering")
        if found.autocast not in (None, "lower", "fp32", "promote"):
            problems.append(f"{op}: autocast class {found.autocast!r}")
        if found.refused is not None and found.lowering is not None:
            problems.append(f"{op}: both lowered and refused")
        if found.collective is not None and not isinstance(found.collective, Collective):
            problems.append(f"{op}: collective {found.collective!r}")
        if (found.refused is not None or found.redirect is not None or found.out_from is not None
                or found.runs_as is not None) and not _has_kernel(op):
            problems.append(f"{op}: its record gives it a neuron kernel, and it has none")
    assert not problems, "\n".join(problems)


def test_a_padding_rule_sits_on_an_op_the_table_computes():
    # (or one a graph holds before decomposition: zeros_like)
    from torch._decomp import core_aten_decompositions
    decomposed = core_aten_decompositions()
    orphans = [op for op, found in RECORDS.items()
               if found.padding is not None and _computed_by(op) is None and op not in decomposed]
    assert not orphans, f"padding rules for ops nothing lowers: {orphans}"
