"""Megatron-LM's interleaved 1F1B pipeline schedule (``--num-layers-per-virtual-pipeline-stage``):
the schedule against one worked out by hand, sends and receives that pair up around the ring,
the traced Job (layers per chunk, tied embedding, check_job), a smaller predicted bubble, and
each bad input as one line with exit 2."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.errors import EchoError

pytest.importorskip("torch", reason="the GPT workload needs torch (pip install 'echo-et[trace]')")

from echo_et.workloads.pipeline_plan import interleaved_schedule, interleaved_warmup  # noqa: E402

runner = CliRunner()


def _compact(stages: int, stage: int, chunks: int, microbatches: int) -> str:
    """F<mb>.<chunk> / B<mb>.<chunk> for compute, [..] for one combined exchange: S(end) or
    R(eceive), + (next stage) or - (previous), f (activation) or b (gradient), mb.chunk."""
    out = []
    for item in interleaved_schedule(stages, stage, chunks, microbatches):
        if item[0] == "comm":
            out.append("[" + " ".join(f"{'S' if t.send else 'R'}{'+' if t.peer > 0 else '-'}"
                                      f"{t.phase[0]}{t.mb}.{t.chunk}" for t in item[1]) + "]")
        else:
            out.append(f"{item[0][0].upper()}{item[1]}.{item[2]}")
    return " ".join(out)


# pp = 3, v = 2, 6 micro-batches, worked out from Megatron's rules: forward step k runs chunk
# (k mod 6) // 3 on micro-batch (k // 6) x 3 + k mod 3 (backward: the chunks reversed); stage s
# warms up with (3 - s - 1) x 2 + (2 - 1) x 3 forward steps (7, 5, 3); chunk 0 of stage 0 reads
# the data, chunk 1 of stage 2 computes the loss; an activation from chunk 0 of stage 2 goes to
# chunk 1 of stage 0, a gradient from chunk 1 of stage 0 to chunk 0 of stage 2; each exchange
# posts send-previous, receive-previous, send-next, receive-next; the last warm-up exchange
# also receives the first gradient (for the last chunk); the first stage, pp - 1 steps ahead of
# the last, receives nothing while the last stage's step pp - 1 before it ran the last chunk.
HAND = {
    0: "F0.0 [S+f0.0] F1.0 [S+f1.0] F2.0 [R-f0.1 S+f2.0] F0.1 [R-f1.1 S+f0.1] F1.1 [R-f2.1 S+f1.1] "
       "F2.1 [S+f2.1] F3.0 [S+f3.0 R+b0.1] "
       "F4.0 B0.1 [S-b0.1 S+f4.0 R+b1.1] F5.0 B1.1 [S-b1.1 R-f3.1 S+f5.0 R+b2.1] "
       "F3.1 B2.1 [S-b2.1 R-f4.1 S+f3.1 R+b0.0] F4.1 B0.0 [R-f5.1 S+f4.1 R+b1.0] "
       "F5.1 B1.0 [S+f5.1 R+b2.0] "
       "B2.0 [R+b3.1] B3.1 [S-b3.1 R+b4.1] B4.1 [S-b4.1 R+b5.1] B5.1 [S-b5.1 R+b3.0] B3.0 [R+b4.0] "
       "B4.0 [R+b5.0] B5.0",
    2: "[R-f0.0] F0.0 [R-f1.0 S+f0.0] F1.0 [R-f2.0 S+f1.0] F2.0 [R-f0.1 S+f2.0] "
       "F0.1 B0.1 [S-b0.1 R-f1.1] F1.1 B1.1 [S-b1.1 R-f2.1] F2.1 B2.1 [S-b2.1 R-f3.0 R+b0.0] "
       "F3.0 B0.0 [S-b0.0 R-f4.0 S+f3.0 R+b1.0] F4.0 B1.0 [S-b1.0 R-f5.0 S+f4.0 R+b2.0] "
       "F5.0 B2.0 [S-b2.0 R-f3.1 S+f5.0] F3.1 B3.1 [S-b3.1 R-f4.1] F4.1 B4.1 [S-b4.1 R-f5.1] "
       "F5.1 B5.1 [S-b5.1 R+b3.0] B3.0 [S-b3.0 R+b4.0] B4.0 [S-b4.0 R+b5.0] B5.0 [S-b5.0]",
}


def test_schedule_matches_the_hand_worked_one() -> None:
    for stage, want in HAND.items():
        assert _compact(3, stage, 2, 6) == want, stage
    assert [interleaved_warmup(3, s, 2, 6) for s in range(3)] == [7, 5, 3]
    # micro-batches == pp: the stages whose warm-up reaches every step warm up only, the others
    # run 1F1B after theirs, as Megatron-Core does (older Megatron-LM warmed every stage up)
    assert [interleaved_warmup(4, s, 2, 4) for s in range(4)] == [8, 8, 6, 4]


def _messages(stages: int, chunks: int, microbatches: int, group: int = 0):
    """Per ordered pair of stages, the messages sent and those received, as (phase, mb,
    receiving chunk), in order; and each stage's compute steps."""
    sends: dict[tuple[int, int], list] = defaultdict(list)
    recvs: dict[tuple[int, int], list] = defaultdict(list)
    compute: dict[int, list] = {}
    for s in range(stages):
        items = interleaved_schedule(stages, s, chunks, microbatches, group)
        compute[s] = [i for i in items if i[0] != "comm"]
        for item in items:
            if item[0] != "comm":
                continue
            for t in item[1]:
                peer = (s + t.peer) % stages
                if not t.send:
                    recvs[(peer, s)].append((t.phase, t.mb, t.chunk))
                    continue
                if t.phase == "forward":   # the last stage's chunk c feeds the first's c + 1
                    to_chunk = t.chunk + 1 if s == stages - 1 else t.chunk
                else:
                    to_chunk = t.chunk - 1 if s == 0 else t.chunk
                sends[(s, peer)].append((t.phase, t.mb, to_chunk))
    return sends, recvs, compute


def runs_to_the_end(plans: list[list]) -> bool:
    """Whether stages running ``plans`` (each its ("comm", transfers) items in order, peers
    as offsets around the ring) all finish: a combined exchange posts its transfers, then
    completes once every one of them has its counterpart posted (the n-th send from a to b
    meets b's n-th receive from a), as a batched NCCL exchange waits."""
    stages = len(plans)
    at = [0] * stages
    posted: Counter = Counter()                 # (from, to, "send" | "recv") -> transfers posted
    waiting: list[list | None] = [None] * stages
    moved = True
    while moved:
        moved = False
        for s in range(stages):
            if at[s] == len(plans[s]):
                continue
            if waiting[s] is None:
                mine = []
                for t in plans[s][at[s]][1]:
                    peer = (s + t.peer) % stages
                    key = (s, peer, "send") if t.send else (peer, s, "recv")
                    mine.append((key, posted[key]))
                    posted[key] += 1
                waiting[s], moved = mine, True
            if all(posted[(a, b, "recv" if kind == "send" else "send")] > n for (a, b, kind), n in waiting[s]):
                at[s], waiting[s], moved = at[s] + 1, None, True
    return all(at[s] == len(plans[s]) for s in range(stages))


@pytest.mark.parametrize("stages,chunks,microbatches,group",
                         [(3, 2, 3, 0), (3, 2, 6, 0), (4, 2, 8, 0), (4, 2, 4, 0), (4, 3, 12, 0), (5, 4, 10, 0),
                          (8, 2, 16, 0), (4, 1, 8, 0),
                          # Megatron-Core's micro-batch groups: larger than pp, one group, and a short last one
                          (4, 2, 10, 5), (4, 2, 10, 6), (3, 3, 7, 4), (4, 2, 8, 8), (5, 3, 17, 6)])
def test_every_send_meets_its_receive_in_order(stages, chunks, microbatches, group) -> None:
    sends, recvs, compute = _messages(stages, chunks, microbatches, group)
    assert sends.keys() == recvs.keys()
    for pair in sends:
        assert sends[pair] == recvs[pair], pair
    plans = [[i for i in interleaved_schedule(stages, s, chunks, microbatches, group) if i[0] == "comm"]
             for s in range(stages)]
    assert runs_to_the_end(plans)
    for steps in compute.values():
        # each (micro-batch, chunk) once forward and once backward, forward first
        fwd = [(mb, c) for kind, mb, c in steps if kind == "forward"]
        bwd = [(mb, c) for kind, mb, c in steps if kind == "backward"]
        assert sorted(fwd) == sorted(bwd) == [(m, c) for m in range(microbatches) for c in range(chunks)]
        for mb, c in bwd:
            assert steps.index(("forward", mb, c)) < steps.index(("backward", mb, c))


def overlapped_runs_to_the_end(plans: list[list]) -> bool:
    """Whether stages running overlapped plans (``pipeline_plan.overlapped_plan``) all finish,
    each compute with its input in hand, as the schedule's executor runs them: a post posts its
    transfers, then waits for the sends of their directions posted before; a prefetch only
    posts; an exchange waits for all of their directions' and its own; a settle for its
    direction's sends; an await for its direction's oldest receive not waited for yet. A
    transfer is done once its counterpart is posted (the n-th send from a to b meets b's n-th
    receive from a); a compute whose input was not received and waited for is a failure too
    (the model's first chunk's forward and its last chunk's backward need none)."""
    stages = len(plans)
    chunks = 1 + max(item[2] for plan in plans for item in plan if item[0] in ("forward", "backward"))
    at = [0] * stages
    posted: Counter = Counter()
    pending: list[dict[str, list]] = [{"forward": [], "backward": []} for _ in range(stages)]
    arrived: list[set] = [set() for _ in range(stages)]
    at_post: list = [None] * stages     # a post or exchange whose transfers are posted, not yet waited

    def done(entry) -> bool:
        (a, b, kind), n, _ = entry
        return posted[(a, b, "recv" if kind == "send" else "send")] > n

    def waited(s: int, phase: str, entries: list) -> None:
        pending[s][phase] = [e for e in pending[s][phase] if e not in entries]
        arrived[s].update((phase, t.mb, t.chunk) for (_, _, kind), _, t in entries if kind == "recv")

    moved = True
    while moved:
        moved = False
        for s in range(stages):
            while at[s] < len(plans[s]):
                item = plans[s][at[s]]
                kind = item[0]
                if kind in ("post", "exchange", "prefetch") and not at_post[s]:
                    old = {t.phase: [e for e in pending[s][t.phase] if e[0][2] == "send"] for t in item[1]}
                    if kind == "exchange":
                        old = {ph: list(pending[s][ph]) for ph in old}
                    if kind == "prefetch":
                        old = {}
                    new = []
                    for t in item[1]:
                        peer = (s + t.peer) % stages
                        key = (s, peer, "send") if t.send else (peer, s, "recv")
                        new.append((t.phase, (key, posted[key], t)))
                        posted[key] += 1
                    at_post[s] = (old, new)
                if kind in ("post", "exchange", "prefetch"):
                    old, new = at_post[s]
                    waits = [e for es in old.values() for e in es]
                    waits += [e for _, e in new] if kind == "exchange" else []
                    if not all(done(e) for e in waits):
                        break
                    for ph, es in old.items():
                        waited(s, ph, es)
                    for ph, e in new:
                        pending[s][ph].append(e)
                        if kind == "exchange":
                            waited(s, ph, [e])
                    at_post[s] = None
                elif kind in ("settle", "await"):
                    phase = item[1]
                    waits = [e for e in pending[s][phase] if e[0][2] == ("send" if kind == "settle" else "recv")]
                    waits = waits if kind == "settle" else waits[:1]
                    if not all(done(e) for e in waits):
                        break
                    waited(s, phase, waits)
                else:
                    _, mb, c = item
                    needs = not ((kind == "forward" and s == 0 and c == 0)
                                 or (kind == "backward" and s == stages - 1 and c == chunks - 1))
                    if needs and (kind, mb, c) not in arrived[s]:
                        return False
                at[s], moved = at[s] + 1, True
    return all(at[s] == len(plans[s]) and all(done(e) for d in pending[s].values() for e in d)
               for s in range(stages))


@pytest.mark.parametrize("stages,chunks,microbatches,group",
                         [(3, 2, 6, 0), (4, 3, 12, 0), (4, 2, 10, 5), (2, 2, 4, 0), (2, 3, 6, 0), (2, 2, 2, 0),
                          (2, 4, 8, 0), (2, 2, 6, 3), (4, 2, 4, 0), (3, 3, 3, 0), (4, 2, 12, 6)])
@pytest.mark.parametrize("warmup_flush", [False, True])
def test_overlapped_transfers_meet_in_order_and_run_to_the_end(stages, chunks, microbatches, group,
                                                               warmup_flush) -> None:
    """The overlapped plans, two stages included (each the other's previous and next stage),
    with the warm-up and cool-down overlapped too or not: between every ordered pair of stages
    the sends and the receives carry the same tensors in the same order, no stage waits on
    another in a cycle, and Megatron-Core's one wait per step, oldest receive first, always
    finds a compute's input received."""
    from echo_et.workloads.pipeline_plan import overlapped_schedule

    plans = [overlapped_schedule(stages, s, chunks, microbatches, group, warmup_flush=warmup_flush)
             for s in range(stages)]
    sends: dict = defaultdict(list)
    recvs: dict = defaultdict(list)
    for s, items in enumerate(plans):
        for t in (t for item in items if item[0] in ("post", "exchange", "prefetch") for t in item[1]):
            peer = (s + t.peer) % stages
            if not t.send:
                recvs[(peer, s)].append((t.phase, t.mb, t.chunk))
            elif t.phase == "forward":     # the last stage's chunk c feeds the first's c + 1
                sends[(s, peer)].append((t.phase, t.mb, t.chunk + 1 if s == stages - 1 else t.chunk))
            else:
                sends[(s, peer)].append((t.phase, t.mb, t.chunk - 1 if s == 0 else t.chunk))
    assert sends == recvs
    assert overlapped_runs_to_the_end(plans)


def test_the_overlapped_run_check_catches_a_deadlock() -> None:
    """Two stages that each wait for the other's gradient before sending their own never
    finish; one that sends first lets both."""
    from echo_et.workloads.pipeline_plan import Transfer

    def stage(peer: int, send_first: bool) -> list:
        recv = ("post", (Transfer(False, peer, "backward", 0, 0),))
        send = ("post", (Transfer(True, peer, "backward", 0, 0),))
        wait = ("await", "backward")
        return [send, recv, wait, ("backward", 0, 0)] if send_first else [recv, wait, ("backward", 0, 0), send]

    assert not overlapped_runs_to_the_end([stage(1, False), stage(-1, False)])
    assert overlapped_runs_to_the_end([stage(1, True), stage(-1, False)])


def test_the_overlapped_run_check_catches_a_compute_without_its_input() -> None:
    """A forward of the second stage's chunk before the receive of its activation is waited
    for (or one waiting for another micro-batch's) fails the check, though nothing deadlocks."""
    from echo_et.workloads.pipeline_plan import Transfer

    first = [("forward", 0, 0), ("forward", 1, 0), ("post", (Transfer(True, 1, "forward", 0, 0),)),
             ("post", (Transfer(True, 1, "forward", 1, 0),))]
    recvs = [("post", (Transfer(False, -1, "forward", 0, 0),)), ("post", (Transfer(False, -1, "forward", 1, 0),))]
    good = [*recvs, ("await", "forward"), ("forward", 0, 0), ("await", "forward"), ("forward", 1, 0)]
    assert overlapped_runs_to_the_end([first, good])
    assert not overlapped_runs_to_the_end([first, [*recvs, ("forward", 0, 0)]])
    assert not overlapped_runs_to_the_end([first, [*recvs, ("await", "forward"), ("forward", 1, 0)]])


def test_the_run_check_catches_a_deadlock() -> None:
    """Two stages that each first wait to receive from the other never finish; swapped so
    that one sends first, they do."""
    from echo_et.workloads.pipeline_plan import Transfer

    recv_prev, send_next = Transfer(False, -1, "forward", 0, 0), Transfer(True, 1, "forward", 0, 0)
    first = [("comm", (recv_prev,)), ("comm", (send_next,))]
    assert not runs_to_the_end([first, first])
    assert runs_to_the_end([[first[1], first[0]], first])


def test_schedule_refuses_what_megatron_refuses() -> None:
    with pytest.raises(EchoError, match="more than 2 stages"):
        interleaved_schedule(2, 0, 2, 4)
    with pytest.raises(EchoError, match=r"last group of 0 or at least pp \(3\); groups of 3 leave 1 of the 4"):
        interleaved_schedule(3, 0, 2, 4)


@pytest.fixture(scope="module")
def traced():
    from echo_et.trace.layout import ParallelLayout
    from echo_et.trace.tracer import TraceOptions, trace
    from echo_et.workloads import GPTConfig, Workload

    cfg = GPTConfig.megatron(layers=6, hidden=32, heads=4, seq=16, micro_batch=2, vocab=64,
                             layers_per_virtual_stage=1)
    layout = ParallelLayout(pp=3, tp=2, microbatches=6)
    wl = Workload(gpt=cfg)
    wl.validate(layout)
    return trace(wl.build_fn(), layout, TraceOptions(device="meta")).job


def test_traced_job_follows_the_schedule(traced) -> None:
    from echo_et.ir import check_job
    from echo_et.ir.schema import pb
    from echo_et.trace.compare import ex_situ_comms

    job = traced
    assert check_job(job) == []
    layer_runs: Counter = Counter()
    for rank in range(job.world_size):
        nodes = sorted(job.graph_of(rank).nodes, key=lambda n: n.id)
        p2p = [n for n in nodes if n.kind in (pb.KIND_SEND, pb.KIND_RECV)]
        stage = p2p[0].annotations.stage
        want = [(t.send, (stage + t.peer) % 3, t.phase, t.mb)
                for item in interleaved_schedule(3, stage, 2, 6) if item[0] == "comm" for t in item[1]]
        got = [(n.kind == pb.KIND_SEND, n.p2p.peer, n.annotations.phase, n.annotations.microbatch) for n in p2p]
        assert got == want, rank
        # 1/tp slices (scatter/gather): every received tensor all-gathered in the TP group
        comms = Counter(c for c in ex_situ_comms(job, rank) if c[0] == "all_gather")
        assert sum(comms.values()) == sum(1 for w in want if not w[0])
        # the word embedding's gradient all-reduced between the first and the last stage
        embd = [c for c in ex_situ_comms(job, rank) if c[2] == "embd"]
        assert len(embd) == (1 if stage in (0, 2) else 0)
        if rank % 2 == 0:   # one TP rank per stage: which layers each micro-batch's forward ran
            for n in nodes:
                a = n.annotations
                if a.phase == "forward" and a.HasField("layer") and n.name == "aten::native_layer_norm":
                    layer_runs[(a.microbatch, a.layer, stage)] += 1
    # chunk c of stage s holds layer c x 3 + s; each layer runs once per micro-batch's forward
    # (two LayerNorms), on its stage only
    assert layer_runs == Counter({(mb, c * 3 + s, s): 2 for mb in range(6) for c in range(2) for s in range(3)})


MODEL = ["--layers", "8", "--hidden", "1024", "--heads", "8", "--seq", "512", "--micro-batch", "1",
         "--global-batch", "8", "--vocab", "1024", "--gpu", "a100"]
TINY = [*MODEL, "--pp", "4", "--json"]


def _predict(tmp_path, name: str, *extra: str) -> dict:
    res = runner.invoke(app, ["predict", *TINY, *extra, "-o", str(tmp_path / name)])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_interleaving_shrinks_the_predicted_bubble(tmp_path) -> None:
    plain = _predict(tmp_path, "plain")
    inter = _predict(tmp_path, "inter", "--num-layers-per-virtual-pipeline-stage", "1")
    bubble = {k: sum(r["bubble_ns"] for r in d["ranks"].values()) for k, d in (("plain", plain),
                                                                               ("inter", inter))}
    assert 0 < bubble["inter"] < 0.8 * bubble["plain"]     # v = 2: about half
    assert inter["step_time_ns"] < plain["step_time_ns"]
    cmd = json.loads((tmp_path / "inter" / "summary.json").read_text())
    assert cmd["prediction"]["layers_per_virtual_stage"] == 1
    assert "layers_per_virtual_stage" not in json.loads((tmp_path / "plain" / "summary.json").read_text())["prediction"]
    # the Job records the virtual pipeline size (Megatron's model chunks per stage), 0 without
    from echo_et.ir import load_job

    assert load_job(tmp_path / "inter" / "job").manifest.layout.vpp == 2
    assert load_job(tmp_path / "plain" / "job").manifest.layout.vpp == 0


def test_trace_records_the_flag(tmp_path) -> None:
    from echo_et.ir import load_job

    args = ["trace", "--workload", "megatron-gpt", "--layers", "6", "--hidden", "32", "--heads", "4", "--seq", "16",
            "--vocab", "64", "--pp", "3", "--microbatches", "3", "--device", "meta", "--jobs", "1",
            "--num-layers-per-virtual-pipeline-stage", "1", "-o", str(tmp_path / "job")]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    job = load_job(tmp_path / "job")
    assert "--num-layers-per-virtual-pipeline-stage 1" in job.manifest.provenance.command
    assert job.manifest.layout.vpp == 2              # 6 layers over 3 stages, 1 per chunk: 2 chunks a stage
    from echo_et.converters.simai_writer import layout_of

    assert layout_of(job, 0).vpp == 2                # what SimAI's header says (its bubble formula reads it)
    # re-staging reads contiguous stages: an interleaved Job is refused in one line
    res = runner.invoke(app, ["scale", str(tmp_path / "job"), "--pp", "2", "-o", str(tmp_path / "restaged")])
    assert res.exit_code == 2 and "interleaved pipeline schedule" in res.stderr, res.output
    assert len(res.stderr.strip().splitlines()) == 1


BASE = ["trace", "--workload", "megatron-gpt", "--layers", "12", "--hidden", "32", "--heads", "4", "--seq", "16",
        "--vocab", "64", "--device", "meta"]


@pytest.mark.parametrize("extra,message", [
    (["--pp", "2", "--microbatches", "4", "--num-layers-per-virtual-pipeline-stage", "3"], "need pp > 2"),
    (["--pp", "3", "--microbatches", "3", "--num-layers-per-virtual-pipeline-stage", "5"],
     "layers (12) to be a multiple of pp x 5"),
    (["--pp", "3", "--microbatches", "3", "--num-layers-per-virtual-pipeline-stage", "4"],
     "at least 2 chunks per stage"),
    (["--pp", "3", "--microbatches", "4", "--num-layers-per-virtual-pipeline-stage", "2"],
     "micro-batches (4) to be a multiple of pp (3)"),
    (["--pp", "3", "--microbatches", "3", "--num-layers-per-virtual-pipeline-stage", "-1"], "must be >= 0"),
    (["--pp", "3", "--microbatches", "3", "--num-layers-per-virtual-pipeline-stage", "2", "--grad-sync", "overlap"],
     "gradient sync after the backward pass"),
])
def test_bad_input_is_one_line(tmp_path, extra, message) -> None:
    res = runner.invoke(app, [*BASE, *extra, "-o", str(tmp_path / "job")])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], res.stderr
    assert not (tmp_path / "job").exists()


def test_bad_input_predict_and_sweep(tmp_path) -> None:
    res = runner.invoke(app, ["predict", *MODEL, "--pp", "2", "--num-layers-per-virtual-pipeline-stage", "2",
                              "-o", str(tmp_path / "p")])
    assert res.exit_code == 2 and "need pp > 2" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    csv = tmp_path / "c.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,layers_per_virtual_stage\n"
                   "6,32,4,16,1,3,1,3,1,1\n")
    res = runner.invoke(app, ["sweep", "--configs", str(csv), "--num-layers-per-virtual-pipeline-stage", "1",
                              "--dp", "1", "-o", str(tmp_path / "s")])
    assert res.exit_code == 2 and "cannot be combined with --configs" in res.stderr


def test_sweep_rows_take_their_own_virtual_stages(tmp_path) -> None:
    from echo_et.experiments.config_csv import read_configs
    from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for

    csv = tmp_path / "c.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,layers_per_virtual_stage\n"
                   "12,64,4,32,1,6,1,3,1,\n12,64,4,32,1,6,1,3,1,2\n12,64,4,32,1,6,1,3,1,0\n")
    rows = read_configs(csv)
    for opts, want in ((ConfigSweepOptions(), [0, 2, 0]),
                       (ConfigSweepOptions(layers_per_virtual_stage=1), [1, 2, 0])):
        assert [workload_for(r, opts)[0].layers_per_virtual_stage for r in rows] == want
    assert "layers_per_virtual_stage" not in ConfigSweepOptions().to_json()
    with pytest.raises(EchoError, match="multiple of pp x 3"):
        workload_for(rows[0], ConfigSweepOptions(layers_per_virtual_stage=3))


# -- the schedule run for real: gloo processes, the gradients of a one-stage run -------------
# the gpt workload with the gradients reduced after the backward (the interleaved schedule's
# need); megatron-gpt's process groups for its tied embedding and gradient norm are made by
# some stages only, which a real run of more than 2 stages waits on (the meta trace above
# covers them)
REAL = {"layers": 6, "hidden": 32, "heads": 4, "seq": 8, "micro_batch": 2, "vocab": 64,
        "grad_sync": "after-backward"}


def test_real_run_gives_the_gradients_of_one_stage(tmp_path) -> None:
    """Three gloo processes run the interleaved schedule (two chunks each) for real: every
    send meets its receive, and each parameter's gradient, summed over 6 micro-batches, is
    the one-stage run's."""
    import torch
    from gpt_real_runs import real_grads

    ref = real_grads(tmp_path, **REAL)
    got = real_grads(tmp_path, pp=3, layers_per_virtual_stage=1, **REAL)
    assert got.keys() == ref.keys() and len(ref) > 6 * 8
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.parametrize("pp,flush", [(3, False), (2, False), (3, True), (2, True)])
def test_overlapped_pipeline_communication_gives_the_gradients_of_one_stage(tmp_path, pp: int, flush: bool) -> None:
    """Megatron's overlap_p2p_comm, for real on gloo processes: every send and receive posted
    on its own and waited for only before the compute that needs it still meets its peer, and
    each parameter's gradient is the one-stage run's; on two stages too (each the other's
    previous and next), which Megatron allows with the transfers overlapped; and with the
    warm-up's and cool-down's transfers overlapped too (``overlap_p2p_comm_warmup_flush``)."""
    import torch
    from gpt_real_runs import real_grads

    ref = real_grads(tmp_path, **REAL)
    got = real_grads(tmp_path, pp=pp, layers_per_virtual_stage=6 // (2 * pp), overlap_p2p_comm=True,
                     overlap_p2p_comm_warmup_flush=flush, **REAL)
    assert got.keys() == ref.keys() and len(ref) > 6 * 8
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)


def test_overlapped_plan_is_megatron_cores() -> None:
    """Megatron-Core's overlap_p2p_comm: in the steady 1F1B steps a forward's send and the next
    forward's receive are posted right after that forward, before the backward that follows it,
    and its send waited for at once (the output is freed after it); a backward's after that
    backward. The warm-up's and the cool-down's exchanges are posted and waited for at once,
    but for the first gradient's receive, posted with the last warm-up exchange. Every transfer
    of the batched plan is posted once, in its direction's order."""
    from echo_et.workloads.pipeline_plan import interleaved_schedule, overlapped_schedule

    for stages, chunks, mbs in ((3, 2, 6), (4, 2, 8), (4, 3, 4)):
        for stage in range(stages):
            plan = interleaved_schedule(stages, stage, chunks, mbs)
            over = overlapped_schedule(stages, stage, chunks, mbs)
            assert {i[0] for i in over} <= {"forward", "backward", "post", "exchange", "settle", "await"}
            for phase in ("forward", "backward"):
                batched = [t for i in plan if i[0] == "comm" for t in i[1] if t.phase == phase]
                posted = [t for i in over if i[0] in ("post", "exchange") for t in i[1]]
                assert [t for t in posted if t.phase == phase] == batched
            compute = [i for i in over if i[0] in ("forward", "backward")]
            assert compute == [i for i in plan if i[0] != "comm"]
            first_backward = next(k for k, i in enumerate(over) if i[0] == "backward")
            last_forward = max(k for k, i in enumerate(over) if i[0] == "forward")
            first_steady = max(k for k in range(first_backward) if over[k][0] == "forward")
            for k, item in enumerate(over):
                if item[0] == "post" and item[1][0].phase == "forward":
                    assert over[k - 1][0] == "forward" and over[k + 1] == ("settle", "forward")
                    sent = [t for t in item[1] if t.send]
                    assert not sent or (over[k - 1][1], over[k - 1][2]) == (sent[0].mb, sent[0].chunk)
                    # before the backward that follows (and its wait)
                    assert next(i for i in over[k:] if i[0] in ("forward", "backward"))[0] == "backward"
                if item[0] == "exchange":
                    assert k < first_backward or k > last_forward    # only outside the steady steps
                if item[0] == "await":      # Megatron-Core's wait, right before a compute of its direction
                    assert over[k + 1][0] == item[1]
                    assert item[1] == "backward" or k + 1 >= first_steady     # no forward waits in the warm-up
            # the first gradient's receive, posted with the last warm-up exchange
            warm = [i for i in over[:first_backward] if i[0] == "post" and i[1][0].phase == "backward"]
            assert len(warm) <= 1 and all(not t.send for i in warm for t in i[1])
            # the leading stage's first-chunk forwards wait for nothing, as Megatron's skip the wait
            if stage == 0:
                assert all(over[k - 1] != ("await", "forward") for k, i in enumerate(over)
                           if i[0] == "forward" and i[2] == 0)


def test_warmup_flush_plan_is_megatron_cores() -> None:
    """Megatron-Core's overlap_p2p_comm_warmup_flush: in the warm-up and the cool-down too the
    transfers are posted, not exchanged; a stage that is not the leading one posts the receive
    for the next step before this step's compute (after waiting for this step's own), the
    leading one with its send after it; every compute but a stage's first of a direction (and
    those that receive nothing) waits for one receive first. Only the receives before a
    direction's first step are still exchanged. The steady steps are as without it."""
    from echo_et.workloads.pipeline_plan import interleaved_schedule, overlapped_schedule

    for stages, chunks, mbs, group in ((3, 2, 6, 0), (4, 2, 8, 0), (4, 3, 4, 0), (2, 2, 4, 0), (4, 2, 10, 5)):
        for stage in range(stages):
            plan = interleaved_schedule(stages, stage, chunks, mbs, group, overlapped=True)
            over = overlapped_schedule(stages, stage, chunks, mbs, group, warmup_flush=True)
            assert {i[0] for i in over} <= {"forward", "backward", "post", "exchange", "settle", "await",
                                            "prefetch"}
            compute = [i for i in over if i[0] in ("forward", "backward")]
            assert compute == [i for i in plan if i[0] != "comm"]
            for phase in ("forward", "backward"):
                batched = [t for i in plan if i[0] == "comm" for t in i[1] if t.phase == phase]
                posted = [t for i in over if i[0] in ("post", "exchange", "prefetch") for t in i[1]]
                assert sorted(t for t in posted if t.phase == phase) == sorted(batched)
            exchanged = [i for i in over if i[0] == "exchange"]
            assert all(not t.send for i in exchanged for t in i[1]) and len(exchanged) <= 2
            leading = {"forward": stage == 0, "backward": stage == stages - 1}
            for k, item in enumerate(over):
                if item[0] == "prefetch":
                    phase = item[1][0].phase
                    assert not leading[phase] and all(not t.send for t in item[1])
                    assert over[k + 1][0] == phase                   # before this step's compute
                    # the receive for the next step of its direction, after this step's own was waited for
                    assert over[k - 1] == ("await", phase) or not [i for i in over[:k] if i[0] == phase]
            steady = [k for k, i in enumerate(plan) if i[0] == "backward" and plan[k - 1][0] == "forward"]
            for phase, edge in (("forward", (stage == 0, 0)), ("backward", (stage == stages - 1, chunks - 1))):
                steps = [k for k, i in enumerate(over) if i[0] == phase]
                for n, k in enumerate(steps):
                    before = over[k - 2] if over[k - 1][0] == "prefetch" else over[k - 1]
                    needs = not (edge[0] and over[k][2] == edge[1])
                    # a direction's first step waits only for the first gradient's receive, posted with
                    # the last warm-up step (the first activation is exchanged before the warm-up)
                    posted_first = phase == "backward" and bool(steady)
                    assert (before == ("await", phase)) == (needs and (n > 0 or posted_first)), (stages, stage, n)
            # the steady steps are the plain overlapped plan's
            plain = overlapped_schedule(stages, stage, chunks, mbs, group)
            if steady:
                def middle(items: list) -> list:
                    ks = [k for k, i in enumerate(items) if i[0] in ("forward", "backward")]
                    pairs = [k for k in ks if items[k][0] == "backward"
                             and items[max(j for j in ks if j < k)][0] == "forward"]
                    return items[pairs[0] - 1: pairs[-1] + 1]
                assert middle(over)[2:] == middle(plain)[2:]


def test_overlapped_pipeline_communication_is_traced_and_off_without_interleaving(tmp_path) -> None:
    from echo_et.ir import check_job, load_job
    from echo_et.ir.schema import pb

    base = ["trace", "--workload", "megatron-gpt", "--layers", "12", "--hidden", "64", "--heads", "4",
            "--seq", "16", "--vocab", "64", "--pp", "3", "--tp", "2", "--microbatches", "6", "--device", "meta",
            "--jobs", "1"]
    syncs = {}
    for name, extra in (("batched", []), ("overlapped", ["--overlap-p2p-communication"])):
        res = runner.invoke(app, [*base, "--num-layers-per-virtual-pipeline-stage", "2", *extra,
                                  "-o", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        job = load_job(tmp_path / name)
        assert check_job(job) == []
        g = job.graph_of(0)
        syncs[name] = sum(1 for n in g.nodes if n.kind == pb.KIND_SYNC)
        assert sum(1 for n in g.nodes if n.kind in (pb.KIND_SEND, pb.KIND_RECV)) == 36
    assert "--overlap-p2p-communication" in job.manifest.provenance.command
    # no device synchronisation after the exchanges: only get_batch's reads are left
    assert syncs["overlapped"] < syncs["batched"] - 12
    # without an interleaved schedule Megatron turns it off, and so does echo-et: the plain run
    res = runner.invoke(app, [*base, "--overlap-p2p-communication", "-o", str(tmp_path / "plain")])
    assert res.exit_code == 0, res.output
    assert "--overlap-p2p-communication" not in load_job(tmp_path / "plain").manifest.provenance.command
    # the library refuses it outright
    from echo_et.trace.layout import ParallelLayout
    from echo_et.workloads.gpt_config import GPTConfig

    with pytest.raises(EchoError, match="overlapped with the compute is the interleaved schedule's"):
        GPTConfig.megatron(layers=12, hidden=64, heads=4, overlap_p2p_comm=True).validate(
            ParallelLayout(pp=3, microbatches=6))
    # two stages: Megatron's rule (pp > 2) holds for the batched exchanges, not the overlapped ones
    at = base.index("--pp")
    two = [*base[:at], *base[at + 2:], "--pp", "2"]
    res = runner.invoke(app, [*two, "--num-layers-per-virtual-pipeline-stage", "2", "-o", str(tmp_path / "two")])
    assert res.exit_code == 2 and "need pp > 2, or pp > 1 with the pipeline communication overlapped" in res.stderr
    res = runner.invoke(app, [*two, "--num-layers-per-virtual-pipeline-stage", "2", "--overlap-p2p-communication",
                              "-o", str(tmp_path / "two")])
    assert res.exit_code == 0, res.output
    job = load_job(tmp_path / "two")
    assert check_job(job) == [] and job.manifest.layout.vpp == 3


def test_overlapped_pipeline_communication_hides_the_sends(tmp_path) -> None:
    args = ["predict", "--layers", "24", "--hidden", "1024", "--heads", "16", "--seq", "1024", "--micro-batch", "1",
            "--global-batch", "12", "--tp", "1", "--pp", "3", "--dp", "1", "--num-layers-per-virtual-pipeline-stage",
            "2", "--gpu", "a100", "--gpus-per-node", "1", "--inter-bw", "100Gb/s/node", "--json"]
    out = {}
    for name, extra in (("batched", []), ("overlapped", ["--overlap-p2p-communication"])):
        res = runner.invoke(app, [*args, *extra, "-o", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        out[name] = json.loads(res.stdout)
    assert out["overlapped"]["prediction"]["overlap_p2p_comm"] is True
    # no host blocked on the device after each exchange: the host runs ahead of the kernels
    idle = {k: sum(r["host_idle_ns"] for r in v["ranks"].values()) for k, v in out.items()}
    assert idle["overlapped"] < 0.5 * idle["batched"], idle
    assert out["overlapped"]["step_time_ns"] < 0.97 * out["batched"]["step_time_ns"]


@pytest.mark.parametrize("zero", [0, 1])
def test_each_model_chunk_reduces_its_own_gradient_buffer(zero):
    """Megatron wraps each model chunk in its own DDP module: with the interleaved schedule
    the data-parallel reduction is one collective per chunk, in chunk order, together the
    bytes of the stage's one buffer without interleaving (the same parameters)."""
    from echo_et.trace.compare import ex_situ_comms
    from echo_et.trace.layout import ParallelLayout
    from echo_et.trace.tracer import TraceOptions, trace
    from echo_et.workloads import GPTConfig, Workload

    def dp_comms(n: int) -> list[tuple[str, int, str]]:
        cfg = GPTConfig.megatron(layers=6, hidden=32, heads=4, seq=16, micro_batch=1, vocab=64,
                                 dtype="float32", layers_per_virtual_stage=n)
        layout = ParallelLayout(pp=3, dp=2, microbatches=3, zero=zero)
        Workload(gpt=cfg).validate(layout)
        job = trace(Workload(gpt=cfg).build_fn(), layout, TraceOptions(device="meta", warmup_steps=0)).job
        return [c for c in ex_situ_comms(job, 2) if c[2] == "dp" and c[1] > 4]   # a middle stage

    kind = "reduce_scatter" if zero else "all_reduce"
    plain = [c for c in dp_comms(0) if c[0] == kind]
    chunked = [c for c in dp_comms(1) if c[0] == kind]
    assert len(plain) == 1 and len(chunked) == 2
    assert sum(b for _, b, _ in chunked) == plain[0][1]
    # chunk 0 (layer 1) and chunk 1 (layer 4) of a middle stage: the same layer shapes
    assert chunked[0][1] == chunked[1][1]


def test_a_sweeps_overlapped_communication_holds_for_its_interleaved_rows() -> None:
    """``sweep --configs --overlap-p2p-communication`` over plain and interleaved rows: as in
    Megatron, the plain rows run without it."""
    from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for

    row = {"layers": 12, "hidden": 64, "heads": 4, "seq": 16, "micro_batch": 1, "global_batch": 6, "tp": 1,
           "pp": 3, "dp": 1}
    opts = ConfigSweepOptions(overlap_p2p_comm=True)
    assert workload_for(row, opts)[0].overlap_p2p_comm is False
    assert workload_for({**row, "layers_per_virtual_stage": 2}, opts)[0].overlap_p2p_comm is True
    assert workload_for({**row, "virtual_stages_per_rank": 2}, opts)[0].overlap_p2p_comm is True
    assert workload_for({**row, "layers_per_virtual_stage": 2}, ConfigSweepOptions())[0].overlap_p2p_comm is False
    # the warm-up flag implies the overlapped transfers, on the interleaved rows only
    flush = ConfigSweepOptions(overlap_p2p_comm=True, overlap_p2p_comm_warmup_flush=True)
    plain = workload_for(row, flush)[0]
    assert not plain.overlap_p2p_comm and not plain.overlap_p2p_comm_warmup_flush
    both = workload_for({**row, "layers_per_virtual_stage": 2}, flush)[0]
    assert both.overlap_p2p_comm and both.overlap_p2p_comm_warmup_flush


def test_warmup_flush_flag_is_traced_predicted_and_refused_without_interleaving(tmp_path) -> None:
    """``--overlap-p2p-communication-warmup-flush``: Megatron's flag alone turns the overlapped
    transfers on (its default with the interleaved schedule) and is recorded in the Job's
    command; its warm-up and cool-down post their transfers (no exchange waited for at once but
    the receives before each direction's first step); without an interleaved schedule predict,
    trace and the library refuse it in one line, as Megatron does, and nothing is written."""
    from echo_et.ir import check_job, load_job
    from echo_et.trace.layout import ParallelLayout
    from echo_et.workloads.gpt_config import GPTConfig

    flag = "--overlap-p2p-communication-warmup-flush"
    base = ["trace", "--workload", "megatron-gpt", "--layers", "12", "--hidden", "64", "--heads", "4",
            "--seq", "16", "--vocab", "64", "--pp", "3", "--tp", "1", "--microbatches", "6", "--device", "meta",
            "--jobs", "1"]
    res = runner.invoke(app, [*base, "--num-layers-per-virtual-pipeline-stage", "2", flag, "-o", str(tmp_path / "j")])
    assert res.exit_code == 0, res.output
    job = load_job(tmp_path / "j")
    assert check_job(job) == []
    assert flag in job.manifest.provenance.command and "--overlap-p2p-communication " not in \
        job.manifest.provenance.command + " "
    res = runner.invoke(app, [*base, "--num-layers-per-virtual-pipeline-stage", "2", "--overlap-p2p-communication",
                              "-o", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output

    def receives_before_compute(j) -> int:
        from echo_et.ir.schema import pb

        kinds = [n.kind for n in j.graph_of(1).nodes]       # the second stage
        return kinds[:kinds.index(pb.KIND_COMPUTE)].count(pb.KIND_RECV)

    # the second stage posts the next activation's receive before its first forward with the flag
    assert receives_before_compute(load_job(tmp_path / "o")) == 1
    assert receives_before_compute(job) == 2
    res = runner.invoke(app, [*base, flag, "-o", str(tmp_path / "plain")])
    assert res.exit_code == 2 and "interleaved schedule's (Megatron refuses it without one)" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "plain").exists()
    with pytest.raises(EchoError, match="need the steady steps' overlapped too"):
        GPTConfig.megatron(layers=12, hidden=64, heads=4, layers_per_virtual_stage=2,
                           overlap_p2p_comm_warmup_flush=True).validate(ParallelLayout(pp=3, microbatches=6))
    args = ["predict", "--layers", "24", "--hidden", "1024", "--heads", "16", "--seq", "1024", "--micro-batch", "1",
            "--global-batch", "12", "--tp", "1", "--pp", "3", "--dp", "1", "--gpu", "a100", "--json"]
    res = runner.invoke(app, [*args, flag, "-o", str(tmp_path / "p0")])
    assert res.exit_code == 2 and f"{flag}: it needs --overlap-p2p-communication" in res.stderr, res.output
    assert not (tmp_path / "p0").exists()
    res = runner.invoke(app, [*args, "--num-layers-per-virtual-pipeline-stage", "2", flag, "-o", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    pred = json.loads(res.stdout)["prediction"]
    assert pred["overlap_p2p_comm"] is True and pred["overlap_p2p_comm_warmup_flush"] is True
