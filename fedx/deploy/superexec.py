"""``fedx-superexec``: Flower's SuperExec with a warm ClientApp executor.

In a real deployment Flower 1.41 runs every message a SuperNode receives in
a new ClientApp process (``flwr-clientapp``, started by the SuperExec's
``SubprocessExecutor``), and that process starts Python and imports the app
before it reads the message: for fedx's ClientApp, seconds of imports in
every message, ``import torch`` the largest part
(``benchmarks/clientapp_startups.py`` measures them). The warm executor pays that once per
SuperNode: it keeps one interpreter that has imported the ClientApp's module
(and with it torch and everything else the module imports) and forks it for
every task; the child runs Flower's own ``run_clientapp`` with the task's
token, which is all ``flwr-clientapp`` does (:class:`~fedx.deploy.warm_executor.WarmExecutor`).

Run it next to a SuperNode started with ``--isolation process``, with the
same options as ``flower-superexec`` (``--insecure`` or
``--root-certificates`` for the SuperNode's Runtime API,
``--superexec-auth-secret-file``, ``--parent-pid``, ...)::

    flower-supernode --insecure --superlink 127.0.0.1:8000 --isolation process --port 9094
    fedx-superexec --insecure --runtime-api-address 127.0.0.1:9094

and its own: ``--preload-app MODULE`` (default ``fedx.client_app``), the
ClientApp module to import in the warm interpreter, ``--preload MODULE``
(repeatable), more modules to import, ``--clientapp-threads``,
``--max-tasks``, ``--idle-after`` and ``--max-poll-interval``.
docs/deployment/warm-executor.md ("Inside the warm executor") says what
every task starts from, how the interpreter is kept fork-safe, how many
tasks run at once and why a task waiting for its input holds no slot.
Tasks other than ClientApps, and every task when runtime dependency
installation is on, go to Flower's ``SubprocessExecutor``.
"""

import argparse
import sys
from collections.abc import Sequence

from fedx import flower
from fedx.deploy.cores import (
    MAX_TASKS_VARIABLE,
    SUPERNODES_VARIABLE,
    THREADS_VARIABLE,
    ClientAppCores,
)
from fedx.deploy.warm_executor import DEFAULT_PRELOAD, DEFAULT_PRELOAD_APP, WarmExecutor
from fedx.flower import IDLE_AFTER, IdleBackoff
from fedx.flower.superexec_executor import (
    FLOWER_TASK_POLL_INTERVAL,
    ExecutorConfig,
    ExecutorType,
    TaskPollWaits,
    get_executor,
    run_flower_superexec,
    task_poll_interval,
)

# ----------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedx-superexec",
        add_help=False,
        description="flower-superexec with fedx's warm ClientApp executor; every other option "
        "is flower-superexec's (see flower-superexec --help).",
    )
    parser.add_argument(
        "--preload-app",
        default=DEFAULT_PRELOAD_APP,
        metavar="MODULE",
        help="the ClientApp module the warm interpreter imports "
        f"(default: {DEFAULT_PRELOAD_APP}; '' for none)",
    )
    parser.add_argument(
        "--preload",
        action="append",
        metavar="MODULE",
        help="a module the warm interpreter imports too (repeatable; "
        f"default: {', '.join(DEFAULT_PRELOAD)})",
    )
    parser.add_argument(
        "--clientapp-threads",
        type=int,
        metavar="N",
        help=f"torch threads of each ClientApp (default: ${THREADS_VARIABLE}, else this "
        f"machine's usable cores divided by ${SUPERNODES_VARIABLE}, 1 if unset)",
    )
    parser.add_argument(
        "--idle-after",
        type=float,
        default=IDLE_AFTER,
        metavar="SECONDS",
        help="how long after its last ClientApp task the SuperExec keeps asking for tasks "
        "every $FLWR_SUPEREXEC_TASK_POLL_INTERVAL seconds; then its waits grow up to "
        "--max-poll-interval (default: %(default)g; inf: never)",
    )
    parser.add_argument(
        "--max-poll-interval",
        type=float,
        default=FLOWER_TASK_POLL_INTERVAL,
        metavar="SECONDS",
        help="the longest wait between two task polls (default: Flower's %(default)g s)",
    )
    parser.add_argument(
        "--max-tasks",
        type=int,
        metavar="N",
        help=f"ClientApps running at once; more wait in the SuperNode (default: "
        f"${MAX_TASKS_VARIABLE}, else the cores divided by the threads of each, at least 1)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``fedx-superexec``: Flower's SuperExec, with the warm executor."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        _parser().print_help()
        print()
    ours, flower_args = _parser().parse_known_args(argv)
    preload = DEFAULT_PRELOAD if ours.preload is None else [m for m in ours.preload if m]
    try:  # the options, else the environment, else this machine's cores
        cores = ClientAppCores.resolve(threads=ours.clientapp_threads, max_tasks=ours.max_tasks)
        interval = task_poll_interval()
        # Between two task polls: the interval after a task, up to the ceiling once idle.
        waits = TaskPollWaits(
            IdleBackoff(interval, ours.idle_after, max(interval, ours.max_poll_interval))
        )
    except ValueError as err:
        raise SystemExit(f"fedx-superexec: {err}") from None

    def executor_factory(
        executor_type: ExecutorType,
        executor_config: ExecutorConfig | None = None,
        *,
        insecure: bool = False,
        root_certificates_path: str | None = None,
    ):
        if executor_type == ExecutorType.SUBPROCESS:  # flower-superexec's default
            warm = WarmExecutor(
                ours.preload_app or None,
                preload,
                object_pull_wait=interval,
                cores=cores,
            )
            waits.busy = lambda: warm.busy
            return warm
        return get_executor(
            executor_type,
            executor_config,
            insecure=insecure,
            root_certificates_path=root_certificates_path,
        )

    # Flower's SuperExec builds its executor with this factory, called once at
    # start: everything else (polling, TLS, authentication, plugins, signals)
    # stays Flower's own. Without it fedx-superexec has no purpose: on a Flower
    # whose code is not the code checked, it refuses to start.
    try:
        flower.install(
            "fedx-superexec",
            {"superexec_executor": {"factory": executor_factory, "waits": waits}},
            refuse=True,
        )
    except flower.FlowerCodeMismatch as err:
        raise SystemExit(f"fedx-superexec: {err}; use flower-superexec") from None
    run_flower_superexec(flower_args)


if __name__ == "__main__":
    main()
