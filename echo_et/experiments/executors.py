"""Dask and Ray sessions for the sweeps: one place that imports them (optional), starts a
local cluster or joins one at an address, and shuts down what it started."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from echo_et.errors import OptionError


@contextlib.contextmanager
def dask_client(workers: int | None, address: str | None) -> Iterator[tuple[Any, Any]]:
    """(client, dask.distributed.as_completed): a client of the cluster at ``address``, or
    of a local one of ``workers`` single-threaded workers (processes when more than one)."""
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise OptionError("executor", "the dask executor needs dask.distributed "
                                      "(pip install 'dask[distributed]')") from None
    cluster = None
    if address:
        client = Client(address)
    else:
        cluster = LocalCluster(n_workers=max(1, workers or 1), threads_per_worker=1,
                               processes=bool(workers and workers > 1), dashboard_address=None)
        client = Client(cluster)
    try:
        yield client, as_completed
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


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


__all__ = ["dask_client", "ray_session"]
