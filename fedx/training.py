"""Local training and evaluation of torch models on a client or the server.

Where they run is the run config's ``device`` (:func:`get_device`); with its
``deterministic`` key every kernel is one of torch's deterministic ones
(:func:`deterministic_kernels`), so that a seeded run on a GPU repeats bit
for bit. Training and evaluation read their running sums from the device
once per call, not once per batch: a GPU then queues batch after batch
without waiting for the host.
"""

import contextlib
import os
from collections.abc import Iterable, Iterator
from logging import INFO, WARNING, getLogger

import torch
from torch import nn
from torch.optim.sgd import sgd

#: What the run config's ``device`` key may say: ``auto`` (a GPU when this
#: process sees one), ``cpu``, or ``cuda`` (an error where no GPU is visible).
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
#: The cuBLAS setting deterministic kernels need (CUDA 10.2 and later): fixed
#: workspaces, so that a matrix product takes the same path every time.
CUBLAS_WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")

#: ``(inputs, labels)`` batches: a ``DataLoader``, or :class:`fedx.data.DeviceBatches`.
Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]

_LOG = getLogger("flwr")
_logged: set[str] = set()


def get_device(preference: str = "auto") -> torch.device:
    """The device the run config's ``device`` key names.

    Parameters
    ----------
    preference : {"auto", "cpu", "cuda"}
        ``auto``: ``cuda`` when a GPU is visible to this process, else
        ``cpu``. In Flower's simulation each ClientApp actor sees the GPU
        Ray gave it (``client-resources-num-gpus``).

    Raises
    ------
    ValueError
        For another name.
    RuntimeError
        For ``cuda`` where torch sees no GPU.
    """
    if preference not in DEVICES:
        raise ValueError(f"device={preference!r} is not one of {DEVICES}")
    if preference == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if preference == "cuda":
        raise RuntimeError(
            "device='cuda' but torch sees no GPU in this process "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}, torch "
            f"{torch.__version__} built for CUDA {torch.version.cuda}); in a simulation, give "
            "each client a GPU share (client-resources-num-gpus)"
        )
    return torch.device("cpu")


@contextlib.contextmanager
def deterministic_kernels(enabled: bool) -> Iterator[None]:
    """Run the block with torch's deterministic kernels, or as torch is set, when not ``enabled``.

    On: ``torch.use_deterministic_algorithms(True)`` (an operation that has
    no deterministic kernel raises instead of running), cuDNN's benchmark
    off (it times candidate algorithms and may pick another each run) and
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, which cuBLAS reads when this
    process first uses it: the variable is set here, before the block's
    first GPU work, unless it holds one of the deterministic values already.
    A process whose CUDA started before (it served a run without the
    setting) logs a warning: set the variable where the process starts
    (the simulation's or the SuperNode's environment). The first block of a
    process logs that it runs deterministic kernels. Settings go back to what
    they were when the block ends; the variable stays.

    On a CPU fedx's runs repeat bit for bit either way. On a GPU the
    deterministic kernels may be slower (``docs/gpu.md`` keeps the figures).
    """
    if not enabled:
        yield
        return
    if os.environ.get(CUBLAS_WORKSPACE_ENV) not in CUBLAS_DETERMINISTIC:
        if torch.cuda.is_initialized():
            _log_once(
                "cublas",
                WARNING,
                "fedx: deterministic=true, but CUDA started in this process (pid %d) before "
                "%s was set: matrix products may still differ from run to run; set "
                "%s=%s in the environment that starts the ClientApps and the ServerApp",
                os.getpid(),
                CUBLAS_WORKSPACE_ENV,
                CUBLAS_WORKSPACE_ENV,
                CUBLAS_DETERMINISTIC[0],
            )
        os.environ[CUBLAS_WORKSPACE_ENV] = CUBLAS_DETERMINISTIC[0]
    _log_once(
        "deterministic",
        INFO,
        "fedx: deterministic kernels in this process (pid %d): torch.use_deterministic_"
        "algorithms(True), cuDNN benchmark off, %s=%s",
        os.getpid(),
        CUBLAS_WORKSPACE_ENV,
        os.environ[CUBLAS_WORKSPACE_ENV],
    )
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
    )
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark = saved[2]


def _log_once(topic: str, level: int, message: str, *args: object) -> None:
    """Log ``message`` the first time this process meets ``topic``."""
    if topic not in _logged:
        _logged.add(topic)
        _LOG.log(level, message, *args)


class SGD:
    """Stochastic gradient descent with momentum: ``torch.optim.SGD``'s update, without its class.

    Creating any ``torch.optim.Optimizer`` imports ``torch._dynamo`` (the
    optimizer's methods are wrapped to stay out of compiled graphs), which
    costs about as much as importing torch itself. A deployed ClientApp
    process answers one message and exits, so it would pay that every round.
    This class keeps the momentum buffers and calls the function that
    ``torch.optim.SGD.step`` calls (``torch.optim.sgd.sgd``) with the same
    arguments (no dampening, no Nesterov, torch's choice of the single-,
    multi-tensor or fused kernel): the same update, bit for bit.

    Parameters
    ----------
    params : iterable of torch.Tensor
        The parameters to update; those without a gradient at a step are skipped.
    lr, momentum, weight_decay : float
        As for ``torch.optim.SGD``.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        *,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if value < 0.0:
                raise ValueError(f"{name}={value!r} must be >= 0")
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self._buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        """Drop the gradients (``set_to_none=True``, torch's default)."""
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Update every parameter that has a gradient."""
        positions = [i for i, param in enumerate(self.params) if param.grad is not None]
        params = [self.params[i] for i in positions]
        grads = [param.grad for param in params]
        buffers = [self._buffers[i] for i in positions] if self.momentum != 0 else []
        sgd(
            params,
            grads,  # type: ignore[arg-type]  (None was filtered out above)
            buffers,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            lr=self.lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
            has_sparse_grad=any(grad.is_sparse for grad in grads),  # type: ignore[union-attr]
        )
        if self.momentum != 0:  # sgd() filled in the buffers of the first step
            for i, buffer in zip(positions, buffers, strict=True):
                self._buffers[i] = buffer


def train(
    model: nn.Module,
    loader: Batches,
    *,
    epochs: int,
    learning_rate: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    proximal_mu: float = 0.0,
    device: torch.device | None = None,
) -> float:
    """Train a classifier in place with SGD on cross-entropy.

    Parameters
    ----------
    model : nn.Module
        The model; it is moved to ``device`` and left there, in training mode.
    loader : iterable of (torch.Tensor, torch.Tensor)
        Yields ``(inputs, labels)`` batches with integer labels (a
        ``DataLoader``, or :class:`fedx.data.DeviceBatches` already on the
        device). Inputs keep their dtype (float images, int64 token ids for
        an embedding).
    epochs : int
        Number of passes over ``loader``; 0 leaves the model unchanged.
    learning_rate, momentum, weight_decay : float
        SGD settings. The optimizer is created anew on every call, as a
        client receives a new model every round.
    proximal_mu : float, optional
        FedProx's proximal weight (Li et al., MLSys 2020). When positive, the
        loss of every batch gains ``mu / 2 * sum ||w - w_start||^2`` over the
        trainable parameters, ``w_start`` being their values at the start of
        this call, which keeps the local model close to the one received.
    device : torch.device, optional
        Where to train; :func:`get_device` by default.

    Returns
    -------
    float
        Mean cross-entropy per sample over the last epoch (without the
        proximal term, so it compares across methods). 0.0 when no batch was
        seen (``epochs == 0`` or an empty loader).
    """
    if epochs < 0:
        raise ValueError(f"epochs={epochs!r} must be >= 0")
    if proximal_mu < 0:
        raise ValueError(f"proximal_mu={proximal_mu!r} must be >= 0")
    device = device or get_device()
    model.to(device)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = SGD(trainable, lr=learning_rate, momentum=momentum, weight_decay=weight_decay)
    criterion = nn.CrossEntropyLoss()
    start = [p.detach().clone() for p in trainable] if proximal_mu > 0 else []

    loss_sum, num_samples = _zero(device), 0
    for _ in range(epochs):
        # Only the last epoch's loss is reported.
        loss_sum, num_samples = _zero(device), 0
        for inputs, labels in loader:
            inputs = inputs.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad()
            data_loss = criterion(model(inputs), labels)
            loss = data_loss
            if start:
                loss = loss + proximal_mu / 2 * _squared_distance(trainable, start)
            loss.backward()
            optimizer.step()
            # The sum stays on the device (float64, as Python's float was):
            # reading it every batch would make the host wait for the GPU.
            loss_sum += data_loss.detach().double() * len(labels)
            num_samples += len(labels)
    return loss_sum.item() / num_samples if num_samples else 0.0


def _zero(device: torch.device) -> torch.Tensor:
    """A float64 running sum on ``device``."""
    return torch.zeros((), dtype=torch.float64, device=device)


def evaluate(
    model: nn.Module, loader: Batches, device: torch.device | None = None
) -> tuple[float, float]:
    """Compute a classifier's mean cross-entropy and accuracy.

    Parameters
    ----------
    model : nn.Module
        The model; it is moved to ``device`` and put in evaluation mode.
    loader : iterable of (torch.Tensor, torch.Tensor)
        Yields ``(inputs, labels)`` batches with integer labels.
    device : torch.device, optional
        Where to evaluate; :func:`get_device` by default.

    Returns
    -------
    tuple[float, float]
        Mean cross-entropy per sample and the fraction of samples whose
        highest logit is the true label, in ``[0, 1]``. ``(0.0, 0.0)`` for an
        empty loader.
    """
    device = device or get_device()
    model.to(device)
    model.eval()
    criterion = nn.CrossEntropyLoss(reduction="sum")
    loss_sum, num_samples = _zero(device), 0
    correct = torch.zeros((), dtype=torch.int64, device=device)
    with torch.no_grad():
        for inputs, labels in loader:
            inputs = inputs.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            logits = model(inputs)
            loss_sum += criterion(logits, labels).double()
            correct += (logits.argmax(dim=1) == labels).sum()
            num_samples += len(labels)
    if num_samples == 0:
        return 0.0, 0.0
    return loss_sum.item() / num_samples, correct.item() / num_samples


def _squared_distance(params: list[torch.Tensor], reference: list[torch.Tensor]) -> torch.Tensor:
    """Sum of squared Euclidean distances between matching tensors."""
    return sum((p - r).pow(2).sum() for p, r in zip(params, reference, strict=True))


def predict_probabilities(
    model: nn.Module,
    inputs: torch.Tensor,
    *,
    batch_size: int = 256,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Softmax outputs of a classifier on a tensor of inputs, in batches.

    Parameters
    ----------
    model : nn.Module
        The classifier; it is moved to ``device`` and put in evaluation mode.
    inputs : torch.Tensor
        ``(N, *input_shape)`` inputs: float images or integer token ids.
    batch_size : int, optional
        Inputs per forward pass.
    device : torch.device, optional
        Where to compute; :func:`get_device` by default.

    Returns
    -------
    torch.Tensor
        ``(N, num_classes)`` float32 probabilities on the CPU.
    """
    device = device or get_device()
    model.to(device)
    model.eval()
    batches = []
    with torch.no_grad():
        for start in range(0, len(inputs), batch_size):
            batch = inputs[start : start + batch_size].to(device, non_blocking=True)
            batches.append(torch.softmax(model(batch), dim=1).float())
    if not batches:
        return torch.empty(0, 0)
    return torch.cat(batches).cpu()  # one copy to the host, after the last batch
