"""Eager bucketing (issue 14): an op whose calls grow along one size runs at that size's bucket,
exact against CPU, compiling O(log n) executables; refused where padding is unsafe. Also the
executables eager ops share across offsets and size-1 strides (`x[i]`, `ids[:, -1:]`)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchneuron
from torchneuron.eager import buckets
from torchneuron.lowering import padding, record_of
from torchneuron.runtime import deferred


@pytest.fixture(autouse=True)
def eager_buckets(monkeypatch):
    monkeypatch.setattr(torchneuron.config, "EAGER_BUCKETS", True)  # (whatever TORCHNEURON_EAGER_BUCKETS says)


def _misses() -> int:
    return torchneuron.cache_stats()["misses"]


def _grow(lengths, make, op):
    """op on neuron and on CPU for each length; returns the executables compiled on the way.
    `make(n)` gives (tensor, growing axis or None) pairs at length n; on neuron each growing input
    grows by `cat` as a cache does (so its buffer has a bucket's room), the others are uploaded."""
    before = _misses()
    grown = None
    for n in lengths:
        inputs = make(n)
        if grown is None:
            grown = [x.to("neuron") for x, _ in inputs]
        else:
            grown = [torch.cat([g, x.narrow(axis, g.shape[axis], x.shape[axis] - g.shape[axis]).to("neuron")], axis)
                     if axis is not None else g for g, (x, axis) in zip(grown, inputs)]
        expected = op(*[x for x, _ in inputs])
        got = op(*grown)
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
        assert got.stride() == expected.stride()
    return _misses() - before


def _seeded(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=dtype)


def _long(*shape, axis):
    """A prefix of a fixed random tensor along `axis`: the values at length n extend those at n - 1."""
    full = list(shape)
    full[axis] = 64
    return torch.randn(*full, generator=torch.Generator().manual_seed(7)).narrow(axis, 0, shape[axis])


# op, inputs at length n with their growing axis (every op of these runs bucketed after its
# second length)
RULES = {
    "add (broadcast)": (lambda x, y: x + y, lambda n: ((_long(3, n, axis=1), 1), (_seeded(3, 1), None))),
    "mul": (lambda x, y: x * y, lambda n: ((_long(n, 4, axis=0), 0), (_long(n, 4, axis=0) + 1, 0))),
    "sum over the axis": (lambda x: x.sum(-1), lambda n: ((_long(3, n, axis=1), 1),)),
    "mean over the axis": (lambda x: x.mean(-1, keepdim=True), lambda n: ((_long(2, n, axis=1), 1),)),
    "amax over the axis": (lambda x: x.amax(-1), lambda n: ((_long(2, n, axis=1) - 5, 1),)),
    "var over the axis": (lambda x: x.var(-1, correction=3), lambda n: ((_long(2, n, axis=1), 1),)),
    "softmax over the axis": (lambda x: torch.softmax(x, -1), lambda n: ((_long(2, n, axis=1), 1),)),
    "mm over the contracted axis": (lambda a, b: a @ b, lambda n: ((_long(3, n, axis=1), 1), (_long(n, 5, axis=0), 0))),
    "cat along the axis": (lambda a, b: torch.cat([a, b], 1),
                           lambda n: ((_long(2, n, 3, axis=1), 1), (_seeded(2, 1, 3), None))),
    "clone": (lambda x: x.clone(), lambda n: ((_long(2, n, axis=1), 1),)),
    "isin along its elements": (torch.isin, lambda n: (((_long(n, axis=0) * 3).round(), 0), (torch.tensor([0.0, 1.0]), None))),
}


@pytest.mark.parametrize("name", list(RULES))
def test_a_growing_axis_runs_bucketed_equal_to_cpu_with_few_executables(name):
    op, make = RULES[name]
    calls = buckets.STATS["calls"]
    compiled = _grow(range(5, 45), make, op)  # 40 lengths: buckets 8, 16, 32, 64
    assert buckets.STATS["calls"] - calls >= 35
    assert compiled <= 24, f"{compiled} executables for 40 lengths"


def test_a_dynamic_kv_cache_attention_runs_bucketed_equal_to_cpu():
    """The decode step of a model with a growing cache: cat onto the cache, attend over it."""
    q = _seeded(1, 2, 1, 8)
    k = _seeded(1, 2, 3, 8)
    v = _seeded(1, 2, 3, 4) + 1
    kn, vn, qn = k.to("neuron"), v.to("neuron"), q.to("neuron")
    before, calls = _misses(), buckets.STATS["calls"]
    for step in range(40):
        new_k, new_v = _seeded(1, 2, 1, 8 + step)[..., :8], _seeded(1, 2, 1, 4 + step)[..., :4]
        k, v = torch.cat([k, new_k], 2), torch.cat([v, new_v], 2)
        kn, vn = torch.cat([kn, new_k.to("neuron")], 2), torch.cat([vn, new_v.to("neuron")], 2)
        expected = F.scaled_dot_product_attention(q, k, v)
        got = F.scaled_dot_product_attention(qn, kn, vn)
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(kn.cpu(), k, rtol=0, atol=0)
    assert buckets.STATS["calls"] - calls >= 100
    assert _misses() - before <= 40  # (at exact sizes: 120)


def _bucketed_executables(op) -> int:
    plans = {id(p): p for p in buckets.BUCKETED_PLANS.values() if isinstance(p, buckets.BucketedPlan) and p.op is op}
    return sum(len(p.function.signatures) for p in plans.values())


def test_a_growing_cache_compiles_one_attention_and_one_cat_program_per_bucket():
    """A decode loop whose new keys are contiguous and new values a transposed view (strides of
    their size-1 axis differ): both caches share `cat`'s programs, and each cat leaves its cache
    room for the bucket its length falls in, so attention reads every cache of a bucket with one
    program. The step into a bucket widens the previous bucket's cache first (a small program per
    pair of lengths), so its `cat` is the program of the bucket's other steps."""
    heads, d = 3, 24
    q = _seeded(1, heads, 1, d)
    k = v = _seeded(1, heads, 2, d)
    qn, kn, vn = q.to("neuron"), k.to("neuron"), v.to("neuron")
    attention = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    before = {op: _bucketed_executables(op) for op in (attention, torch.ops.aten.cat.default)}
    lengths = range(3, 71)
    for n in lengths:
        new = _seeded(1, 1, heads * d + n)[..., :heads * d]
        new_k, new_v = new.view(1, 1, heads, d).transpose(1, 2).contiguous(), new.view(1, 1, heads, d).transpose(1, 2)
        k, v = torch.cat([k, new_k], 2), torch.cat([v, new_v * 2], 2)
        on_device = new.to("neuron").view(1, 1, heads, d).transpose(1, 2)
        kn, vn = torch.cat([kn, on_device.contiguous()], 2), torch.cat([vn, on_device * 2], 2)
        torch.testing.assert_close(F.scaled_dot_product_attention(qn, kn, vn).cpu(),
                                   F.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(vn.cpu(), v, rtol=0, atol=0)
    bucket_count = len({padding.bucket(n) for n in lengths})
    assert _bucketed_executables(attention) - before[attention] <= bucket_count
    assert _bucketed_executables(torch.ops.aten.cat.default) - before[torch.ops.aten.cat.default] <= bucket_count


def test_a_cache_widened_for_a_new_bucket_keeps_its_values_for_every_reader():
    """The first step of a bucket widens the cache it reads (its storage rebound to a longer
    buffer): that cache, kept by the caller, still reads, views and updates in place as on CPU."""
    k = _long(1, 2, 3, 4, axis=2)
    kn = k.to("neuron")
    kept = []
    for n in range(4, 20):
        new = _seeded(1, 2, 1, 4 + n)[..., :4]
        k, kn = torch.cat([k, new], 2), torch.cat([kn, new.to("neuron")], 2)
        kept.append((k, kn))
    for cpu, neuron in kept:
        torch.testing.assert_close(neuron.cpu(), cpu, rtol=0, atol=0)
    cpu, neuron = kept[4]  # (length 8: widened when length 9 was made from it)
    torch.testing.assert_close(neuron[:, 1, 2:5].cpu(), cpu[:, 1, 2:5], rtol=0, atol=0)
    cpu.mul_(3).add_(1)
    neuron.mul_(3).add_(1)
    torch.testing.assert_close(neuron.cpu(), cpu, rtol=0, atol=0)
    torch.testing.assert_close((neuron * 2).sum(2).cpu(), (cpu * 2).sum(2))
    torch.testing.assert_close(kept[5][1].cpu(), kept[5][0], rtol=0, atol=0)


def test_a_cache_of_many_rows_runs_bucketed_equal_to_cpu():
    """A cache with batch x heads = 24 rows of its growing axis: each row is read as one slice and
    written in turn at its true offset (a loop past 16 rows)."""
    calls = buckets.STATS["calls"]
    ops = (lambda k: torch.softmax(k * 2, dim=-2), lambda k: k.sum(-1), lambda k: k.amax(-2, keepdim=True))
    for op in ops:
        _grow(range(3, 40), lambda n: ((_long(2, 12, n, 8, axis=2), 2),), op)
    assert buckets.STATS["calls"] - calls >= 90


def test_two_streams_padding_to_the_same_sizes_along_different_axes_stay_exact():
    # one family (sum over dim 1 of a 2-D float tensor) grows first along dim 0, then along dim 1:
    # both reach the padded sizes (16, 16), each with its own axes padded
    before = torchneuron.eager_stats()["bucketed_calls"]
    for shape in [(9, 16), (10, 16), (11, 16), (16, 9), (16, 10), (16, 11), (16, 12)]:
        x = torch.randn(shape)
        torch.testing.assert_close(x.to("neuron").sum(1).cpu(), x.sum(1), msg=str(shape))
    assert torchneuron.eager_stats()["bucketed_calls"] - before >= 2


def test_an_op_without_a_safe_padding_runs_at_exact_sizes():
    """cumsum has no padding rule; isin must not pad its test elements: both stay exact."""
    refused = buckets.STATS["refused"]
    _grow(range(5, 12), lambda n: ((_long(2, n, axis=1), 1),), lambda x: x.cumsum(-1))
    _grow(range(5, 12), lambda n: ((torch.arange(6.0), None), (_long(n, axis=0).round(), 0)), torch.isin)
    assert buckets.STATS["refused"] - refused >= 2


def test_a_view_at_a_new_offset_reuses_its_executable():
    """x[i] in a loop: the offset is the program's argument, not part of its name."""
    x = _seeded(40, 8)
    xn = x.to("neuron")
    (xn[1] * 2).cpu()  # (the plan and executable of a view at an offset)
    before = _misses()
    for i in range(2, 40):
        torch.testing.assert_close((xn[i] * 2).cpu(), x[i] * 2, rtol=0, atol=0)
    assert _misses() == before


def test_in_place_writes_through_views_at_many_offsets_equal_cpu():
    x = torch.zeros(30, 4)
    xn = x.to("neuron")
    xn[1].add_(1)  # (the plan of a write at an offset)
    x[1].add_(1)
    before = _misses()
    for i in range(2, 30):
        x[i].add_(i)
        xn[i].add_(i)
        x[i - 1 : i + 1].mul_(2)
        xn[i - 1 : i + 1].mul_(2)
    torch.testing.assert_close(xn.cpu(), x, rtol=0, atol=0)
    assert _misses() - before <= 2


def test_the_last_column_of_a_growing_batch_shares_one_executable():
    """ids[:, -1:] of a growing (1, n) tensor: its row stride changes with n, which no read
    depends on; the clone keeps CPU's strides."""
    ids = torch.arange(64).reshape(1, 64)
    ids_n = ids.to("neuron")
    ids_n[:, :3][:, -1:].clone()
    before = _misses()
    for n in range(4, 64):
        got = ids_n[:, :n][:, -1:].clone()
        assert got.stride() == ids[:, :n][:, -1:].clone().stride()
        assert got.item() == n - 1
    assert _misses() - before <= 2


def test_eager_buckets_off_runs_exact_sizes(monkeypatch):
    monkeypatch.setattr(torchneuron.config, "EAGER_BUCKETS", False)
    calls = buckets.STATS["calls"]
    _grow(range(5, 10), lambda n: ((_long(2, n, axis=1), 1),), lambda x: x.sum(-1))
    assert buckets.STATS["calls"] == calls


def test_stats_are_reported():
    stats = torchneuron.eager_stats()
    assert {"bucketed_calls", "bucketed_plans", "bucketed_refused"} <= set(stats)


def test_a_size_that_keeps_coming_back_gets_its_exact_plan():
    """After growing, a loop that stays at one size leaves the padded program (and its gathers)
    once that exact signature ran padded EXACT_AFTER times."""
    x = _long(5, 5, axis=1).double().to("neuron")  # (a signature no other test runs)
    for n in range(6, 12):  # a growing family
        x = torch.cat([x, x[:, :1]], 1)
        x.sum(-1)
    expected = x.cpu().sum(-1)
    padded = []
    for _ in range(buckets.EXACT_AFTER + 20):
        calls = buckets.STATS["calls"]
        torch.testing.assert_close(x.sum(-1).cpu(), expected, rtol=1e-6, atol=1e-6)
        padded.append(buckets.STATS["calls"] - calls)
    assert sum(padded[:100]) == 100 and sum(padded[-20:]) == 0


def test_a_loop_over_a_few_fixed_sizes_leaves_the_padded_programs():
    """A training step's layers of several widths make one family whose sizes go down as well as
    up: once they went down OSCILLATES_AFTER times its calls run at exact sizes (no padding, no
    segment cuts), long before EXACT_AFTER. A growing size that starts again (a second `generate`)
    stays bucketed."""
    widths = (21, 37, 29, 45)  # 21 and 37 teach the stream (exact plans); 29 and 45 fit it
    xs = {w: torch.randn(3, w, dtype=torch.float64) for w in widths}  # (a signature no other test runs)
    on_device = {w: x.to("neuron") for w, x in xs.items()}
    padded = []
    for _ in range(8):
        calls = buckets.STATS["calls"]
        for w in widths:
            torch.testing.assert_close(on_device[w].sum(-1).cpu(), xs[w].sum(-1))
        padded.append(buckets.STATS["calls"] - calls)
    assert padded[0] == 2 and sum(padded[-4:]) == 0, padded
    assert "go down as well as up" in buckets.why_not()

    x = _long(4, 40, axis=1).to(torch.float16)  # (another unique signature)
    for start in (5, 5):  # grows, starts again, grows: one drop
        calls = buckets.STATS["calls"]
        for n in range(start, 30):
            torch.testing.assert_close(x[:, :n].contiguous().to("neuron").sum(-1).cpu(), x[:, :n].sum(-1))
        assert buckets.STATS["calls"] - calls >= 20

    # batches padded to many lengths, in any order (a data loader's): up and down, but not among a
    # few sizes, so they stay bucketed
    x = _long(3, 64, axis=1).to(torch.bfloat16)  # (another unique signature)
    lengths = [int(n) for n in torch.randint(6, 60, (40,), generator=torch.Generator().manual_seed(3))]
    calls = buckets.STATS["calls"]
    for n in lengths:
        torch.testing.assert_close(x[:, :n].contiguous().to("neuron").sum(-1).cpu(), x[:, :n].sum(-1))
    assert buckets.STATS["calls"] - calls >= 30


def test_a_fixed_size_among_its_family_leaves_the_padded_program_in_fused_eager():
    """A training step's sums over its layers' widths make one family; widths that teach its stream
    run exact plans, and a width that fits the stream ran padded, cutting nothing but paying the
    padded program, until EXACT_AFTER calls. In fused eager a stream that served one size only in
    STILL_SEGMENTS segments stands still: that size gets its exact plan. A growing size, met in one
    segment each, stays bucketed."""
    widths = (22, 38, 30)  # 22 and 38 teach the stream (exact plans); 30 fits it
    # (a family no other test runs: the streams of a family live for the whole process)
    xs = {w: torch.randint(-50, 50, (2, 3, w), dtype=torch.int32) for w in widths}
    on_device = {w: x.to("neuron") for w, x in xs.items()}
    padded = []
    with torchneuron.eager_mode("fused"):
        for _ in range(10):
            calls = buckets.STATS["calls"]
            for w in widths:
                got = on_device[w].sum(-1) * 3
                torch.testing.assert_close(got.cpu(), xs[w].sum(-1) * 3)  # (a flush per step)
            padded.append(buckets.STATS["calls"] - calls)
        assert padded[2] == 1 and sum(padded) <= buckets.STILL_SEGMENTS + 1 and sum(padded[-4:]) == 0, padded
        assert "one size only" in buckets.why_not()

        x = _long(4, 40, axis=1).to(torch.float16)  # a growing size, a flush per length: stays bucketed
        calls = buckets.STATS["calls"]
        for n in range(5, 30):
            torch.testing.assert_close(x[:, :n].contiguous().to("neuron").sum(-1).cpu(), x[:, :n].sum(-1))
        assert buckets.STATS["calls"] - calls >= 20


def test_a_fused_decode_loop_records_bucketed_calls_and_reuses_its_segments():
    """Fused eager records bucketed calls like any plan (a growing size is a traced argument), so a
    decode step's segment repeats within a bucket: a few segment programs for 45 lengths, not one
    each (at exact sizes every step's segment was a new program). A bucket's first step, which
    reads the previous bucket's caches, runs the program of the bucket's other steps: its caches
    are widened first, so its inputs have their shapes."""
    heads, d = 2, 12
    q = _seeded(1, heads, 1, d + 1)[..., :d]
    k = v = _seeded(1, heads, 2, d + 1)[..., :d]
    kn, vn = k.to("neuron"), v.to("neuron")
    lengths = range(3, 48)
    stats = torchneuron.eager_stats()
    programs = torchneuron.cache_stats()["entries_by_kind"].get("segment", 0)
    with torchneuron.eager_mode("fused"):
        qn = q.to("neuron")
        for n in lengths:
            new = _seeded(1, heads, 1, d + n)[..., :d]
            k, v = torch.cat([k, new], 2), torch.cat([v, new * 2], 2)
            on_device = new.to("neuron")
            kn, vn = torch.cat([kn, on_device], 2), torch.cat([vn, on_device * 2], 2)
            got = (F.scaled_dot_product_attention(qn, kn, vn) * 3).sum(-1)
            expected = (F.scaled_dot_product_attention(q, k, v) * 3).sum(-1)
            torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)  # (a flush per step)
    torch.testing.assert_close(vn.cpu(), v, rtol=0, atol=0)
    after = torchneuron.eager_stats()
    assert after["bucketed_calls"] - stats["bucketed_calls"] >= 2 * len(lengths)
    assert after["segments"] - stats["segments"] >= len(lengths)
    bucket_count = len({padding.bucket(n) for n in lengths})
    # (segment structures: the steps before the sizes' stream is known are segments of their own,
    # each bucket another; executables: one per structure and input shapes)
    assert after["segment_compiles"] - stats["segment_compiles"] <= bucket_count + 3
    assert torchneuron.cache_stats()["entries_by_kind"]["segment"] - programs <= bucket_count + 3


def test_a_decode_step_whose_ids_enter_the_next_bucket_first_records_no_attention_of_its_own():
    """A decode step appends its token to ids one position ahead of the caches (Hugging Face's
    input_ids and attention mask), so one step per bucket has ids in the next bucket and caches in
    this one. Fused eager cuts before a call whose growing size passes the segment's (every step
    alike): that step records the attention half of this bucket's steps and the ids half of the next
    bucket's, and each bucket compiles its attention into one segment program, not two."""
    heads, d = 2, 12
    q = _seeded(1, heads, 1, d + 1)[..., :d]
    k = v = _seeded(1, heads, 2, d + 1)[..., :d]
    ids = torch.arange(3).reshape(1, 3)
    qn, kn, vn, ids_n = q.to("neuron"), k.to("neuron"), v.to("neuron"), ids.to("neuron")
    lengths = range(3, 40)
    before = set(deferred._SEGMENTS)
    with torchneuron.eager_mode("fused"):
        for n in lengths:
            new = _seeded(1, heads, 1, d + n)[..., :d]
            k, v = torch.cat([k, new], 2), torch.cat([v, new * 2], 2)
            on_device = new.to("neuron")
            kn, vn = torch.cat([kn, on_device], 2), torch.cat([vn, on_device * 2], 2)
            token = F.scaled_dot_product_attention(q, k, v).sum().floor().long().reshape(1, 1) % 7
            token_n = F.scaled_dot_product_attention(qn, kn, vn).sum().floor().long().reshape(1, 1) % 7
            ids, ids_n = torch.cat([ids, token], 1), torch.cat([ids_n, token_n], 1)
            assert (ids_n[:, -1] == ids[:, -1].to("neuron")).all().item()  # (a flush per step, as generate's check)
    torch.testing.assert_close(ids_n.cpu(), ids, rtol=0, atol=0)
    attention = [key for key in set(deferred._SEGMENTS) - before
                 if any("scaled_dot_product" in function.name for function, _ in key[0])]
    bucket_count = len({padding.bucket(n) for n in lengths})
    assert len(attention) <= bucket_count + 2  # (+2: the steps before the sizes' stream is known)


@pytest.mark.parametrize("shapes,dim", [
    ([(1, 4, 7, 8), (1, 4, 1, 8)], 2), ([(1, 4, 7, 8), (1, 4, 1, 8)], -2), ([(3, 5), (3, 2), (3, 1)], 1),
    ([(6,), (2,)], 0), ([(2, 3), (4, 3)], 0), ([(2, 3), (2, 4)], 0), ([(2, 3), (2, 3, 1)], 1),
    ([(0,), (2, 3)], 0), ([(2, 3), (0,)], 1), ([(2, 3), (2, 3)], 2), ([(2, 3), (2, 3)], -3)])
def test_cat_sizes_from_the_rule_agree_with_the_meta_kernel(shapes, dim):
    # cat's size rule stands in for its (slow, Python) meta kernel in bucketed calls: same sizes
    # wherever it answers; where it does not (None), the meta kernel decides
    tensors = [torch.empty(s, device="meta") for s in shapes]
    try:
        meta = [tuple(torch.cat(tensors, dim).shape)]
    except (RuntimeError, IndexError, ValueError):
        meta = None
    rule = record_of(torch.ops.aten.cat.default).true_shapes(tensors, dim)
    assert rule is None or rule == meta
    if meta is None:
        assert rule is None
    elif all(len(s) == len(shapes[0]) for s in shapes):
        assert rule == meta  # (the rule answers every plain cat)


@pytest.mark.parametrize("shapes", [[(1, 4, 1, 16), (1, 4, 12, 16), (1, 4, 12, 8)], [(4, 9, 16), (4, 12, 16), (4, 12, 16)],
                                    [(2, 4, 9, 16), (2, 4, 9, 16), (2, 4, 9, 16)]])
def test_attention_sizes_from_the_rule_agree_with_the_meta_kernel(shapes):
    op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    q, k, v = (torch.empty(s, device="meta") for s in shapes)
    assert record_of(op).true_shapes(q, k, v, None, 0.0, True) == buckets._meta_results(op, (q, k, v, None, 0.0, True), {})


def test_synchronize_waits_for_the_results_of_bucketed_calls_that_died(monkeypatch):
    from torchneuron.runtime import devices
    from torchneuron.runtime import synchronize as sync_module
    if not devices.ASYNCHRONOUS:
        pytest.skip("inline dispatch: synchronize waits for nothing")
    waited = []
    real = sync_module.jax.block_until_ready
    monkeypatch.setattr(sync_module.jax, "block_until_ready", lambda xs: waited.append(len(xs)) or real(xs))
    with torchneuron.eager_mode("strict"):
        x = torch.randn(5, 4).to("neuron")
        for n in range(5, 12):  # (a growing axis: bucketed after its second length)
            x = torch.cat([x, torch.randn(1, 4).to("neuron")])
            calls = buckets.STATS["calls"]
            torch.neuron.synchronize()
            x * 2  # a result that dies at once
            bucketed = buckets.STATS["calls"] - calls
            torch.neuron.synchronize()
    assert bucketed == 1
    assert waited[-1] >= 1  # (none before the fix: a bucketed call's result was not kept)
