"""Write the paper-setting run configs of FedMR, FedMut and FedCross into ``configs/``.

A setting file is named ``<dataset>-<model>-<partition>.toml`` (partition:
``dir<alpha>``, ``iid`` or ``natural``) and holds the hyper-parameters of
every method at once, so a comparison switches ``strategy`` only. The values
come from the papers in ``../shared/papers/``; where a paper is silent the
file says what we chose. The files are committed; this script is how they were
made, and ``tests/unit/test_config.py`` checks that it still makes the same ones.

Run from the repository root::

    python configs/generate.py            # rewrites configs/<setting>.toml
    python configs/generate.py OUT_DIR    # writes them into OUT_DIR instead
"""

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
RUN_HINT = "client-resources-num-cpus=2 client-resources-num-gpus=0.1"
WIDTH = 88


def comment(text: str) -> str:
    """``text`` as TOML comment lines of at most :data:`WIDTH` characters."""
    return textwrap.fill(text, WIDTH, initial_indent="# ", subsequent_indent="# ")


COMMON = (
    "\n"
    + comment(
        "Every method: 10% of the clients per round, SGD lr 0.01, momentum 0.9, batch 50, "
        '5 local epochs (FedMR Sec. 5.1, FedMut "Settings"; FedCross Sec. 4.1 writes '
        "momentum 0.5). The papers give no round budget: 2000 rounds is our choice (the "
        "authors' FedMR code defaults to 500)."
    )
    + """
fraction-train = 0.1
min-train-nodes = {per_round}
min-available-nodes = {clients}
learning-rate = 0.01
momentum = 0.9
weight-decay = 0.0
batch-size = 50
local-epochs = 5
num-server-rounds = 2000
eval-every = 10
"""
)

METHODS = """
{mu_comment}
proximal-mu = {mu}

# FedMR (its global model and two-stage first stage), FedIndep, FedMut (w_glb)
# and FedCross average a round's models by their plain mean, as the authors'
# code does (Aggregation(w_locals, None)); "weighted" weights by num-examples.
pool-mean = "uniform"

{first_stage_comment}
first-stage-rounds = {first_stage}
grouping = "tensor"
segment-fraction = 0.0

{beta0_comment}
fedmut-alpha = 4.0
fedmut-beta0 = {beta0}
fedmut-beta-rounds = 100

# FedCross: alpha = 0.99 and lowest-similarity collaborators, the best in its
# ablation (Sec. 4.4.1, Table 2 and Figure 3), by the paper's cosine over whole
# models ("layer-pairs": the authors' lab's code, see README).
fedcross-alpha = 0.99
fedcross-selection = "lowest_similarity"
fedcross-similarity = "model"
fedcross-propeller-rounds = 0
fedcross-dynamic-alpha-rounds = 0
"""


@dataclass(frozen=True)
class Model:
    """Per-model method settings."""

    name: str
    title: str
    first_stage: int
    first_stage_note: str
    beta0: float
    beta0_source: str


_TWO_STAGE = (
    "two-stage training, the first 100 rounds FedAvg (Sec. 5.1, Model Settings), the "
    "paper's FedMR for this model. first-stage-rounds = 0 gives one-stage FedMR."
)
_NO_TWO_STAGE = (
    "the paper's FedMR{which} is one-stage (first-stage-rounds = 0{why}). For the two-stage "
    "variant it gives no first-stage length{what}: 50 rounds, the shorter of its two best "
    "settings FedMR-50 and FedMR-100 (Sec. 5.4.3), is our choice."
)
MODELS = {
    "cnn": Model(
        "cnn",
        "CNN",
        50,
        _NO_TWO_STAGE.format(
            which=" for the CNN",
            why=': "without pre-training a global model, since CNN here only has four '
            'layers", Sec. 5.1',
            what=" for the CNN",
        ),
        0.3,
        "FedMut's value for CNN and VGG-16",
    ),
    "resnet20": Model(
        "resnet20",
        "ResNet-20",
        100,
        _TWO_STAGE,
        0.5,
        "FedMut's value for its ResNet, ResNet-18 there",
    ),
    "vgg16": Model(
        "vgg16",
        "VGG-16",
        100,
        _TWO_STAGE,
        0.3,
        "FedMut's value for CNN and VGG-16",
    ),
    "lstm": Model(
        "lstm",
        "LSTM",
        50,
        _NO_TWO_STAGE.format(
            which="",
            why="; FedMR has no text task",
            what=" for an LSTM",
        ),
        0.3,
        "FedMut gives none for its LSTM: its CNN and VGG-16 value, the authors' code default",
    ),
}


@dataclass(frozen=True)
class Setting:
    """One dataset/model/partition combination and its header text (plain, unwrapped)."""

    dataset: str
    model: Model
    partition: str  # "iid", "natural" or a Dirichlet alpha such as "0.1"
    description: str
    clients: int
    mu: float
    mu_source: str
    data: str  # dataset keys

    @property
    def stem(self) -> str:
        suffix = self.partition if self.partition in ("iid", "natural") else f"dir{self.partition}"
        return f"{self.dataset}-{self.model.name}-{suffix}"

    def text(self) -> str:
        """The TOML file: header comment, data keys, common and per-method keys."""
        header = [
            comment(self.description),
            comment(
                "One file holds every method's paper hyper-parameters; a comparison only "
                "switches `strategy` (fedx-compare's methods fedavg, fedprox, fedmr with "
                "first-stage-rounds = 0, fedmr-two-stage, fedindep, fedmut, fedcross). "
                "Generated by configs/generate.py. Run one method, or compare them all, "
                f"with {self.clients} SuperNodes:"
            ),
            f"#   flwr run . --stream --run-config configs/{self.stem}.toml \\",
            f'#     --federation-config "num-supernodes={self.clients} {RUN_HINT}"',
            (
                f"#   fedx-compare configs/{self.stem}.toml --out comparisons/{self.stem} "
                "--client-cpus 2 --client-gpus 0.1"
            ),
            "",
            'strategy = "fedmr"',
            self.data,
        ]
        common = COMMON.format(per_round=int(self.clients * 0.1), clients=self.clients)
        methods = METHODS.format(
            mu=self.mu,
            mu_comment=comment(f"FedProx: mu = {self.mu} ({self.mu_source})."),
            first_stage=self.model.first_stage,
            first_stage_comment=comment(f"FedMR: {self.model.first_stage_note}"),
            beta0=self.model.beta0,
            beta0_comment=comment(
                f'FedMut: alpha = 4.0 (Sec. "Comparison of Accuracy"); beta0 = '
                f"{self.model.beta0} ({self.model.beta0_source}); T_b = 100 (authors' code)."
            ),
        )
        return "\n".join(header) + common + methods


_CIFAR_TITLES = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}
# FedMR Sec. 5.1 and FedCross Sec. 4.1.2: "the best values of mu for CIFAR-10,
# CIFAR-100, and FEMNIST are 0.01, 0.001, and 0.1"; FedMut uses 0.01 throughout.
_MU = {"cifar10": 0.01, "cifar100": 0.001, "femnist": 0.1, "shakespeare": 0.01}
_MU_SOURCE = "FedMR Sec. 5.1 and FedCross Sec. 4.1.2, the best of their search"


def cifar_setting(dataset: str, model: Model, partition: str) -> Setting:
    """CIFAR-10/100 over 100 clients: Dirichlet label skew or IID."""
    title = _CIFAR_TITLES[dataset]
    if partition == "iid":
        skew, data = "IID", f'dataset = "{dataset}"\nmodel = "{model.name}"\npartitioning = "iid"\n'
    else:
        skew = f"Dir({partition})"
        data = (
            f'dataset = "{dataset}"\nmodel = "{model.name}"\npartitioning = "dirichlet"\n'
            f"dirichlet-alpha = {partition}\nmin-partition-size = 10\n"
        )
    description = f"{title}, {model.title}, {skew} over 100 clients: Table 1 of FedMR (KDD'24), "
    description += "FedMut (AAAI'24) and FedCross (ICDE'24)"
    if model.name == "resnet20":
        description += " (FedMut's table has ResNet-18 instead)"
    if partition != "iid":
        description += (
            f". FedMR's alpha, FedMut's d and FedCross's beta are this Dirichlet parameter, "
            f"{partition}"
        )
    description += ". torchvision's CIFAR files under data-root."
    if dataset == "cifar100":
        description += (
            " The 100 fine labels: the authors' public FedMR and FedMut code trains CIFAR-100 "
            "with its 20 coarse classes, which the papers do not mention."
        )
    return Setting(dataset, model, partition, description, 100, _MU[dataset], _MU_SOURCE, data)


def femnist_setting() -> Setting:
    """FEMNIST: 180 writers with more than 100 samples each, one writer per client."""
    data = (
        'dataset = "femnist"\nmodel = "cnn"\npartitioning = "natural"\n'
        "leaf-users = 180\nleaf-min-samples = 100\n"
    )
    description = (
        "FEMNIST, CNN, LEAF's natural non-IID split: Table 1 of FedMR (KDD'24) and FedCross "
        '(ICDE\'24), "180 clients, where each client hosts more than 100 local data samples" '
        "(FedMR Sec. 5.1, FedCross Sec. 4.1.1). fedx draws the 180 by seed from the writers "
        "with more than 100 samples (fedx.data.leaf.select_users); each writer is one client. "
        "Data: in leaf/data/femnist run `./preprocess.sh -s niid --sf 0.1 -k 100 -t sample` "
        'and point data-root at leaf/data (data-root="/path/to/leaf/data").'
    )
    return Setting(
        "femnist", MODELS["cnn"], "natural", description, 180, _MU["femnist"], _MU_SOURCE, data
    )


def shakespeare_setting() -> Setting:
    """Shakespeare: 128 speaking roles, one role per client."""
    data = (
        'dataset = "shakespeare"\nmodel = "lstm"\npartitioning = "natural"\n'
        "leaf-users = 128\nleaf-min-samples = 100\n"
    )
    description = (
        "Shakespeare, LSTM, LEAF's natural non-IID split: Table 2 of FedMut (AAAI'24), which "
        '"directly used the non-IID settings in LEAF" and gives no client count. 128 roles is '
        "the count in the authors' public FedMut code (its recorded Shakespeare partition "
        "has num_users 128); fedx draws them by seed from the roles with more than 100 "
        "samples (LEAF's -k 100, our choice). Each role is one client. Data: in "
        "leaf/data/shakespeare run `./preprocess.sh -s niid --sf 0.3 -k 100 -t sample --tf "
        '0.8` and point data-root at leaf/data (data-root="/path/to/leaf/data").'
    )
    return Setting(
        "shakespeare",
        MODELS["lstm"],
        "natural",
        description,
        128,
        _MU["shakespeare"],
        'FedMut\'s baseline setting, "Baselines"',
        data,
    )


def settings() -> list[Setting]:
    """Every paper setting: the 24-file CIFAR grid, FEMNIST and Shakespeare."""
    grid = [
        cifar_setting(dataset, MODELS[model], partition)
        for dataset in ("cifar10", "cifar100")
        for model in ("cnn", "resnet20", "vgg16")
        for partition in ("0.1", "0.5", "1.0", "iid")
    ]
    return [*grid, femnist_setting(), shakespeare_setting()]


def write(directory: Path) -> list[Path]:
    """Write every setting file into ``directory``; return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for setting in settings():
        path = directory / f"{setting.stem}.toml"
        path.write_text(setting.text(), encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else CONFIG_DIR
    for written in write(target):
        print(written)
