"""Local training and evaluation of torch models on a client or the server."""

from collections.abc import Iterable

import torch
from torch import nn
from torch.optim.sgd import sgd
from torch.utils.data import DataLoader


def get_device() -> torch.device:
    """Return ``cuda`` when a GPU is visible to this process, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


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
    loader: DataLoader,
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
    loader : DataLoader
        Yields ``(inputs, labels)`` batches with integer labels. Inputs keep
        their dtype (float images, int64 token ids for an embedding).
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

    loss_sum, num_samples = 0.0, 0
    for _ in range(epochs):
        # Only the last epoch's loss is reported.
        loss_sum, num_samples = 0.0, 0
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
            loss_sum += data_loss.item() * len(labels)
            num_samples += len(labels)
    return loss_sum / num_samples if num_samples else 0.0


def evaluate(
    model: nn.Module, loader: DataLoader, device: torch.device | None = None
) -> tuple[float, float]:
    """Compute a classifier's mean cross-entropy and accuracy.

    Parameters
    ----------
    model : nn.Module
        The model; it is moved to ``device`` and put in evaluation mode.
    loader : DataLoader
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
    loss_sum, correct, num_samples = 0.0, 0, 0
    with torch.no_grad():
        for inputs, labels in loader:
            inputs = inputs.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            logits = model(inputs)
            loss_sum += criterion(logits, labels).item()
            correct += (logits.argmax(dim=1) == labels).sum().item()
            num_samples += len(labels)
    if num_samples == 0:
        return 0.0, 0.0
    return loss_sum / num_samples, correct / num_samples


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
            batches.append(torch.softmax(model(batch), dim=1).float().cpu())
    if not batches:
        return torch.empty(0, 0)
    return torch.cat(batches)
