"""Tests for fedx.models: shapes, architectures, parameter counts, reproducible init."""

import pytest
import torch
from torch import nn
from torchvision.models.resnet import BasicBlock

from fedx.models import CNN, MODEL_NAMES, build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _layers(model: nn.Module, kind: type[nn.Module]) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, kind)]


@pytest.mark.parametrize(
    ("name", "input_shape", "num_classes"),
    [
        ("cnn", (1, 8, 8), 10),
        ("cnn", (1, 28, 28), 62),
        ("cnn", (3, 32, 32), 100),
        ("resnet20", (1, 8, 8), 10),
        ("resnet20", (3, 32, 32), 100),
        ("vgg16", (3, 32, 32), 10),
        ("vgg16", (1, 32, 32), 7),
    ],
)
def test_output_shape(name: str, input_shape: tuple[int, int, int], num_classes: int) -> None:
    model = build_model(name, input_shape, num_classes).eval()
    with torch.no_grad():
        logits = model(torch.randn(3, *input_shape))
    assert logits.shape == (3, num_classes)
    assert torch.isfinite(logits).all()


def test_model_names() -> None:
    assert MODEL_NAMES == (
        "cnn",
        "resnet20",
        "vgg16",
        "lstm",
        "cnn-1",
        "cnn-2",
        "cnn-3",
        "cnn-4",
        "vgg11",
        "vgg13",
        "vgg19",
    )


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
@pytest.mark.parametrize("input_shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_cnn_family_has_depth_conv_blocks_and_runs_on_small_inputs(
    depth: int, input_shape: tuple[int, int, int]
) -> None:
    model = build_model(f"cnn-{depth}", input_shape, 10)
    convs = _layers(model, nn.Conv2d)
    assert [c.out_channels for c in convs] == [32, 64, 128, 256][:depth]
    # Pooling stops at 1x1: four blocks on 8x8 digits pool three times.
    side = min(input_shape[1:])
    expected_pools = min(depth, side.bit_length() - 1)
    assert len(_layers(model, nn.MaxPool2d)) == expected_pools
    assert model(torch.zeros(2, *input_shape)).shape == (2, 10)


def test_cnn_2_is_the_fedavg_cnn() -> None:
    torch.manual_seed(0)
    cnn = build_model("cnn", (1, 28, 28), 10).state_dict()
    torch.manual_seed(0)
    cnn_2 = build_model("cnn-2", (1, 28, 28), 10).state_dict()
    assert list(cnn) == list(cnn_2)
    assert all(torch.equal(cnn[k], cnn_2[k]) for k in cnn)


@pytest.mark.parametrize(
    ("depth", "convs", "parameters"),
    [
        (11, 8, 9_750_922),
        (13, 10, 9_935_434),
        (16, 13, 15_245_130),
        (19, 16, 20_554_826),
    ],
)
def test_vgg_family_depths(depth: int, convs: int, parameters: int) -> None:
    model = build_model(f"vgg{depth}", (3, 32, 32), 10)
    # depth = conv layers + the three linear layers of the head.
    assert len(_layers(model, nn.Conv2d)) == convs == depth - 3
    assert len(_layers(model, nn.Linear)) == 3
    assert _num_parameters(model) == parameters
    with pytest.raises(ValueError, match=f"vgg{depth} needs inputs of at least 32x32"):
        build_model(f"vgg{depth}", (1, 8, 8), 10)


def test_unknown_model_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError) as info:
        build_model("foo", (1, 8, 8), 10)
    message = str(info.value)
    assert "'foo'" in message
    assert all(name in message for name in MODEL_NAMES)


@pytest.mark.parametrize("input_shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_cnn_structure_and_parameter_count(input_shape: tuple[int, int, int]) -> None:
    channels, height, width = input_shape
    model = build_model("cnn", input_shape, 10)
    assert isinstance(model, CNN)

    convs = _layers(model, nn.Conv2d)
    linears = _layers(model, nn.Linear)
    assert [(c.in_channels, c.out_channels) for c in convs] == [(channels, 32), (32, 64)]
    assert all(c.kernel_size == (5, 5) and c.padding == (2, 2) for c in convs)
    assert len(_layers(model, nn.MaxPool2d)) == 2
    flat = 64 * (height // 4) * (width // 4)
    assert [(fc.in_features, fc.out_features) for fc in linears] == [(flat, 512), (512, 10)]

    expected = (
        (channels * 25 * 32 + 32)  # conv1
        + (32 * 25 * 64 + 64)  # conv2
        + (flat * 512 + 512)  # hidden fully connected
        + (512 * 10 + 10)  # output
    )
    assert _num_parameters(model) == expected


def test_cnn_on_mnist_shape_matches_the_fedavg_paper() -> None:
    # McMahan et al. (2017) give 1,663,370 parameters for their MNIST CNN.
    assert _num_parameters(build_model("cnn", (1, 28, 28), 10)) == 1_663_370


def test_cnn_conv_depth_is_configurable() -> None:
    model = CNN((1, 28, 28), 10, conv_channels=(8, 16, 32, 64))
    assert [c.out_channels for c in _layers(model, nn.Conv2d)] == [8, 16, 32, 64]
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match="16x16"):
        CNN((1, 8, 8), 10, conv_channels=(8, 16, 32, 64))


def test_resnet20_has_twenty_weighted_layers() -> None:
    model = build_model("resnet20", (3, 32, 32), 10)
    blocks = _layers(model, BasicBlock)
    assert len(blocks) == 9
    assert [b.conv1.out_channels for b in blocks] == [16] * 3 + [32] * 3 + [64] * 3

    projection_convs = {
        id(m) for b in blocks if b.downsample is not None for m in b.downsample.modules()
    }
    convs = _layers(model, nn.Conv2d)
    main_path_convs = [c for c in convs if id(c) not in projection_convs]
    assert len(main_path_convs) == 19
    assert len(_layers(model, nn.Linear)) == 1
    # The two stage transitions (16->32, 32->64) use 1x1 conv + BN projections.
    projections = [b.downsample for b in blocks if b.downsample is not None]
    assert len(projections) == 2
    assert all(isinstance(p[0], nn.Conv2d) and p[0].kernel_size == (1, 1) for p in projections)
    assert all(isinstance(p[1], nn.BatchNorm2d) for p in projections)
    assert len(_layers(model, nn.BatchNorm2d)) == 19 + 2


def test_resnet20_parameter_count() -> None:
    # 0.27M in He et al.'s Table 6; the two projection shortcuts add 2,752.
    assert _num_parameters(build_model("resnet20", (3, 32, 32), 10)) == 272_474


def test_vgg16_structure_and_parameter_count() -> None:
    model = build_model("vgg16", (3, 32, 32), 10)
    assert len(_layers(model, nn.Conv2d)) == 13
    assert [(fc.in_features, fc.out_features) for fc in _layers(model, nn.Linear)] == [
        (512, 512),
        (512, 512),
        (512, 10),
    ]
    assert len(_layers(model, nn.Dropout)) == 2
    assert _num_parameters(model) == 15_245_130


@pytest.mark.parametrize("input_shape", [(1, 8, 8), (1, 28, 28), (3, 32, 16)])
def test_vgg16_rejects_small_inputs(input_shape: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="32x32"):
        build_model("vgg16", input_shape, 10)


@pytest.mark.parametrize(
    ("name", "input_shape"),
    [("cnn", (1, 8, 8)), ("resnet20", (3, 32, 32)), ("vgg16", (3, 32, 32)), ("lstm", (80,))],
)
def test_same_seed_gives_same_initial_model(name: str, input_shape: tuple[int, int, int]) -> None:
    def state_after_seed(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build_model(name, input_shape, 10).state_dict()

    first, again, other = state_after_seed(3), state_after_seed(3), state_after_seed(4)
    assert list(first) == list(again)
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert any(not torch.equal(first[key], other[key]) for key in first)


def test_lstm_is_leafs_character_model() -> None:
    model = build_model("lstm", (80,), 80)
    assert (model.embedding.num_embeddings, model.embedding.embedding_dim) == (80, 8)
    assert (model.lstm.input_size, model.lstm.hidden_size, model.lstm.num_layers) == (8, 256, 2)
    assert model.lstm.batch_first
    assert (model.classifier.in_features, model.classifier.out_features) == (256, 80)
    # Embedding 640, LSTM layers 272,384 and 526,336 (two bias vectors per
    # layer in PyTorch), classifier 20,560.
    assert _num_parameters(model) == 819_920


def test_lstm_predicts_from_the_last_character() -> None:
    torch.manual_seed(0)
    model = build_model("lstm", (80,), 80).eval()
    tokens = torch.randint(0, 80, (4, 80))
    with torch.no_grad():
        logits = model(tokens)
        assert logits.shape == (4, 80) and torch.isfinite(logits).all()
        # An earlier character changes the prediction (the line is read, not
        # only its last character), and the output is the last step's.
        changed = tokens.clone()
        changed[:, -10] = (changed[:, -10] + 1) % 80
        assert not torch.allclose(model(changed), logits)
        outputs, _ = model.lstm(model.embedding(tokens))
        torch.testing.assert_close(model.classifier(outputs[:, -1]), logits)


@pytest.mark.parametrize(
    ("name", "input_shape", "problem"),
    [
        ("lstm", (3, 32, 32), "reads token sequences"),
        ("cnn", (80,), "reads images"),
        ("lstm", (0,), "reads token sequences"),
    ],
)
def test_models_reject_the_other_kind_of_input(name, input_shape, problem) -> None:
    with pytest.raises(ValueError, match=problem):
        build_model(name, input_shape, 80)
