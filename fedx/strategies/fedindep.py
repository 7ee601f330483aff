"""FedIndep: K independently trained models, shuffled among nodes."""

from fedx.strategies.fedmr import FedMR


class FedIndep(FedMR):
    """K models trained independently: FedMR-p1.0, the paper's extreme ablation.

    Every round the whole trained models are shuffled among the slots and no
    model is ever aggregated with another; only the reported global model is
    the mean of the K trained models. It separates the effect of
    recombination from that of dispatching a different model to each node.

    Parameters
    ----------
    **kwargs
        As for :class:`~fedx.strategies.MultiModelStrategy`.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(first_stage_rounds=0, segment_fraction=1.0, **kwargs)
