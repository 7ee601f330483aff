"""Models on the server: clients' first models, and models' outputs on an unlabeled set.

For strategies that keep one model per client and must run those models on
the server (numpy-only strategies, given the two callables of a
:class:`ServerModels`). Building a torch module is far slower than loading
weights into one, so one module per architecture is built once and reused
for every client's model.
"""

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from fedx.data import dataset_info, load_unlabeled
from fedx.models import build_model, build_seeded_model, client_model_seed
from fedx.ops import Model
from fedx.training import get_device, predict_probabilities

if TYPE_CHECKING:
    from fedx.config import RunConfig


def load_run_unlabeled(cfg: "RunConfig") -> Dataset:
    """The server's unlabeled set of a run (cached per process: loading it again costs nothing)."""
    return load_unlabeled(cfg.dataset, size=cfg.unlabeled_size, **cfg.data_settings())


def to_numpy_model(module: nn.Module) -> Model:
    """A module's state dict as ``{name: np.ndarray}`` (copies, in state-dict order)."""
    return {
        name: tensor.detach().cpu().numpy().copy() for name, tensor in module.state_dict().items()
    }


class ServerModels:
    """Builds clients' first models and computes models' softmax outputs on unlabeled data.

    Parameters
    ----------
    input_shape : tuple[int, ...]
        Shape of one input of the dataset (``(channels, height, width)`` of
        an image).
    num_classes : int
        Number of classes.
    unlabeled : callable
        Returns the server's unlabeled set (items ``(image, label)``, the
        labels are ignored). Called on the first :meth:`probabilities`, so
        building a strategy does not read data; the images are then stacked
        into one tensor once.
    seed : int
        Base seed of the initial models: client c's first model is the same
        in every run with the same seed.
    batch_size : int, optional
        Unlabeled images per forward pass.
    device : torch.device, optional
        Where to compute outputs; ``cuda`` when available by default
        (:meth:`for_run`: the run config's ``device``).
    """

    # pylint: disable=too-many-arguments
    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        unlabeled: Callable[[], Dataset],
        seed: int,
        *,
        batch_size: int = 500,
        device: torch.device | None = None,
    ) -> None:
        self.input_shape = input_shape
        self.num_classes = num_classes
        self.seed = seed
        self.batch_size = batch_size
        self.device = device or get_device()
        self._load_unlabeled = unlabeled
        self._modules: dict[str, nn.Module] = {}

    @classmethod
    def for_run(cls, cfg: "RunConfig") -> "ServerModels":
        """The run's models: its data set's shapes, its seed and its unlabeled set.

        The unlabeled set (``unlabeled-size`` samples of the training split
        that no client gets) is loaded on first use: :func:`load_run_unlabeled`.
        """
        info = dataset_info(cfg.dataset)
        return cls(
            info.input_shape,
            info.num_classes,
            lambda: load_run_unlabeled(cfg),
            cfg.seed,
            device=get_device(cfg.device),
        )

    @functools.cached_property
    def unlabeled(self) -> torch.Tensor:
        """The unlabeled inputs as one ``(U, *input_shape)`` tensor, loaded on first use."""
        dataset = self._load_unlabeled()
        return torch.stack([dataset[i][0] for i in range(len(dataset))])

    def module(self, architecture: str) -> nn.Module:
        """The one module of an architecture, built on first use."""
        if architecture not in self._modules:
            self._modules[architecture] = build_model(
                architecture, self.input_shape, self.num_classes
            ).to(self.device)
        return self._modules[architecture]

    def initial_model(self, architecture: str, client_id: int) -> Model:
        """Client ``client_id``'s first model (a strategy's ``initial_model_fn``)."""
        # It depends on (seed, client) only: the client builds the same model
        # when it chooses its architecture, and the global torch RNG is left alone.
        seed = client_model_seed(self.seed, client_id)
        return to_numpy_model(
            build_seeded_model(architecture, self.input_shape, self.num_classes, seed)
        )

    def probabilities(self, architecture: str, model: Model) -> np.ndarray:
        """Class probabilities ``(U, M)`` of a model on the unlabeled set (a strategy's ``predict_fn``)."""
        module = self.module(architecture)
        module.load_state_dict({name: torch.from_numpy(array) for name, array in model.items()})
        outputs = predict_probabilities(
            module, self.unlabeled, batch_size=self.batch_size, device=self.device
        )
        return outputs.numpy()


def server_model_functions(cfg: "RunConfig") -> dict[str, Callable[..., Any]]:
    """A run's ``initial_model_fn`` and ``predict_fn``: the ``components`` of a method that runs clients' models here."""
    models = ServerModels.for_run(cfg)
    return {"initial_model_fn": models.initial_model, "predict_fn": models.probabilities}
