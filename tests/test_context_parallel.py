"""Context parallelism (Megatron-Core's ``--context-parallel-size``, TE's ring attention):
the layout's groups and rank order, the load-balanced split, real gloo runs that give the
gradients of a run without it, the traced ring and its refusals."""

from __future__ import annotations

import pytest

from echo_et.errors import EchoError
from echo_et.trace.layout import ParallelLayout

REAL = {"megatron": True, "layers": 2, "hidden": 32, "heads": 4, "seq": 16, "micro_batch": 2, "vocab": 64,
        "dropout": 0.0, "flash_attention": True, "grad_sync": "after-backward", "dtype": "float32"}


def test_rank_order_is_megatron_cores() -> None:
    """tp fastest, then cp, then dp, then pp ("tp-cp-ep-dp-pp"), and the groups that follow."""
    lay = ParallelLayout(tp=2, cp=2, dp=2, pp=2)
    assert lay.world_size == 16
    assert lay.coords(3) == {"tp": 1, "cp": 1, "dp": 0, "pp": 0}
    assert lay.coords(6) == {"tp": 0, "cp": 1, "dp": 1, "pp": 0}
    assert lay.rank_of(tp=1, dp=1, pp=1, cp=1) == 15
    assert lay.group_ranks("cp", 5) == (5, 7)
    assert lay.group_ranks("dp", 5) == (1, 5)
    assert lay.group_ranks("dp_cp", 5) == (1, 3, 5, 7)
    assert lay.group_ranks("pp", 5) == (5, 13)
    assert lay.group_ranks("embd", 5) == (5, 13)
    assert lay.group_ranks("mp", 3) == (2, 3, 10, 11)
    assert lay.roles == ("tp", "dp", "pp", "cp")
    # without context parallelism nothing changes: no cp coordinate, role or group
    plain = ParallelLayout(tp=2, dp=2, pp=2)
    assert plain.coords(5) == {"tp": 1, "dp": 0, "pp": 1} and plain.roles == ("tp", "dp", "pp")
    assert plain.group_ranks("dp_cp", 5) == plain.group_ranks("dp", 5)
    with pytest.raises(EchoError, match="unknown group role 'cp'"):
        plain.group_ranks("cp", 0)
    with pytest.raises(EchoError, match="cp must be >= 1"):
        ParallelLayout(cp=0)


def test_split_keeps_two_chunks_for_an_even_load() -> None:
    import torch

    from echo_et.workloads.context_parallel import split_sequence

    t = torch.arange(16).view(1, 16)
    assert split_sequence(t, 1, 4, 0).tolist() == [[0, 1, 14, 15]]
    assert split_sequence(t, 1, 4, 3).tolist() == [[6, 7, 8, 9]]
    every = sorted(x for r in range(4) for x in split_sequence(t, 1, 4, r).view(-1).tolist())
    assert every == list(range(16))
    with pytest.raises(EchoError, match="2 x 3 equal chunks"):
        split_sequence(t, 1, 3, 0)


@pytest.mark.parametrize("cp,extra", [(2, {}), (4, {}),
                                      (2, {"arch": "llama", "kv_heads": 2, "ffn_hidden": 64}),
                                      (2, {"recompute": True})])
def test_real_run_gives_the_gradients_without_context_parallelism(tmp_path, cp: int, extra: dict) -> None:
    """cp gloo processes each hold 2 of the sequence's 2 cp chunks and run the ring for real
    (forward, backward, the recomputed forward): every send meets its receive and each
    parameter's gradient, averaged over the CP ranks as the reduction over dp x cp does, is
    that of one process holding the whole sequence; with the llama layer (rotary positions cut
    to the rank's chunks, grouped keys and values) too."""
    import torch
    from gpt_real_runs import real_grads

    kw = {**REAL, **extra}
    ref = real_grads(tmp_path, microbatches=2, **kw)
    got = real_grads(tmp_path, microbatches=2, cp=cp, **kw)
    assert got.keys() == ref.keys() and len(ref) > 8
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.parametrize("extra", [{}, {"sequence_parallel": True}])
def test_real_run_with_pipeline_and_tensor_parallelism(tmp_path, extra: dict) -> None:
    """TP2 x PP2 x CP2 (8 processes, the rank order above) gives the gradients of TP2 x PP2,
    parameter by parameter and TP rank by TP rank; with sequence parallelism too (each CP
    rank's positions split again over the TP ranks)."""
    import torch
    from gpt_real_runs import real_grads

    kw = {**REAL, **extra}
    ref = real_grads(tmp_path, microbatches=2, tp=2, pp=2, **kw)
    got = real_grads(tmp_path, microbatches=2, cp=2, tp=2, pp=2, **kw)
    assert got.keys() == ref.keys() and len(ref) > 8
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)
