"""How many cores a SuperNode's ClientApps may use, and how many torch threads each gets.

torch (OpenMP, MKL) starts one thread per core it sees for every process.
Several SuperNodes on one machine (``fedx-deploy up``, a test rig, compose on
a laptop) then run their ClientApps, and the ServerApp, each with every
core's threads on the same cores, and the threads wait on each other:
the README's fast setup (3 SuperNodes, digits) takes several times as long
a round that way as with its share of the cores (docs/results.md, "What
each part of the fast setup gives"). Flower's simulation avoids it with
``client-resources-num-cpus``; a real deployment needs the count in each
ClientApp process. The ServerApp keeps every core
(:func:`serverapp_threads`): it aggregates and evaluates while the
ClientApps wait for their next message.

The count, for one SuperNode's ClientApps, first that is given:

1. an option (``fedx-deploy up --clientapp-threads``, ``fedx-superexec
   --clientapp-threads``);
2. ``FEDX_CLIENTAPP_THREADS`` in the environment;
3. the SuperNode's share of this machine's cores: the usable cores divided
   by the SuperNodes that share them (``FEDX_SUPERNODES_PER_MACHINE``, which
   ``fedx-deploy`` and the compose file set; 1, a SuperNode alone on its
   machine, by default), at least 1.

"Usable cores" are those this process may run on (``os.sched_getaffinity``:
``taskset``, a container's cpuset) and no more than its CPU quota allows
(cgroup ``cpu.max``, what ``docker run --cpus`` or compose's ``cpus:`` set,
rounded up); a container without either sees all the host's cores. torch's
own default counts the host's cores whatever the quota.

The count reaches a ClientApp two ways, because a thread count only holds
where torch reads it: ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` (with
``OPENBLAS_NUM_THREADS`` for numpy), which torch and the BLAS libraries read
once, when they are loaded, in every process started with them
(:func:`thread_environment`: Flower's ``flwr-clientapp`` processes, the warm
executor's warm interpreter); and ``torch.set_num_threads`` in every task the
warm executor forks, since a fork keeps the thread count of the interpreter it
was forked from, whatever its own environment says. (torch takes no more
threads from the variables than the machine has cores.)

The same share bounds how many ClientApps the warm executor runs at once:
``max_tasks`` is the share divided by the threads of each (at least 1), or
``FEDX_CLIENTAPP_MAX_TASKS``.
"""

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: Torch threads of each ClientApp (overrides the share of the cores).
THREADS_VARIABLE = "FEDX_CLIENTAPP_THREADS"
#: How many SuperNodes share this machine's cores (default 1).
SUPERNODES_VARIABLE = "FEDX_SUPERNODES_PER_MACHINE"
#: How many ClientApps one SuperNode's warm executor runs at once (default: cores / threads).
MAX_TASKS_VARIABLE = "FEDX_CLIENTAPP_MAX_TASKS"
#: Torch threads of the ServerApp (``fedx-deploy``; default: every usable core).
SERVERAPP_THREADS_VARIABLE = "FEDX_SERVERAPP_THREADS"
#: What torch (OpenMP, MKL) and numpy's BLAS read when they are loaded.
LIBRARY_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")):
    """The CPUs this process's cgroup quota allows (cgroup v2 ``cpu.max``, v1 CFS quota), or None.

    The tightest limit from this process's cgroup up to the root counts.
    """
    limits = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: "0::/path"
            folder = root / path.lstrip("/")
            while True:
                limits.append(_quota(folder / "cpu.max", None))
                if folder == root or root not in folder.parents:
                    break
                folder = folder.parent
        elif "cpu" in controllers.split(","):  # v1, as mounted in a container
            for folder in (root / "cpu", root / "cpu,cpuacct"):
                limits.append(_quota(folder / "cpu.cfs_quota_us", folder / "cpu.cfs_period_us"))
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def _quota(quota_file: Path, period_file: Path | None) -> float | None:
    """CPUs from ``cpu.max`` (``"quota period"`` or ``"max period"``) or v1's two files."""
    try:
        if period_file is None:
            quota, period = quota_file.read_text().split()[:2]
        else:
            quota, period = quota_file.read_text().strip(), period_file.read_text().strip()
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by its cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, max(1, math.ceil(limit)))
    return max(1, cores)


def _positive(name: str, value: object) -> int | None:
    """``value`` as a count of at least 1; None for None or an empty string."""
    if value is None or value == "":
        return None
    try:
        count = int(str(value))
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
    return count


@dataclass(frozen=True)
class ClientAppCores:
    """What one SuperNode's ClientApps get: their cores, threads each, and how many at once.

    Attributes
    ----------
    cores : int
        The cores of this machine the SuperNode's ClientApps may use (its share).
    threads : int
        Torch threads of each ClientApp.
    max_tasks : int
        ClientApps that the warm executor runs at once (more wait their turn).
    """

    cores: int
    threads: int
    max_tasks: int

    @classmethod
    def resolve(
        cls,
        threads: int | None = None,
        max_tasks: int | None = None,
        supernodes: int | None = None,
        environ: Mapping[str, str] | None = None,
        cores: int | None = None,
    ) -> "ClientAppCores":
        """The share, from the options given, else the environment, else the machine.

        Precedence, for each: the argument, then its environment variable
        (``FEDX_CLIENTAPP_THREADS``, ``FEDX_CLIENTAPP_MAX_TASKS``,
        ``FEDX_SUPERNODES_PER_MACHINE``), then the default: the share of the
        :func:`usable_cores` (``cores``) is ``cores // supernodes`` (at least
        1; one SuperNode by default), each ClientApp gets the whole share,
        and ``share // threads`` ClientApps run at once (at least 1).

        Raises
        ------
        ValueError
            When a count given or read is not a whole number of at least 1.
        """
        environ = os.environ if environ is None else environ
        nodes = _positive("supernodes", supernodes) or _positive(
            SUPERNODES_VARIABLE, environ.get(SUPERNODES_VARIABLE)
        )
        share = max(1, (usable_cores() if cores is None else cores) // (nodes or 1))
        per_task = (
            _positive("clientapp threads", threads)
            or _positive(THREADS_VARIABLE, environ.get(THREADS_VARIABLE))
            or share
        )
        at_once = (
            _positive("max tasks", max_tasks)
            or _positive(MAX_TASKS_VARIABLE, environ.get(MAX_TASKS_VARIABLE))
            or max(1, share // per_task)
        )
        return cls(cores=share, threads=per_task, max_tasks=at_once)


def serverapp_threads(threads: int | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Torch threads of the ServerApp: ``threads``, else ``FEDX_SERVERAPP_THREADS``, else every
    usable core (it aggregates and evaluates while the ClientApps wait for their next message).
    """
    environ = os.environ if environ is None else environ
    return (
        _positive("serverapp threads", threads)
        or _positive(SERVERAPP_THREADS_VARIABLE, environ.get(SERVERAPP_THREADS_VARIABLE))
        or usable_cores()
    )


def thread_environment(threads: int) -> dict[str, str]:
    """The variables that make torch and numpy's BLAS in a new process use ``threads`` threads."""
    return dict.fromkeys(LIBRARY_THREAD_VARIABLES, str(threads))
