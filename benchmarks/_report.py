"""What every benchmark script does when run from the command line."""

import sys
import traceback
from collections.abc import Callable


def run_reporting_errors(main: Callable[[], object]) -> None:
    """Run ``main``, print any error, and exit with status 0: a benchmark reports, it never fails its caller."""
    try:
        main()
    except Exception:  # pylint: disable=broad-exception-caught
        traceback.print_exc()
    sys.exit(0)
