"""Meta-device kernels called again are not run again (echo_et.trace.memo), and the Job is
the same bytes as when every call runs its meta kernel.

The Job is compared with the one traced the old way (``TraceOptions(memo=False)``: every
operator runs), file by file, on configurations that exercise what the memo sees: layers run
for real (an overlapped gradient sync's last micro-batch), per-parameter optimizers (torch
Adam, in place on views into gradient buckets), Megatron's fused kernels, recomputation,
tensor and pipeline parallelism, ZeRO-1, 16-bit types."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="meta-device tracing needs torch (the trace extra)")

from echo_et.ir import save_job  # noqa: E402
from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.trace.direct import DirectRecorder  # noqa: E402
from echo_et.trace.memo import FRESH, SELF, KernelMemo, memo_kind  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402

SMALL = dict(layers=4, hidden=32, heads=4, seq=16, micro_batch=2, vocab=100, vocab_multiple=8)

CASES = {
    # gpt's defaults: overlapped bucketed all-reduces, so the last micro-batch's layers run
    # for real; torch Adam (per parameter, in place on bucket views), warm-up step
    "gpt-overlap-dp2-pp2": (GPTConfig(**SMALL, dtype="float32", bucket_mb=0.001),
                            ParallelLayout(dp=2, tp=1, pp=2, microbatches=3), {}),
    "gpt-tp2-zero1-bf16": (GPTConfig(**SMALL, dtype="bfloat16"),
                           ParallelLayout(dp=2, tp=2, pp=1, microbatches=2, zero=1), {}),
    "megatron-recompute-tp2-pp2-dp2": (GPTConfig.megatron(**SMALL, recompute=True),
                                       ParallelLayout(dp=2, tp=2, pp=2, microbatches=3),
                                       {"warmup_steps": 0}),
    # nothing recorded once: every layer and micro-batch runs through the memo
    "megatron-no-replay": (GPTConfig.megatron(**SMALL),
                           ParallelLayout(dp=1, tp=2, pp=1, microbatches=2), {"replay": False}),
}


def _job_files(cfg: GPTConfig, layout: ParallelLayout, out: Path, *, memo: bool, **kw) -> dict[str, bytes]:
    res = trace(build_gpt(cfg), layout, TraceOptions(device="meta", verify="all", jobs=1,
                                                     memo=memo, **kw))
    save_job(res.job, out)
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_memo_gives_the_same_job_bytes(case: str, tmp_path: Path) -> None:
    cfg, layout, kw = CASES[case]
    old = _job_files(cfg, layout, tmp_path / "old", memo=False, **kw)
    new = _job_files(cfg, layout, tmp_path / "new", memo=True, **kw)
    assert sorted(old) == sorted(new)
    assert any(name.endswith(".graph") or "graph" in name for name in old)
    for name in old:
        assert old[name] == new[name], f"{case}: {name} differs with the memo"


def test_a_step_is_mostly_memo_hits() -> None:
    """The memo is used (the comparison above would pass with a memo that never hits)."""
    cfg = GPTConfig(**SMALL, dtype="float32")
    step_fn = build_gpt(cfg)
    import torch.distributed as dist

    from echo_et.trace.context import RankContext
    from echo_et.trace.recording import BACKEND_NAME, register_backend

    register_backend()
    layout = ParallelLayout()
    dist.init_process_group(BACKEND_NAME, rank=0, world_size=1, store=dist.HashStore())
    try:
        step = step_fn(RankContext(0, layout, "meta"))
        rec = DirectRecorder(replay=False)
        with rec:
            rec.recording = True
            step()
            first = len(rec.events)
            hits = rec.memo.hits
            step()
    finally:
        dist.destroy_process_group()
    assert rec.memo is not None and len(rec.memo) > 10
    # four layers of the same shapes: the second and third hit in the first step already;
    # the second step (same shapes as the first) hits on nearly everything memoised
    assert hits > 0
    assert rec.memo.hits - hits > len(rec.memo)
    assert len(rec.events) > first


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device="meta", dtype=dtype)


def _kind(op) -> int:
    return memo_kind(op, op._schema)


def test_kinds_follow_the_schema() -> None:
    aten = torch.ops.aten
    assert _kind(aten.mm.default) == FRESH
    assert _kind(aten.native_layer_norm.default) == FRESH
    assert _kind(aten.add_.Tensor) == SELF
    assert _kind(aten.addcdiv_.default) == SELF
    assert _kind(aten.view.default) == 0          # a view: its result must alias
    assert _kind(aten.unsqueeze_.default) == 0    # changes its argument's shape
    assert _kind(aten.nonzero.default) == 0       # shape depends on data
    assert _kind(aten._local_scalar_dense.default) == 0
    assert _kind(aten.add.out) == 0               # writes its out= argument
    assert _kind(aten._foreach_add_.Scalar) == 0  # in place on a list


def _call(memo: KernelMemo, func, *args, **kwargs):
    key, entry, where = memo.find(func, args, kwargs)
    if entry is not None:
        return entry.result(args), True
    out = func(*args, **kwargs)
    if key is not None:
        memo.learn(func, key, args, kwargs, out, where)
    return out, False


def test_results_are_made_again_with_the_same_metadata() -> None:
    memo = KernelMemo()
    aten = torch.ops.aten
    a, b = _meta(8, 4), _meta(4, 6)
    first, hit = _call(memo, aten.mm.default, a, b)
    assert not hit
    again, hit = _call(memo, aten.mm.default, _meta(8, 4), _meta(4, 6))
    assert hit and again is not first
    assert (again.shape, again.stride(), again.dtype) == (first.shape, first.stride(), first.dtype)
    # another shape, dtype, stride or plain value is another signature
    assert not _call(memo, aten.mm.default, _meta(8, 4), _meta(4, 5))[1]
    assert not _call(memo, aten.mm.default, _meta(8, 4, dtype=torch.float16),
                     _meta(4, 6, dtype=torch.float16))[1]
    assert not _call(memo, aten.mm.default, _meta(4, 8).t(), _meta(4, 6))[1]
    x = _meta(3, 5)
    assert not _call(memo, aten.add.Tensor, x, x, alpha=2)[1]
    assert not _call(memo, aten.add.Tensor, x, x, alpha=3)[1]
    assert _call(memo, aten.add.Tensor, x, x, alpha=3)[1]
    assert not _call(memo, aten.add.Tensor, x, x, alpha=3.0)[1]   # a float is not an int
    # tuples of results, with the plain values among them
    out, _ = _call(memo, aten.native_layer_norm.default, x, [5], None, None, 1e-5)
    again, hit = _call(memo, aten.native_layer_norm.default, _meta(3, 5), [5], None, None, 1e-5)
    assert hit and type(again) is type(out) and len(again) == len(out)
    assert [t.shape for t in again] == [t.shape for t in out]


def test_in_place_returns_its_argument() -> None:
    memo = KernelMemo()
    aten = torch.ops.aten
    x, y = _meta(4, 4), _meta(4, 4)
    assert _call(memo, aten.add_.Tensor, x, y)[0] is x
    z = _meta(4, 4)
    out, hit = _call(memo, aten.add_.Tensor, z, _meta(4, 4))
    assert hit and out is z
    # the same metadata, but the two arguments share a storage: another signature
    w = _meta(4, 4)
    assert not _call(memo, aten.add_.Tensor, w, w)[1]
    # views into one buffer (gradients in a bucket) are the same call at any offset ...
    bucket = _meta(64)
    grads = [bucket[i * 16:(i + 1) * 16].view(4, 4) for i in range(4)]
    assert [_call(memo, aten.add_.Tensor, g, _meta(4, 4))[1] for g in grads] == [True] * 4
    assert grads[3].storage_offset() == 48
    # ... but where two arguments share a storage, where each begins in it is part of the call
    assert not _call(memo, aten.add_.Tensor, grads[0], grads[1])[1]
    assert _call(memo, aten.add_.Tensor, grads[2], grads[3])[1]      # 16 apart, as 0 and 1
    assert not _call(memo, aten.add_.Tensor, grads[0], grads[2])[1]  # 32 apart


def test_what_is_never_memoised() -> None:
    memo = KernelMemo()
    aten = torch.ops.aten
    # a CPU argument, a view, a result that shares its input's storage
    assert memo.find(aten.mm.default, (torch.ones(2, 2), _meta(2, 2)), {})[0] is None
    assert memo.find(aten.view.default, (_meta(4, 4), [16]), {})[0] is None
    x = _meta(4, 4)
    for _ in range(2):
        out, hit = _call(memo, aten._unsafe_view.default, x, [16])
        assert not hit
    assert len(memo) == 0
    # a resize that changes its argument is not an in-place call to repeat
    r = _meta(2)
    out, _ = _call(memo, aten.resize_.default, r, [3, 3])
    assert out.shape == (3, 3) and len(memo) == 0
    # a multi-tensor call over many tensors (every parameter) is run, not kept
    many = [_meta(2) for _ in range(300)]
    assert memo.find(aten._foreach_norm.Scalar, (many, 2.0), {})[0] is None
    assert memo.find(aten._foreach_norm.Scalar, (many[:3], 2.0), {})[0] is not None
    # set_ keeps the shape but moves its argument to another storage: not kept
    s, src = _meta(4), _meta(4)
    out, _ = _call(memo, aten.set_.source_Tensor, s, src)
    assert torch._C._storage_id(s) == torch._C._storage_id(src) and len(memo) == 0
    # a full memo keeps what it has
    small = KernelMemo(limit=1)
    _call(small, aten.mm.default, _meta(2, 2), _meta(2, 2))
    _call(small, aten.mm.default, _meta(2, 3), _meta(3, 2))
    assert len(small) == 1
