"""Where the rows of a sweep run: local worker processes, Dask or Ray; one place that imports
Dask and Ray (optional), starts a local cluster or joins one at an address, and shuts down
what it started.

Every executor gives back, for each row, either what the row function returned or a
:class:`Failure`: a worker that died (killed by a signal, OOM-killed) or a row that ran past
its memory budget is that row's error, and the sweep goes on with a fresh worker. Locally
each worker is a child process with its memory budget set as ``RLIMIT_DATA``
(:func:`limit_memory`), so a row that needs more fails with a clear error instead of the
kernel killing a worker; Dask gets the budget as each worker's ``memory_limit`` (its nanny
restarts a worker past it), Ray as each task's ``memory`` resource.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from echo_et.errors import OptionError
from echo_et.ir.limits import format_size, total_memory

EXECUTORS = ("local", "dask", "ray")
ROWS_PER_WORKER = 64   # a local worker is replaced after this many rows: a worker's heap only grows
# Test-only hooks, read in a worker process for the row it is about to run (its index): kill
# the worker with SIGKILL, or allocate more than the memory budget. They let the tests make a
# worker die, or a row overrun its budget, at a row of their choosing.
KILL_ROW_ENV = "ECHO_ET_TEST_KILL_ROW"
HOG_ROW_ENV = "ECHO_ET_TEST_HOG_ROW"

Task = tuple[int, Any]                    # (row index, what the row function gets)
Report = Callable[[int, Any], None]       # (row index, result or Failure)


@dataclass(frozen=True)
class Failure:
    """A row that returned nothing: its worker died, or it needed more memory than its budget.
    Such a failure says nothing about the row itself, so a resumed sweep runs it again."""

    message: str


# -- memory ----------------------------------------------------------------------------------------
def default_memory_budget(workers: int) -> int:
    """The machine's memory divided among ``workers``: what each may use when the caller
    gives no budget."""
    return total_memory() // max(1, workers)


def check_memory_budget(max_memory: int | None) -> None:
    """A budget is a positive number of bytes (None: the default)."""
    if max_memory is not None and max_memory <= 0:
        raise OptionError("max_memory", f"a memory budget must be > 0 bytes, got {max_memory}")


def memory_message(max_memory: int | None) -> str:
    """A row's error when it ran out of memory (the option name says which budget)."""
    if max_memory is None:
        return "ran out of memory"
    return f"max_memory: row needs more than {format_size(max_memory)}"


_BUDGET: int | None = None   # the budget applied to this process, if any


def limit_memory(max_memory: int | None) -> None:
    """Cap this process's private writable memory (``RLIMIT_DATA``: heap, anonymous maps) at
    ``max_memory``; an allocation past it raises MemoryError. Not ``RLIMIT_AS``: that counts
    address space a process only reserves (shared libraries, thread stacks, malloc arenas,
    CUDA's reservations), which is 3x what a CPU torch worker uses and far more with CUDA."""
    global _BUDGET
    if max_memory is None:
        return
    try:
        import resource
    except ImportError:   # not on this platform: the budget is not enforced
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    soft = max_memory if hard == resource.RLIM_INFINITY else min(max_memory, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    _BUDGET = max_memory


# -- one row, in whichever worker runs it ------------------------------------------------------------
def hooks_from_env() -> dict[str, str]:
    """The test-only hooks set in this process's environment (see KILL_ROW_ENV), read where
    the sweep starts and handed to its workers (a forked worker's environment is that of the
    process it was forked from, not the sweep's)."""
    return {k: os.environ[k] for k in (KILL_ROW_ENV, HOG_ROW_ENV) if os.environ.get(k)}


def run_row(fn: Callable[[Any, Any], Any], shared: Any, index: int, task: Any,
            hooks: dict[str, str] | None = None) -> Any:
    """``fn(shared, task)``, or a Failure when it ran out of memory or raised something that
    is not the row's own error (the row function turns those into rows itself)."""
    try:
        _apply_hooks(hooks or {}, index)
        return fn(shared, task)
    except MemoryError:
        return Failure(memory_message(_BUDGET))
    except RuntimeError as e:   # torch's allocator says so in a RuntimeError
        if "can't allocate memory" in str(e) or "bad_alloc" in str(e):
            return Failure(memory_message(_BUDGET))
        return Failure(_one_line(e))
    except Exception as e:  # noqa: BLE001 - any other crash is this row's, not the sweep's
        return Failure(_one_line(e))


def _one_line(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _apply_hooks(hooks: dict[str, str], index: int) -> None:
    """The test-only hooks for row ``index``; inert in the main process."""
    if not hooks or multiprocessing.parent_process() is None:
        return
    if str(index) in hooks.get(KILL_ROW_ENV, "").split(","):
        os.kill(os.getpid(), signal.SIGKILL)
    if _BUDGET is not None and str(index) in hooks.get(HOG_ROW_ENV, "").split(","):
        bytearray(_BUDGET + 1)


def death_message(exitcode: int | None) -> str:
    """A dead worker's exit, as its row's error."""
    if exitcode is not None and exitcode < 0:
        sig = -exitcode
        if sig == signal.SIGKILL:
            return f"worker died: killed by signal {sig} (out of memory?)"
        try:
            name = signal.Signals(sig).name
        except ValueError:
            return f"worker died: killed by signal {sig}"
        return f"worker died: killed by signal {sig} ({name})"
    return f"worker died: exit status {exitcode}"


# -- local worker processes --------------------------------------------------------------------------
def _serve(conn: Any, fn: Callable[[Any, Any], Any], shared: Any, max_memory: int | None,
           hooks: dict[str, str]) -> None:
    """A worker's loop: run the rows it is sent until told to stop (None) or a row fails
    (a worker that ran out of memory is not trusted with another row)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the sweep's to handle: it stops us
    limit_memory(max_memory)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):   # the sweep is gone
            return
        if msg is None:
            return
        out = run_row(fn, shared, *msg, hooks)
        try:
            try:
                conn.send(out)
            except MemoryError:   # the result did not fit in the budget either
                out = Failure(memory_message(_BUDGET))
                conn.send(out)
        except (OSError, ValueError, MemoryError):
            return
        if isinstance(out, Failure):
            return


class _Worker:
    """One child process and the row it is running."""

    def __init__(self, ctx: Any, fn: Callable[[Any, Any], Any], shared: Any, max_memory: int | None):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, fn, shared, max_memory, hooks_from_env()),
                                   daemon=True)
        self.process.start()
        child.close()
        self.index: int | None = None
        self.served = 0

    def send(self, index: int, task: Any) -> None:
        """Hand it a row; a worker that died while idle is found dead by :meth:`collect`."""
        self.index, self.served = index, self.served + 1
        with contextlib.suppress(OSError):
            self.conn.send((index, task))

    def collect(self) -> Any:
        """The row's result, or a Failure when the worker died before sending it."""
        try:
            if self.conn.poll():
                return self.conn.recv()
        except (EOFError, OSError):
            pass
        self.process.join()
        return Failure(death_message(self.process.exitcode))

    def stop(self, *, now: bool = False) -> None:
        """Let it finish (it is idle, or has failed), or with ``now`` kill it: the sweep was
        interrupted and its row would be lost anyway."""
        if not now:
            with contextlib.suppress(OSError, ValueError):
                self.conn.send(None)
            self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def _context(preload: Sequence[str]) -> Any:
    """A forkserver (modules imported once, workers forked from it: fast to start, and no
    threads of ours inherited) where there is one, else spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        if preload:   # only the first start of the forkserver reads it
            ctx.set_forkserver_preload(list(preload))
        return ctx
    return multiprocessing.get_context("spawn")


def run_local(fn: Callable[[Any, Any], Any], shared: Any, tasks: Sequence[Task], *, workers: int,
              max_memory: int | None, report: Report, preload: Sequence[str] = ()) -> None:
    """``fn(shared, task)`` for every task on at most ``workers`` child processes, each
    within ``max_memory`` bytes, ``report(index, result or Failure)`` as each finishes.
    ``fn`` must be importable by name (it is sent to the workers by reference)."""
    from multiprocessing.connection import wait

    queue = collections.deque(tasks)
    ctx = _context(preload)
    slots: list[_Worker | None] = [None] * max(1, min(workers, len(queue)))
    interrupted = True
    try:
        while queue or any(w is not None and w.index is not None for w in slots):
            _hand_out(slots, queue, lambda: _Worker(ctx, fn, shared, max_memory))
            busy = [w for w in slots if w is not None and w.index is not None]
            wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
            for k, w in enumerate(slots):
                if w is not None and w.index is not None and _ready(w):
                    out, index, w.index = w.collect(), w.index, None
                    if isinstance(out, Failure):
                        w.stop()
                        slots[k] = None
                    report(index, out)
        interrupted = False
    finally:
        for w in slots:
            if w is not None:
                w.stop(now=interrupted)


def _ready(w: _Worker) -> bool:
    return w.conn.poll() or not w.process.is_alive()


def _hand_out(slots: list[_Worker | None], queue: collections.deque, start: Callable[[], _Worker]) -> None:
    """Give each idle slot the next task, starting a worker where there is none (or where the
    one there has served its ROWS_PER_WORKER rows)."""
    for k, w in enumerate(slots):
        if not queue or (w is not None and w.index is not None):
            continue
        if w is None or w.served >= ROWS_PER_WORKER:
            if w is not None:
                w.stop()
            w = slots[k] = start()
        w.send(*queue.popleft())


# -- Dask ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def dask_client(workers: int | None, address: str | None,
                memory_limit: int | None = None) -> Iterator[tuple[Any, Any]]:
    """(client, dask.distributed.as_completed): a client of the cluster at ``address``, or
    of a local one of ``workers`` single-threaded worker processes, each restarted by its
    nanny past ``memory_limit`` bytes (default: the machine's memory shared among them). A
    task whose worker died fails at the second death (``allowed-failures`` 1: a row that
    only shared the dying worker gets another try), and a worker holds one task at a time."""
    try:
        import dask
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise OptionError("executor", "the dask executor needs dask.distributed "
                                      "(pip install 'dask[distributed]')") from None
    cluster = None
    if address:
        client = Client(address)
    else:
        with dask.config.set({"distributed.scheduler.allowed-failures": 1,
                              "distributed.scheduler.worker-saturation": 1.0}):
            cluster = LocalCluster(n_workers=max(1, workers or 1), threads_per_worker=1, processes=True,
                                   memory_limit=memory_limit or "auto", dashboard_address=None)
            client = Client(cluster)
    try:
        yield client, as_completed
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def run_dask(fn: Callable[[Any, Any], Any], shared: Any, tasks: Sequence[Task], *,
             workers: int | None, address: str | None, max_memory: int | None, report: Report) -> None:
    """The tasks on Dask, ``shared`` made once by a task of its own that every row task
    needs (a worker fetches it once; unlike scattered data it is made again when the worker
    holding it dies); a task whose worker died (``KilledWorker``) is reported as a Failure."""
    if not tasks:
        return
    with dask_client(workers, address, max_memory) as (client, as_completed):
        from distributed import KilledWorker

        data = client.submit(_identity, shared, pure=False)
        hooks = hooks_from_env()
        futs = [client.submit(run_row, fn, data, i, task, hooks, pure=False, retries=0) for i, task in tasks]
        index = {f.key: i for f, (i, _) in zip(futs, tasks, strict=True)}
        for fut in as_completed(futs):
            try:
                out = fut.result()
            except KilledWorker:
                out = Failure("worker died: the Dask worker running it was lost (out of memory?)")
            except Exception as e:  # noqa: BLE001 - a task's crash is its row's error
                out = Failure(_one_line(e))
            report(index[fut.key], out)


def _identity(value: Any) -> Any:
    return value


# -- Ray ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def ray_session(workers: int | None, address: str | None) -> Iterator[Any]:
    """The ``ray`` module, initialised at ``address`` or locally with ``workers`` CPUs unless
    already initialised (then left running)."""
    try:
        import ray
    except ImportError:
        raise OptionError("executor", "the ray executor needs ray (pip install ray)") from None
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=max(1, workers or 1), log_to_driver=False, include_dashboard=False)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def run_ray(fn: Callable[[Any, Any], Any], shared: Any, tasks: Sequence[Task], *,
            workers: int | None, address: str | None, max_memory: int | None, report: Report) -> None:
    """The tasks on Ray, never retried, each reserving ``max_memory`` bytes when given; a
    task whose worker crashed (or that Ray killed for memory) is reported as a Failure."""
    if not tasks:
        return
    with ray_session(workers, address) as ray:
        options: dict[str, Any] = {"max_retries": 0}
        if max_memory:
            options["memory"] = max_memory
        remote = ray.remote(**options)(run_row)
        data = ray.put(shared)
        hooks = hooks_from_env()
        refs = [remote.remote(fn, data, i, task, hooks) for i, task in tasks]
        index = {r: i for r, (i, _) in zip(refs, tasks, strict=True)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                report(index[ref], _ray_result(ray, ref))


def _ray_result(ray: Any, ref: Any) -> Any:
    """A task's result, or a Failure naming why Ray has none."""
    errors = ray.exceptions
    try:
        return ray.get(ref)
    except errors.RayTaskError as e:
        cause = getattr(e, "cause", None)
        return Failure(_one_line(cause if isinstance(cause, BaseException) else e))
    except errors.RayError as e:   # WorkerCrashedError, OutOfMemoryError, ...
        return Failure(f"worker died: {type(e).__name__} (out of memory?)")


# -- choosing -----------------------------------------------------------------------------------------
def check_executor(executor: str, workers: int | None, address: str | None,
                   max_memory: int | None) -> None:
    """The executor's settings, checked before any row runs (a missing Dask or Ray too)."""
    import importlib.util

    if executor not in EXECUTORS:
        raise OptionError("executor", f"unknown executor {executor!r}: expected one of "
                                      f"{', '.join(EXECUTORS)}")
    if address and executor == "local":
        raise OptionError("address", "a scheduler address needs the dask or ray executor")
    if workers is not None and workers < 1:
        raise OptionError("workers", f"workers must be >= 1, got {workers}")
    check_memory_budget(max_memory)
    if executor == "dask" and importlib.util.find_spec("distributed") is None:
        raise OptionError("executor", "the dask executor needs dask.distributed "
                                      "(pip install 'dask[distributed]')")
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        raise OptionError("executor", "the ray executor needs ray (pip install ray)")


def run_rows(executor: str, fn: Callable[[Any, Any], Any], shared: Any, tasks: Sequence[Task], *,
             workers: int | None, address: str | None, max_memory: int | None, report: Report,
             preload: Sequence[str] = ()) -> None:
    """``fn(shared, task)`` for every (index, task) on ``executor``, ``report(index, result
    or Failure)`` as each finishes. Locally: ``workers`` processes (default: one per CPU),
    each within ``max_memory`` (default: the machine's memory shared among them)."""
    if not tasks:
        return
    if executor == "local":
        n = max(1, min(workers or os.cpu_count() or 1, len(tasks)))
        budget = max_memory if max_memory is not None else default_memory_budget(n)
        run_local(fn, shared, tasks, workers=n, max_memory=budget, report=report, preload=preload)
    elif executor == "dask":
        run_dask(fn, shared, tasks, workers=workers, address=address, max_memory=max_memory, report=report)
    else:
        run_ray(fn, shared, tasks, workers=workers, address=address, max_memory=max_memory, report=report)


__all__ = ["EXECUTORS", "Failure", "check_executor", "dask_client", "default_memory_budget",
           "format_size", "limit_memory", "memory_message", "ray_session", "run_local", "run_rows",
           "run_row"]
