"""``fedx-superlink``: Flower's SuperLink whose HTTP middleware runs only on the requests it acts on.

``fedx-superlink [flower-superlink options]`` runs ``flower-superlink``
with the same options and the same APIs, routes, checks and answers; only
seven of the nine middleware layers Flower 1.41 wraps around every request
(six of Flower 1.42's eight, which has dropped the tracing layer) are
skipped on the requests they do nothing for (the Control API's on Fleet and
Runtime requests, SuperNode authentication on everything but the Fleet API,
event logs, and on 1.41 tracing, unless turned on). Over slow links a request cost the
SuperLink about half the CPU time it costs Flower's (``benchmarks/links.py``);
:mod:`fedx.flower.superlink_middleware` says how, why, and what happens under
another Flower (all of it, through :func:`fedx.flower.install`: where Flower's
code is not the code checked, the SuperLink runs as shipped, with one warning).
"""

import sys
from collections.abc import Sequence

from fedx import flower
from fedx.flower.superlink_middleware import run_flower_superlink


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``fedx-superlink``."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not {"-h", "--help"} & set(arguments):
        flower.install("fedx-superlink", {"superlink_middleware": {}})
    run_flower_superlink(arguments)


if __name__ == "__main__":
    main()
