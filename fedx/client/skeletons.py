"""Model skeletons a ClientApp process reuses from one message to the next.

Every training or evaluation message carries a model's weights, and the
ClientApp needs a torch module of the right architecture to load them into.
Building one costs more than loading the weights, every time, and the
more so the larger the model (ResNet-20, VGG-16); and a simulation worker
answers many messages for the same architecture. So a process keeps the
modules its calls built and lends them out again:

* **Nothing carries over.** A borrowed module gets the message's weights
  with a strict ``load_state_dict`` (every parameter and buffer: BatchNorm's
  running statistics come from the received arrays too), its gradients are
  dropped, it is put back in training mode with every parameter as
  trainable as when it was built.
  A module whose state dict does not cover all its parameters and buffers
  is never kept: it could carry something over. Optimizer state lives in
  each call's optimizer.
* **Randomness is the call's.** A module is built with torch's global
  generator forked (:func:`torch.random.fork_rng`), so building draws
  nothing from the generator the call has seeded: a call gives the same
  reply whether its module was built for it or reused.
* **One call at a time.** A module lent to a call is not in the cache until
  the call gives it back (:meth:`ModelCache.give_back`): a call that needs two
  models of one architecture (mutual learning of two models) gets two modules.
* **Bounded.** At most ``max_models`` idle modules (default 4), at most one
  per (architecture, input shape, classes); the least recently used goes
  first. Runs with heterogeneous architectures use up to four (``cnn-1``
  ... ``cnn-4``, or the four VGGs); the others use one. Four VGG-16
  for 32x32 images hold about 240 MB; gradients are dropped when a module is
  given back, so an idle module holds its weights only.

Where it pays: in Flower's simulation, where a Ray actor answers message
after message. A deployed ClientApp process answers one message and exits,
and the warm executor's children are forked from an interpreter that never
answers messages (:mod:`fedx.deploy.warm_executor`): there every call builds its
module, as before.
"""

import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable

import torch
from torch import nn

from fedx.models import build_model

#: Idle modules a process keeps by default.
DEFAULT_MAX_MODELS = 4

_Key = tuple[Hashable, ...]


def _covers_whole_state(model: nn.Module) -> bool:
    """Whether ``load_state_dict`` sets every parameter and buffer of ``model``."""
    names = {name for name, _ in model.named_parameters()}
    names |= {name for name, _ in model.named_buffers()}
    return names <= set(model.state_dict())


def _reset(model: nn.Module, trainable: tuple[bool, ...]) -> None:
    """Make ``model`` what it was when built, but for its weights: training mode, no gradients."""
    model.train()
    for parameter, requires_grad in zip(model.parameters(), trainable, strict=True):
        parameter.grad = None
        parameter.requires_grad_(requires_grad)


class ModelCache:
    """Idle model skeletons of one process, by architecture (see the module's notes).

    Parameters
    ----------
    max_models : int
        Idle modules kept at most; 0 keeps none (every call builds).
    """

    def __init__(self, max_models: int = DEFAULT_MAX_MODELS) -> None:
        if max_models < 0:
            raise ValueError(f"max_models={max_models!r} must be >= 0")
        self.max_models = max_models
        self._idle: OrderedDict[_Key, nn.Module] = OrderedDict()
        # Which parameters each module built here had trainable when it was built.
        self._trainable: weakref.WeakKeyDictionary[nn.Module, tuple[bool, ...]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        #: Modules built and modules reused since the process started.
        self.built = 0
        self.reused = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._idle)

    @staticmethod
    def key(architecture: str, input_shape: tuple[int, ...], num_classes: int) -> _Key:
        """What decides a skeleton: its architecture, input shape and number of classes."""
        return (architecture, tuple(int(side) for side in input_shape), int(num_classes))

    def borrow(
        self, architecture: str, input_shape: tuple[int, ...], num_classes: int
    ) -> nn.Module:
        """A module of this architecture, idle or new, to load weights into.

        Its weights are whatever it held: the caller loads its own with a
        strict ``load_state_dict`` before using it.
        """
        key = self.key(architecture, input_shape, num_classes)
        with self._lock:
            model = self._idle.pop(key, None)
            if model is not None:
                self.reused += 1
        if model is None:
            with torch.random.fork_rng(devices=[]):
                model = build_model(architecture, input_shape, num_classes)
            with self._lock:
                self.built += 1
                self._trainable[model] = tuple(p.requires_grad for p in model.parameters())
        _reset(model, self._trainable[model])
        return model

    def give_back(
        self,
        model: nn.Module,
        architecture: str,
        input_shape: tuple[int, ...],
        num_classes: int,
    ) -> None:
        """Keep ``model`` for a later call (unless it could carry state over, or there is no room).

        ``model`` must come from :meth:`borrow` with these arguments.
        """
        if self.max_models == 0 or model not in self._trainable or not _covers_whole_state(model):
            return
        for parameter in model.parameters():
            parameter.grad = None  # an idle module holds its weights only
        key = self.key(architecture, input_shape, num_classes)
        with self._lock:
            self._idle.pop(key, None)  # one idle module per key: the newer one stays
            self._idle[key] = model
            while len(self._idle) > self.max_models:
                self._idle.popitem(last=False)

    def clear(self) -> None:
        """Drop every idle module."""
        with self._lock:
            self._idle.clear()


#: The process's cache, which :class:`fedx.client.task.ClientTask` borrows from.
SKELETONS = ModelCache()
