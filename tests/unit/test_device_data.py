"""The data path that makes image batches where the model trains (fedx/data/device.py).

It must augment as torchvision does (the same crops, exactly; the same
distribution of offsets and flips), normalise as torchvision does (up to
float rounding), give each client its own partition's batches, and train a
model as the DataLoader path does. The tests run it on the CPU: the code is
the same on a GPU, only the tensors' device differs.
"""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from PIL import Image
from scipy import stats
from torch.utils.data import DataLoader, Subset
from torchvision.datasets import CIFAR10

from fedx.client.task import ClientTask
from fedx.data import (
    DeviceBatches,
    DeviceImages,
    ImageTransform,
    batch_loader,
    device_batches,
    load_partition,
    load_split,
)
from fedx.data import device as device_module
from fedx.models import build_model
from fedx.training import train
from tests.support.helpers import DEFAULTS
from tests.support.torch_helpers import CPU, expect_generated_checksums

from fedx_bench import fake_cifar as fake

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
AUGMENTED = ImageTransform(MEAN, STD, crop_padding=4, flip=True)
PLAIN = ImageTransform(MEAN, STD)


@pytest.fixture
def fake_cifar(tmp_path, monkeypatch):
    """A CIFAR-10-shaped set of 500 + 100 learnable images in torchvision's files."""
    fake.write(tmp_path, "cifar10", train=500, test=100)
    expect_generated_checksums(monkeypatch, CIFAR10, tmp_path / "cifar-10-batches-py")
    return tmp_path


def random_pixels(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)


def as_pixels(inputs: torch.Tensor) -> np.ndarray:
    """Normalised float inputs back to uint8 ``(N, C, H, W)`` pixels."""
    mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
    return torch.round((inputs * std + mean) * 255).to(torch.uint8).numpy()


def test_a_crop_is_the_zero_padded_image_sliced_and_flipped_when_drawn():
    pixels = random_pixels(64)
    images = DeviceImages(pixels, np.zeros(64), AUGMENTED, CPU)
    generator = torch.Generator().manual_seed(3)
    top, left = torch.randint(0, 9, (2, 64), generator=generator)
    flipped = torch.rand(64, generator=generator) < 0.5
    crops = images.crops(torch.arange(64), top, left, flipped).numpy()
    padded = np.pad(pixels, ((0, 0), (4, 4), (4, 4), (0, 0)))  # RandomCrop pads with zeros
    for i in range(64):
        expected = padded[i, top[i] : top[i] + 32, left[i] : left[i] + 32].transpose(2, 0, 1)
        if flipped[i]:
            expected = expected[:, :, ::-1]
        np.testing.assert_array_equal(crops[i], expected)
    # Without offsets the crop is the image itself.
    np.testing.assert_array_equal(
        images.crops(torch.arange(64)).numpy(), pixels.transpose(0, 3, 1, 2)
    )


def test_normalisation_is_torchvisions_up_to_float_rounding():
    pixels = random_pixels(32, seed=1)
    images = DeviceImages(pixels, np.zeros(32), PLAIN, CPU)
    ours = images.normalised(images.crops(torch.arange(32)))
    reference = PLAIN.torchvision(32)
    theirs = torch.stack([reference(Image.fromarray(image)) for image in pixels])
    # ((x / 255) - mean) / std against one multiply-add: a few float32 ulps
    # of values within +-2.1 (2.4e-7 each); a wrong channel or scale is off by > 1e-3.
    torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-6)


def _offset(coordinates: np.ndarray) -> np.ndarray:
    """A crop's offset along one axis, from the image coordinates + 1 it holds (0: padding).

    The crop at offset o of the image padded by 4 holds coordinates o-4 ..
    o+27 where they are in the image (0 .. 31): the smallest is o-4 when o >= 4,
    else the largest is o+27.
    """
    smallest = np.where(coordinates > 0, coordinates, 99).min(axis=(1, 2)) - 1
    largest = coordinates.max(axis=(1, 2)) - 1
    return np.where(smallest > 0, smallest + 4, largest - 27)


def _draws(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each crop's (top, left) offsets and flip, read off images that encode their coordinates.

    Channel 0 holds a pixel's row + 1, channel 1 its column + 1 (0 is padding).
    """
    rows, cols = pixels[:, 0].astype(int), pixels[:, 1].astype(int)
    middle = cols[:, 16, :]  # its row is in the image whatever the offset
    inside = middle > 0
    first = middle[np.arange(len(middle)), inside.argmax(axis=1)]
    last = middle[np.arange(len(middle)), 31 - inside[:, ::-1].argmax(axis=1)]
    return _offset(rows), _offset(cols), first > last


def test_crop_offsets_and_flips_have_torchvisions_distribution():
    """RandomCrop(32, padding=4) + RandomHorizontalFlip() against the device path, 4000 draws each."""
    count = 4000
    side = np.arange(1, 33, dtype=np.uint8)
    coded = np.zeros((count, 32, 32, 3), dtype=np.uint8)
    coded[..., 0] = side[:, None]
    coded[..., 1] = side[None, :]
    images = DeviceImages(coded, np.zeros(count), AUGMENTED, CPU)
    torch.manual_seed(0)
    ours = _draws(as_pixels(images.augmented(torch.arange(count))))
    reference = AUGMENTED.torchvision(32)
    picture = Image.fromarray(coded[0])
    torch.manual_seed(1)
    theirs = _draws(as_pixels(torch.stack([reference(picture) for _ in range(count)])))
    for name, drawn, expected in (("top", 0, 9), ("left", 1, 9), ("flip", 2, 2)):
        ours_counts = np.bincount(ours[drawn].astype(int), minlength=expected)
        theirs_counts = np.bincount(theirs[drawn].astype(int), minlength=expected)
        assert len(ours_counts) == len(theirs_counts) == expected, name
        # Both uniform over the offsets 0..8 (flips: 1/2), and alike.
        for counts in (ours_counts, theirs_counts):
            assert stats.chisquare(counts).pvalue > 1e-4, (name, counts)
        table = np.stack([ours_counts, theirs_counts])
        assert stats.chi2_contingency(table).pvalue > 1e-4, (name, table)
    # Offsets and flips are drawn independently: all 9 x 9 x 2 outcomes, evenly.
    joint = np.bincount(ours[0] * 18 + ours[1] * 2 + ours[2].astype(int), minlength=162)
    assert stats.chisquare(joint).pvalue > 1e-4


def test_a_pass_is_an_epoch_of_the_partition_in_batches():
    pixels, labels = random_pixels(50), np.arange(50) % 10
    images = DeviceImages(pixels, labels, AUGMENTED, CPU)
    mine = torch.tensor([3, 7, 11, 19, 20, 21, 22, 40, 41, 42, 43, 49])
    batches = DeviceBatches(images, mine, 5, shuffle=True, augment=True)
    assert len(batches) == 3
    torch.manual_seed(0)
    first = list(batches)
    assert [len(y) for _, y in first] == [5, 5, 2]
    assert all(x.shape[1:] == (3, 32, 32) and x.dtype == torch.float32 for x, _ in first)
    seen = torch.cat([y for _, y in first])
    assert sorted(seen.tolist()) == sorted(labels[mine.numpy()].tolist())  # this client's only
    second = torch.cat([y for _, y in batches])
    torch.manual_seed(0)
    again = torch.cat([y for _, y in batches])
    assert torch.equal(seen, again)  # the generator decides the order...
    assert not torch.equal(seen, second)  # ...and every pass draws a new one
    in_order = DeviceBatches(images, mine, 5, shuffle=False, augment=False)
    assert torch.cat([y for _, y in in_order]).tolist() == labels[mine.numpy()].tolist()


def test_training_on_device_batches_is_training_on_the_dataloaders_batches(fake_cifar):
    """Augmentation off: the same samples in the same order, the same model up to float rounding."""
    split = load_split("cifar10", "train", root=str(fake_cifar), augment=False)
    part = Subset(split, np.arange(10, 90))
    plain = DataLoader(part, batch_size=16)
    fast = device_batches(part, 16, CPU)
    assert isinstance(fast, DeviceBatches) and not fast.augment
    for (x1, y1), (x2, y2) in zip(plain, fast, strict=True):
        assert torch.equal(y1, y2)
        torch.testing.assert_close(x2, x1, rtol=0, atol=2e-6)  # as in the test above
    models = []
    for batches in (plain, fast):
        torch.manual_seed(0)
        model = build_model("cnn", (3, 32, 32), 10)
        loss = train(model, batches, epochs=2, learning_rate=0.01, device=CPU)
        models.append((loss, model.state_dict()))
    (plain_loss, plain_state), (fast_loss, fast_state) = models
    # 10 SGD steps carry the inputs' rounding differences to the weights as
    # relative differences of about 1e-6; a sample out of place moves them
    # by 1e-3 and more. (A ResNet-20 fresh from its initialisation is too
    # chaotic for this: inputs 1e-7 apart give weights 1e-1 apart after 15
    # steps, whichever path made them.)
    assert fast_loss == pytest.approx(plain_loss, rel=1e-5)
    for name, tensor in plain_state.items():
        torch.testing.assert_close(fast_state[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.usefixtures("server_task_identity")
def test_partitions_of_cifar_take_the_device_path_digits_their_own(fake_cifar):
    config = {
        **DEFAULTS,
        "dataset": "cifar10",
        "data-root": str(fake_cifar),
        "partitioning": "iid",
        "batch-size": 8,
    }
    node = Context(1, 3, {"partition-id": 1, "num-partitions": 4}, RecordDict(), config)
    record = ArrayRecord(build_model("cnn", (3, 32, 32), 10).state_dict())
    message = Message(
        RecordDict({"arrays": record, "config": ConfigRecord({"server-round": 1})}),
        dst_node_id=3,
        message_type="train",
    )
    with ClientTask(message, node) as task:
        dataset = task.training_data()
        batches = task.train_loader(dataset)
        assert isinstance(batches, DeviceBatches) and batches.shuffle and batches.augment
        assert sorted(torch.cat([y for _, y in batches]).tolist()) == sorted(dataset.targets)
        tests = task.test_loader(task.test_share())
        assert isinstance(tests, DeviceBatches) and not tests.shuffle and not tests.augment
    digits = load_partition("digits", 0, 4)
    assert device_batches(digits, 8, CPU) is None
    assert isinstance(batch_loader(digits, 8), DataLoader)


def test_a_process_keeps_a_split_on_a_gpu_from_its_second_call_where_it_fits(monkeypatch):
    class Split:
        data = random_pixels(40)
        targets = list(range(40))
        image_transform = AUGMENTED

    split = Split()
    resident = device_module._ResidentSplits()
    monkeypatch.setattr(device_module, "_RESIDENT", resident)
    first = device_batches(Subset(split, [5, 6, 7]), 2, CPU)
    assert first is not None and len(first.images) == 3  # a CPU: only the partition's images
    assert len(device_batches(Subset(split, [5, 6, 7]), 2, CPU).images) == 3
    monkeypatch.setattr(device_module, "_fits", lambda pixels, transform, device: True)
    resident.clear()
    part = Subset(Subset(split, list(range(10, 30))), [0, 4, 19])  # positions 10, 14, 29
    once = device_batches(part, 2, CPU)
    assert len(once.images) == 3  # a process that answers one message copies its partition
    twice = device_batches(part, 2, CPU)
    assert len(twice.images) == 40 and twice.positions.tolist() == [10, 14, 29]
    assert device_batches(Subset(split, [1]), 2, CPU).images is twice.images  # kept
    pixels = [
        x for x, _ in DeviceBatches(twice.images, twice.positions, 3, shuffle=False, augment=False)
    ]
    np.testing.assert_array_equal(
        as_pixels(pixels[0]), split.data[[10, 14, 29]].transpose(0, 3, 1, 2)
    )
    monkeypatch.setattr(device_module, "_fits", lambda pixels, transform, device: False)
    resident.clear()
    for _ in range(3):  # where it does not fit, every call copies its partition's images
        assert len(device_batches(part, 2, CPU).images) == 3
