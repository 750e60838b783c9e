"""The recording process group: answers as rank r of N, records every call, moves no data."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
dist = pytest.importorskip("torch.distributed", reason="this torch build has no torch.distributed")

from echo_et.trace.recording import BACKEND_NAME, RECORDER, register_backend  # noqa: E402

# The tensor forms' old names (all_gather_into_tensor, ...) are what most code still calls.
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture
def world():
    """Rank 5 of a world of 8, torn down after the test."""
    register_backend()
    dist.init_process_group(BACKEND_NAME, rank=5, world_size=8, store=dist.HashStore())
    RECORDER.reset()
    RECORDER.enabled = True
    try:
        yield
    finally:
        RECORDER.enabled = False
        RECORDER.reset()
        dist.destroy_process_group()


def test_answers_as_rank_of_the_big_world(world):
    assert dist.get_rank() == 5 and dist.get_world_size() == 8
    g = dist.new_group([4, 5, 6, 7], use_local_synchronization=True, group_desc="pp")
    assert dist.get_rank(g) == 1
    assert dist.get_world_size(g) == 4
    assert dist.get_process_group_ranks(g) == [4, 5, 6, 7]
    assert g.group_desc == "pp"


def test_collectives_record_type_bytes_group_and_order(world):
    g = dist.new_group([4, 5, 6, 7], use_local_synchronization=True)
    x = torch.arange(8, dtype=torch.float32)
    dist.all_reduce(x, group=g)
    out = torch.empty(32)
    dist.all_gather_into_tensor(out, x, group=g)
    shard = torch.empty(2)
    dist.reduce_scatter_tensor(shard, x, group=g)
    dist.broadcast(x, src=6, group=g)
    dist.barrier()
    recs = RECORDER.records
    assert [r.op for r in recs] == ["all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                    "barrier"]
    assert [r.index for r in recs] == [0, 1, 2, 3, 4]
    assert recs[0].group_ranks == (4, 5, 6, 7) and recs[4].group_ranks == tuple(range(8))
    # bytes from the tensors passed: all-gather in = shard, out = gathered; reduce-scatter
    # in = the full buffer, out = the shard
    assert (recs[0].in_bytes, recs[0].out_bytes) == (32, 32)
    assert (recs[1].in_bytes, recs[1].out_bytes) == (32, 128)
    assert (recs[2].in_bytes, recs[2].out_bytes) == (32, 8)
    assert recs[3].root == 2  # global rank 6 is group rank 2
    assert all(r.dtype == "float32" for r in recs[:4])
    assert all(r.waited for r in recs)  # synchronous calls wait at once


def test_outputs_keep_plausible_values_without_moving_data(world):
    g = dist.new_group([4, 5], use_local_synchronization=True)
    x = torch.full((4,), 3.0)
    dist.all_reduce(x, group=g)
    assert torch.equal(x, torch.full((4,), 3.0))  # no peer data arrives
    out = torch.full((8,), float("nan"))
    dist.all_gather_into_tensor(out, x, group=g)
    assert torch.equal(out, torch.full((8,), 3.0))  # every slot as if peers held the same
    buf = torch.full((4,), float("nan"))
    dist.recv(buf, src=4, group=g)
    assert torch.equal(buf, torch.zeros(4))


def test_async_and_point_to_point_peer_and_wait(world):
    g = dist.new_group([1, 5], use_local_synchronization=True)
    x = torch.ones(6, dtype=torch.bfloat16)
    w = dist.all_reduce(x, group=g, async_op=True)
    assert not RECORDER.records[0].waited
    w.wait()
    assert RECORDER.records[0].waited
    ops = [dist.P2POp(dist.isend, x, 1, g), dist.P2POp(dist.irecv, torch.empty(3), 1, g)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    send, recv = RECORDER.records[1], RECORDER.records[2]
    assert (send.op, send.peer, send.in_bytes, send.dtype) == ("send", 0, 12, "bfloat16")
    assert (recv.op, recv.peer, recv.out_bytes) == ("recv", 0, 12)
    assert send.waited and recv.waited


def test_list_collectives_gather_scatter_all_to_all(world):
    g = dist.new_group([4, 5, 6, 7], use_local_synchronization=True)
    x = torch.ones(5)
    outs = [torch.empty(5) for _ in range(4)]
    dist.all_gather(outs, x, group=g)
    assert all(torch.equal(o, x) for o in outs)
    dist.all_to_all_single(torch.empty(8), torch.ones(8), group=g)
    dist.gather(x, gather_list=None, dst=4, group=g)
    dist.scatter(torch.empty(5), scatter_list=None, src=4, group=g)
    ops = [r.op for r in RECORDER.records]
    assert ops == ["all_gather", "all_to_all", "gather", "scatter"]
    assert RECORDER.records[0].out_bytes == 4 * 20
    assert RECORDER.records[2].root == 0 and RECORDER.records[2].out_bytes == 0  # not the root


def test_ddp_bucket_all_reduce_from_autograd_hooks(world):
    g = dist.new_group([4, 5], use_local_synchronization=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Linear(16, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=g)
    RECORDER.reset()
    ddp(torch.randn(3, 4)).sum().backward()
    grads = [r for r in RECORDER.records if r.op == "all_reduce"]
    n_params = sum(p.numel() for p in model.parameters())
    assert sum(r.in_bytes for r in grads) == 4 * n_params
    # DDP waits on the work's future inside C++: no wait point is seen
    assert not any(r.waited for r in grads)


def test_device_mesh_subgroups(world):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    assert dist.get_process_group_ranks(mesh.get_group("tp")) == [4, 5, 6, 7]
    assert dist.get_process_group_ranks(mesh.get_group("dp")) == [1, 5]
    dist.all_reduce(torch.ones(2), group=mesh.get_group("dp"))
    assert RECORDER.records[-1].group_ranks == (1, 5)
    assert RECORDER.records[-1].group_desc == "mesh_dp"
