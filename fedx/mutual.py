"""FedMe's client side: deep mutual learning of two models and the choice between them.

Matsuda et al., "FedMe: Federated Learning via Model Exchange", SDM 2022,
Sec. 4.2 (eqs. 3-7). Deep mutual learning: Zhang et al., CVPR 2018.
"""

import torch
import torch.nn.functional as F
from torch import nn

from fedx.training import SGD, Batches, get_device


def mutual_losses(
    personalized_logits: torch.Tensor,
    exchanged_logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    mutual_learning: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two models' losses on one batch (eqs. 3 and 4, as means over the batch).

    ``loss_p = CE(p_p, y) + KL(p_ex || p_p)`` and
    ``loss_ex = CE(p_ex, y) + KL(p_p || p_ex)``, where ``p`` are softmax
    probabilities. In each KL term the *other* model's probabilities are
    constants (detached), so ``loss_p`` only moves the personalized model and
    ``loss_ex`` only the exchanged one, and their sum can be backpropagated
    once.

    Parameters
    ----------
    personalized_logits, exchanged_logits : torch.Tensor
        ``(N, M)`` logits of the two models on the same batch.
    labels : torch.Tensor
        ``(N,)`` integer labels.
    mutual_learning : bool, optional
        False drops the KL terms (the ablation without deep mutual learning):
        each model is trained on cross-entropy alone.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``(loss_p, loss_ex)``, scalar tensors: the per-sample means of the
        paper's sums over the data.
    """
    loss_p = F.cross_entropy(personalized_logits, labels)
    loss_ex = F.cross_entropy(exchanged_logits, labels)
    if not mutual_learning:
        return loss_p, loss_ex
    log_p = F.log_softmax(personalized_logits, dim=1)
    log_ex = F.log_softmax(exchanged_logits, dim=1)
    # kl_div(input, target) = sum target * (log target - input) = KL(target || input).
    kl_ex_to_p = F.kl_div(log_p, log_ex.detach(), reduction="batchmean", log_target=True)
    kl_p_to_ex = F.kl_div(log_ex, log_p.detach(), reduction="batchmean", log_target=True)
    return loss_p + kl_ex_to_p, loss_ex + kl_p_to_ex


# pylint: disable=too-many-arguments,too-many-locals
def train_mutual(
    personalized: nn.Module,
    exchanged: nn.Module,
    loader: Batches,
    *,
    epochs: int,
    learning_rate: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    mutual_learning: bool = True,
    device: torch.device | None = None,
) -> tuple[float, float]:
    """Train a personalized and an exchanged model together, in place (eqs. 5 and 6).

    Every batch goes through both models; each is updated by its own SGD
    optimizer on its loss from :func:`mutual_losses` (the paper: momentum 0.9,
    weight decay 1e-4).

    Parameters
    ----------
    personalized, exchanged : nn.Module
        The two models, of any architectures with the same number of
        outputs. They are moved to ``device`` and left there in training mode.
    loader : iterable of (torch.Tensor, torch.Tensor)
        Yields ``(inputs, labels)`` batches of the client's training split.
    epochs : int
        Passes over ``loader``; 0 leaves both models unchanged.
    learning_rate, momentum, weight_decay : float
        SGD settings of both optimizers.
    mutual_learning : bool, optional
        False trains each model on cross-entropy alone (ablation).
    device : torch.device, optional
        Where to train; :func:`fedx.training.get_device` by default.

    Returns
    -------
    tuple[float, float]
        Mean cross-entropy per sample of the personalized and the exchanged
        model over the last epoch (without the KL terms, so it compares with
        other methods' training loss); ``(0.0, 0.0)`` when no batch was seen.
    """
    if epochs < 0:
        raise ValueError(f"epochs={epochs!r} must be >= 0")
    device = device or get_device()
    optimizers = []
    for model in (personalized, exchanged):
        model.to(device)
        model.train()
        optimizers.append(
            SGD(model.parameters(), lr=learning_rate, momentum=momentum, weight_decay=weight_decay)
        )
    sums, num_samples = torch.zeros(2, dtype=torch.float64, device=device), 0
    for _ in range(epochs):
        # Only the last epoch's losses are reported. The sums stay on the
        # device: reading them every batch would make the host wait for a GPU.
        sums, num_samples = torch.zeros(2, dtype=torch.float64, device=device), 0
        for inputs, labels in loader:
            inputs = inputs.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            for optimizer in optimizers:
                optimizer.zero_grad()
            logits = (personalized(inputs), exchanged(inputs))
            losses = mutual_losses(*logits, labels, mutual_learning=mutual_learning)
            # The KL targets are detached, so one backward pass gives each
            # model exactly the gradient of its own loss.
            (losses[0] + losses[1]).backward()
            for optimizer in optimizers:
                optimizer.step()
            for k, model_logits in enumerate(logits):
                sums[k] += F.cross_entropy(model_logits.detach(), labels, reduction="sum").double()
            num_samples += len(labels)
    if not num_samples:
        return 0.0, 0.0
    personalized_sum, exchanged_sum = sums.tolist()
    return personalized_sum / num_samples, exchanged_sum / num_samples


def prefers_exchanged(personalized_loss: float, exchanged_loss: float) -> bool:
    """FedMe's model tuning (eq. 7): adopt the exchanged model if its loss is lower.

    Parameters
    ----------
    personalized_loss, exchanged_loss : float
        Each trained model's loss on the client's validation split.

    Returns
    -------
    bool
        True only when the exchanged model's loss is strictly lower; on a tie
        the client keeps its personalized model (eq. 7 keeps ``i`` whenever
        the personalized model is among the minimizers).
    """
    return exchanged_loss < personalized_loss
