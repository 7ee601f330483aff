"""Which client a node is: its share of the data, from its node config.

Kept apart from :mod:`fedx.client.task` (torch, the data) so that the
ClientApp answers the server's ``query`` without importing them.
"""

from flwr.app import Context


def node_partition(context: Context) -> tuple[int, int]:
    """``partition-id`` and ``num-partitions`` of the node's config.

    Raises
    ------
    RuntimeError
        When the SuperNode was started without them.
    """
    try:
        return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    except KeyError as err:
        raise RuntimeError(
            f"node config lacks {err}: start the SuperNode with "
            "--node-config 'partition-id=<i> num-partitions=<n>'"
        ) from None
