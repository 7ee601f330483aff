"""Softmax regression on synthetic Gaussian blobs, in numpy alone."""

import numpy as np

NUM_FEATURES = 8
NUM_CLASSES = 3
LOCAL_STEPS = 20
LEARNING_RATE = 0.5


def initial_model() -> dict[str, np.ndarray]:
    """Zero weights and biases, as a named ``{name: array}`` state."""
    return {
        "weight": np.zeros((NUM_FEATURES, NUM_CLASSES), dtype=np.float32),
        "bias": np.zeros(NUM_CLASSES, dtype=np.float32),
    }


def load_data(partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """This node's samples: three blobs, each node with its own class mix."""
    rng = np.random.default_rng(1000 + partition_id)
    centres = np.random.default_rng(0).normal(scale=2.0, size=(NUM_CLASSES, NUM_FEATURES))
    mix = rng.dirichlet(np.ones(NUM_CLASSES) * (1 + num_partitions % 3))
    labels = rng.choice(NUM_CLASSES, size=120, p=mix)
    features = centres[labels] + rng.normal(size=(labels.size, NUM_FEATURES))
    return features.astype(np.float32), labels


def train(
    model: dict[str, np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    steps: int = LOCAL_STEPS,
    lr: float = LEARNING_RATE,
) -> float:
    """Full-batch gradient descent on the cross-entropy; returns the final loss."""
    weight, bias = model["weight"].copy(), model["bias"].copy()
    onehot = np.eye(NUM_CLASSES, dtype=np.float32)[y]
    loss = 0.0
    for _ in range(steps):
        logits = x @ weight + bias
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        loss = float(-np.mean(np.log(probs[np.arange(y.size), y] + 1e-12)))
        grad = (probs - onehot) / y.size
        weight -= lr * x.T @ grad
        bias -= lr * grad.sum(axis=0)
    model["weight"], model["bias"] = weight, bias
    return loss


def accuracy(model: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of samples classified correctly."""
    return float(np.mean(np.argmax(x @ model["weight"] + model["bias"], axis=1) == y))
