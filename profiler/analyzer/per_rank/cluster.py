"""Loading ranks on an existing Dask cluster (``diagtrain analyze RUN --scheduler ADDRESS``).

The per-rank work is the local pool's, :func:`pipeline.load_rank`, sent as one Dask task per rank: each
worker reads its rank's traces from storage it shares with this machine, writes the rank's tables to
the analysis cache next to the run, and sends back only the rank's summary. Dask is imported only
here and only when a scheduler is given: the analyzer runs without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from diagtrain.profiler.analyzer.per_rank.pool import Cluster

# A cluster just asked for (dask-jobqueue on Slurm, dask-kubernetes) may take a while to get its
# first worker; longer than this, the user is better told than left waiting.
WORKERS_WAIT_S = 60
INSTALL = "pip install 'diagtrain[dask]'"


class SchedulerError(Exception):
    """The Dask scheduler cannot be used; the message names its address and what to do."""


@contextmanager
def connect(address: str) -> Iterator[Cluster]:
    """A client of the scheduler at ``address`` whose workers have this diagtrain; closed on exit,
    which cancels its tasks that are still running (Ctrl-C)."""
    try:
        from distributed import Client, KilledWorker
    except ImportError as e:
        raise SchedulerError(f"--scheduler {address}: Dask is not installed here ({e}); {INSTALL}") from None
    _check_address(address)
    try:
        # How long to try is dask's own setting (distributed.comm.timeouts.connect), as for any client.
        client = Client(address, set_as_default=False)
    except (OSError, ValueError) as e:  # refused, no such host, timed out (an OSError)
        raise SchedulerError(f"cannot reach the Dask scheduler at {address}: {e}") from None
    try:
        _check_workers(client, address)
        yield Cluster(client.get_executor(pure=False), (KilledWorker,), f" on the Dask cluster at {address}")
    finally:
        client.close()


def _check_address(address: str) -> None:
    """Raise SchedulerError unless ``address`` is one Dask can dial (checked first: a client made for a
    malformed one hangs for a minute at exit)."""
    from distributed.comm.addressing import get_address_host_port

    try:
        get_address_host_port(address)
    except (ValueError, TypeError) as e:
        raise SchedulerError(f"--scheduler {address}: not a Dask scheduler address ({e}); "
                             "one looks like tcp://head-node:8786") from None


def _check_workers(client, address: str) -> None:
    """Raise SchedulerError unless the scheduler has workers that run this version of diagtrain."""
    try:
        client.wait_for_workers(1, timeout=WORKERS_WAIT_S)
    except TimeoutError:
        raise SchedulerError(f"the Dask scheduler at {address} has no workers (waited {WORKERS_WAIT_S} s); "
                             f"start some with: dask worker {address} --nthreads 1") from None
    from importlib import metadata  # noqa: PLC0415 - here: its import costs every analysis ~9 ms

    ours = metadata.version("diagtrain")
    workers = client.get_versions(packages=["diagtrain"])["workers"]
    wrong = {name: info["packages"].get("diagtrain") for name, info in workers.items()
             if info["packages"].get("diagtrain") != ours}
    if wrong:
        listed = ", ".join(f"{name} has {version or 'none'}" for name, version in sorted(wrong.items()))
        raise SchedulerError(f"the Dask workers at {address} need diagtrain {ours}, as here: {listed}; "
                             f"install it where the workers run ({INSTALL})")
