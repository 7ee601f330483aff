"""Several clients' local training as one batched step: a client group.

:func:`fedx.training.train` trains one client's model; a simulation actor
that answers several clients of a round (:mod:`fedx.client.groups`) can
instead train them together with :func:`train_group`: their parameters,
BatchNorm buffers and momentum buffers stacked along a new first axis, the
gradient of every client at once (``torch.func.vmap`` of
``torch.func.grad_and_value`` over ``torch.func.functional_call``), and the
SGD update on the stacked tensors. On a GPU that is the arithmetic of ten
clients in the kernels of one, in one CUDA context. Each client's training
stays its own, and equals what :func:`~fedx.training.train` gives it alone
(within float rounding: 1e-6 on a CPU, ``tests/unit/test_group_training.py``):

* **its own batches and randomness**: each client iterates its own batches
  (its partition, its shuffling and augmentation), and every number they or
  its dropout draw comes from its own generator states
  (:class:`ClientRandom`: torch's default generators, swapped in around each
  draw), in the order :func:`~fedx.training.train` draws them alone;
* **its own number of steps** (ragged partitions): at each step the clients
  whose batches have the same shape take it together; a client whose steps
  are done takes no more, and nothing of it changes;
* **the same update**: cross-entropy (plus FedProx's proximal term), SGD with
  momentum and weight decay computed as ``torch.optim.SGD`` computes it, the
  first step's momentum the gradient itself; a parameter the forward pass
  does not use has no gradient in ``train()``, and SGD leaves it alone: so
  does the batched step (found once per input shape, on the meta device);
  BatchNorm's running statistics updated from the client's own batches, and
  every buffer stacked, a non-persistent one (not in the state dict the
  clients receive) from the model's own value.

Dropout draws its masks outside the batched step: before each step every
client draws, under its own generator, the masks its ``nn.Dropout`` layers
would draw in that forward pass alone, and the batched model multiplies by
them (:class:`_GivenMask`). A model with another source of randomness, or
one ``vmap`` cannot batch (an LSTM: torch has no batching rule for its
fused kernels), is refused by :func:`batching_obstacle`: its clients train
one by one.
"""

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedx.training import Batches

#: Modules that draw random numbers in training; only ``nn.Dropout`` is batched (its masks given).
_RANDOM_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.RReLU)


def batching_obstacle(model: nn.Module) -> str | None:
    """Why clients of ``model`` cannot train as one batched step; ``None`` when they can."""
    for name, module in model.named_modules():
        if isinstance(module, nn.RNNBase):
            return (
                f"{name} is a {type(module).__name__} (no vmap batching rule for its fused kernels)"
            )
        if isinstance(module, _RANDOM_MODULES) and type(module) is not nn.Dropout:
            return f"{name} is a {type(module).__name__} (randomness other than nn.Dropout)"
    return None


class ClientRandom:
    """One client's generator states: torch's default CPU generator and, on a GPU, the device's.

    :func:`fedx.training.train` alone draws shuffling, augmentation and
    dropout from torch's default generators, seeded for the client
    (``ClientTask.seed_torch``). Here each client keeps those states, taken
    right after its seeding (:meth:`capture`), and :meth:`active` puts them
    in place around each of its draws: it draws the numbers it would draw
    alone, in the same order.
    """

    def __init__(self, device: torch.device) -> None:
        self._generators = [torch.default_generator]
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self._generators.append(torch.cuda.default_generators[index])
        self._states = [generator.get_state() for generator in self._generators]

    @classmethod
    def capture(cls, device: torch.device) -> "ClientRandom":
        """The default generators' states now (call it right after seeding them for the client)."""
        return cls(device)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Draw from this client's states in the block; the outer states come back after it."""
        outer = [generator.get_state() for generator in self._generators]
        for generator, state in zip(self._generators, self._states, strict=True):
            generator.set_state(state)
        try:
            yield
        finally:
            self._states = [generator.get_state() for generator in self._generators]
            for generator, state in zip(self._generators, outer, strict=True):
                generator.set_state(state)


@dataclass
class GroupMember:
    """One client of a group: the model it received, its batches and its randomness.

    Attributes
    ----------
    weights : dict
        The received model's state dict (tensors or numpy arrays), names as
        the model's ``state_dict()``.
    batches : iterable of (torch.Tensor, torch.Tensor)
        Its own ``(inputs, labels)`` batches, as for :func:`fedx.training.train`;
        iterated once per epoch, each draw under ``random``.
    random : ClientRandom
        Its generator states, captured right after seeding them for it.
    """

    weights: dict[str, Any]
    batches: Batches
    random: ClientRandom


@dataclass
class MemberResult:
    """What :func:`train_group` gives one client: its trained state dict and ``train()``'s loss."""

    state: dict[str, torch.Tensor]
    train_loss: float
    steps: int = 0


class _GivenMask(nn.Module):
    """``nn.Dropout``'s stand-in in the batched model: multiplies by the mask it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.mask: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.mask is not None, "the group's step gives every dropout layer its mask"
        return x * self.mask


@dataclass
class _Dropout:
    """A dropout layer of the model: its probability, and its stand-in in the batched model."""

    p: float
    stand_in: _GivenMask


@dataclass
class _Stream:
    """One member's batches, epoch after epoch, and its running loss of the last epoch."""

    batches: Iterator[tuple[int, torch.Tensor, torch.Tensor]]
    random: ClientRandom
    loss_sum: torch.Tensor
    num_samples: int = 0
    steps: int = 0
    epoch: int = 0
    done: bool = False
    pending: list[Any] = field(default_factory=list)


def _epochs(batches: Batches, epochs: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """``(epoch, inputs, labels)``: ``batches`` iterated ``epochs`` times, as ``train()`` does."""
    for epoch in range(epochs):
        for inputs, labels in batches:
            yield epoch, inputs, labels


# pylint: disable-next=too-many-locals,too-many-statements,too-many-branches
def train_group(
    model: nn.Module,
    members: Sequence[GroupMember],
    *,
    epochs: int,
    learning_rate: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    proximal_mu: float = 0.0,
    device: torch.device,
) -> list[MemberResult]:
    """Train each member's model as :func:`fedx.training.train` would, all as one batched step.

    Parameters
    ----------
    model : nn.Module
        A model of the members' architecture; only its structure is used
        (:func:`batching_obstacle` must find nothing in it).
    members : sequence of GroupMember
        The clients: their received weights, batches and generator states.
    epochs, learning_rate, momentum, weight_decay, proximal_mu : as for :func:`fedx.training.train`
        The same for every member.
    device : torch.device
        Where the members train (their batches are made or moved there).

    Returns
    -------
    list of MemberResult
        Per member, in order: its state dict (on ``device``, every parameter
        and buffer, in ``model.state_dict()``'s order) and its mean
        cross-entropy over its last epoch (0.0 when it took no step).
    """
    # pylint: disable=import-outside-toplevel  (torch.func: only where groups train)
    from torch.func import functional_call, grad_and_value, vmap

    if epochs < 0:
        raise ValueError(f"epochs={epochs!r} must be >= 0")
    if proximal_mu < 0:
        raise ValueError(f"proximal_mu={proximal_mu!r} must be >= 0")
    obstacle = batching_obstacle(model)
    if obstacle is not None:
        raise ValueError(f"these clients cannot train as one batched step: {obstacle}")
    base, dropouts = _batched_model(model)
    shapes: dict[tuple[int, ...], list[tuple[float, tuple[int, ...]]]] = {}

    def dropout_shapes(sample: tuple[int, ...]) -> list[tuple[float, tuple[int, ...]]]:
        """(p, input shape past the batch) of each dropout layer, in the forward pass's order."""
        if sample not in shapes:
            shapes[sample] = _dropout_shapes(base, dropouts, sample)
        return shapes[sample]

    state_names = list(model.state_dict())
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    # Every buffer the forward pass reads: a non-persistent one (not in the state dict, so
    # not in what the members received) is the model's own, the same for every member.
    own_buffers = {name: buffer.detach() for name, buffer in model.named_buffers()}
    constants = [name for name in state_names if name not in set(trainable)]
    constants += [name for name in own_buffers if name not in set(state_names)]

    def stacked(name: str) -> torch.Tensor:
        if name not in members[0].weights:
            return torch.stack([own_buffers[name]] * len(members)).to(device)
        return torch.stack([torch.as_tensor(m.weights[name]) for m in members]).to(device)

    params = {name: stacked(name) for name in trainable}
    # Dropout draws for tensors of the activations' dtype (bernoulli draws per dtype).
    dtype = next(iter(params.values())).dtype if params else torch.get_default_dtype()
    fixed = {name: stacked(name) for name in constants}
    start = {name: value.clone() for name, value in params.items()} if proximal_mu > 0 else {}
    velocity: dict[str, torch.Tensor] = {}
    unused: dict[tuple[int, ...], set[str]] = {}

    def unused_parameters(sample: tuple[int, ...]) -> set[str]:
        """The parameters a forward pass of ``sample``-shaped inputs does not use (their
        gradient is None in train(), whose SGD then leaves them alone); none with FedProx's
        term, which uses them all."""
        if sample not in unused:
            unused[sample] = (
                set()
                if proximal_mu > 0
                else _unused_parameters(base, dropouts, params, fixed, sample)
            )
        return unused[sample]

    def loss_of(p, b, s, inputs, labels, masks):
        for dropout, mask in zip(dropouts, masks, strict=True):
            dropout.stand_in.mask = mask
        data_loss = F.cross_entropy(functional_call(base, (p, b), (inputs,)), labels)
        loss = data_loss
        if s:
            distance = sum((p[name] - s[name]).pow(2).sum() for name in trainable)
            loss = loss + proximal_mu / 2 * distance
        return loss, data_loss

    step = vmap(grad_and_value(loss_of, has_aux=True))
    streams = [
        _Stream(
            _epochs(member.batches, epochs),
            member.random,
            torch.zeros((), dtype=torch.float64, device=device),
        )
        for member in members
    ]
    everyone = list(range(len(members)))
    while True:
        # Every client still training draws its next batch and its dropout masks, in
        # the order train() draws them alone: the batch first, then the forward pass's.
        taking: dict[tuple, list[int]] = {}
        for index, stream in enumerate(streams):
            if stream.done:
                continue
            with stream.random.active():
                item = next(stream.batches, None)
                if item is None:
                    stream.done = True
                    continue
                epoch, inputs, labels = item
                inputs = inputs.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                masks = [
                    F.dropout(
                        torch.ones((len(labels), *shape), dtype=dtype, device=device), rate, True
                    )
                    for rate, shape in dropout_shapes(tuple(inputs.shape[1:]))
                ]
            if epoch != stream.epoch:  # train() reports the last epoch's loss only
                stream.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
                stream.num_samples, stream.epoch = 0, epoch
            stream.pending = [inputs, labels, masks]
            taking.setdefault((tuple(inputs.shape), tuple(labels.shape)), []).append(index)
        if not taking:
            break
        for rows in taking.values():
            # All clients: the stacked tensors themselves; some: copies of their rows, written back.
            index = None if rows == everyone else torch.tensor(rows, device=device)
            p, b, s = _rows(params, index), _rows(fixed, index), _rows(start, index)
            inputs = torch.stack([streams[i].pending[0] for i in rows])
            labels = torch.stack([streams[i].pending[1] for i in rows])
            masks = [
                torch.stack([streams[i].pending[2][k] for i in rows]) for k in range(len(dropouts))
            ]
            grads, (_, data_losses) = step(p, b, s, inputs, labels, masks)
            # The members of one step have taken equally many steps before it.
            first = streams[rows[0]].steps == 0
            v = {} if first else _rows(velocity, index)
            skipped = unused_parameters(tuple(inputs.shape[2:]))
            with torch.no_grad():
                for name in trainable:  # torch.optim.SGD's update (no dampening, no Nesterov)
                    if name in skipped:  # no gradient: SGD neither decays nor moves it
                        continue
                    grad = grads[name]
                    if weight_decay != 0:
                        grad = grad.add(p[name], alpha=weight_decay)
                    if momentum != 0:
                        if name not in v:  # its first gradient (SGD's buffer starts with it)
                            v[name] = grad.detach().clone()
                        else:
                            v[name].mul_(momentum).add_(grad)
                        grad = v[name]
                    p[name].add_(grad, alpha=-learning_rate)
                if index is None:
                    velocity.update(v)
                else:  # the rows were copies: write them back
                    for name, value in v.items():
                        velocity.setdefault(name, torch.zeros_like(params[name]))[index] = value
                    for name in trainable:
                        params[name][index] = p[name]
                    for name in constants:
                        fixed[name][index] = b[name]
            for position, member_index in enumerate(rows):
                stream = streams[member_index]
                stream.loss_sum += data_losses[position].detach().double() * len(stream.pending[1])
                stream.num_samples += len(stream.pending[1])
                stream.steps += 1
                stream.pending = []
    for dropout in dropouts:
        dropout.stand_in.mask = None
    results = []
    for position, stream in enumerate(streams):
        state = {
            name: (params[name] if name in params else fixed[name])[position].detach().clone()
            for name in state_names
        }
        loss = stream.loss_sum.item() / stream.num_samples if stream.num_samples else 0.0
        results.append(MemberResult(state, loss, stream.steps))
    return results


def _unused_parameters(
    base: nn.Module,
    dropouts: list[_Dropout],
    params: dict[str, torch.Tensor],
    fixed: dict[str, torch.Tensor],
    sample: tuple[int, ...],
) -> set[str]:
    """The parameters (of ``params``, stacked) whose gradient a forward pass of a
    ``sample``-shaped batch leaves None: found by autograd on the meta device (no arithmetic)."""
    from torch.func import functional_call  # pylint: disable=import-outside-toplevel

    def meta(values: dict[str, torch.Tensor], grad: bool) -> dict[str, torch.Tensor]:
        return {
            name: torch.zeros(value.shape[1:], dtype=value.dtype, device="meta", requires_grad=grad)
            for name, value in values.items()
        }

    p, b = meta(params, True), meta(fixed, False)
    if not p:
        return set()

    def given(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        module.mask = torch.ones(inputs[0].shape, device="meta")  # type: ignore[assignment]

    hooks = [d.stand_in.register_forward_pre_hook(given) for d in dropouts]
    try:
        dtype = next(iter(p.values())).dtype
        with torch.enable_grad():  # two examples: BatchNorm refuses one in training
            out = functional_call(
                base, (p, b), (torch.zeros((2, *sample), dtype=dtype, device="meta"),)
            )
            grads = torch.autograd.grad(out.sum(), list(p.values()), allow_unused=True)
    finally:
        for hook in hooks:
            hook.remove()
        for d in dropouts:
            d.stand_in.mask = None
    return {name for name, grad in zip(p, grads, strict=True) if grad is None}


def _rows(values: dict[str, torch.Tensor], index: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The stacked ``values`` themselves (``index`` None), or copies of the rows ``index`` names."""
    return values if index is None else {name: value[index] for name, value in values.items()}


def _batched_model(model: nn.Module) -> tuple[nn.Module, list[_Dropout]]:
    """A copy of ``model`` on the meta device, its ``nn.Dropout`` layers given masks instead."""
    base = copy.deepcopy(model).to("meta")
    base.train()
    dropouts: list[_Dropout] = []
    for name, module in list(base.named_modules()):
        if type(module) is nn.Dropout:  # pylint: disable=unidiomatic-typecheck  (not subclasses)
            stand_in = _GivenMask()
            dropouts.append(_Dropout(float(module.p), stand_in))
            parent, _, child = name.rpartition(".")
            setattr(base.get_submodule(parent) if parent else base, child, stand_in)
    return base, dropouts


def _dropout_shapes(
    base: nn.Module, dropouts: list[_Dropout], sample: tuple[int, ...]
) -> list[tuple[float, tuple[int, ...]]]:
    """``(p, input shape past the batch)`` of each dropout layer in the order a forward pass calls
    them, found by a pass of one ``sample``-shaped input on the meta device (no arithmetic);
    ``dropouts`` is put in that order."""
    if not dropouts:
        return []
    found: list[tuple[_Dropout, tuple[int, ...]]] = []
    by_module = {id(d.stand_in): d for d in dropouts}

    def record(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        found.append((by_module[id(module)], tuple(inputs[0].shape[1:])))
        module.mask = torch.ones(inputs[0].shape, device="meta")  # type: ignore[assignment]

    hooks = [d.stand_in.register_forward_pre_hook(record) for d in dropouts]
    try:
        with torch.no_grad():
            dtype = next(base.parameters()).dtype
            base(torch.zeros((1, *sample), dtype=dtype, device="meta"))
    finally:
        for hook in hooks:
            hook.remove()
        for d in dropouts:
            d.stand_in.mask = None
    if sorted(id(d) for d, _ in found) != sorted(map(id, dropouts)):
        raise ValueError("a dropout layer runs other than once per forward pass: not batched")
    dropouts[:] = [d for d, _ in found]  # the masks are drawn, and given, in this order
    return [(d.p, shape) for d, shape in found]
