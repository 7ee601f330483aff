"""torchvision expects the md5 sums of a fake CIFAR's files in every process (``benchmarks/fedx_bench/fake_cifar.py``).

Put this folder first on ``PYTHONPATH`` and set ``FEDX_FAKE_CIFAR_MD5`` to the
md5 file :func:`fedx_bench.fake_cifar.write` wrote: when a process imports
``torchvision.datasets.cifar``, its CIFAR classes are given those sums. Without
the variable nothing is patched.
"""

import importlib.abc
import importlib.util
import json
import os
import sys

MODULE = "torchvision.datasets.cifar"


def patch(module, md5_path: str) -> None:
    """Give ``module``'s (``torchvision.datasets.cifar``) CIFAR classes the written files' md5 sums."""
    with open(md5_path) as handle:
        sums = json.load(handle)
    for name, dataset_class in (("cifar10", module.CIFAR10), ("cifar100", module.CIFAR100)):
        written = sums.get(name)
        if written is None:
            continue
        dataset_class.train_list = [[f, written[f]] for f, _ in dataset_class.train_list]
        dataset_class.test_list = [[f, written[f]] for f, _ in dataset_class.test_list]
        dataset_class.meta = {**dataset_class.meta, "md5": written[dataset_class.meta["filename"]]}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of :data:`MODULE` to patch it once executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            patch(module, os.environ["FEDX_FAKE_CIFAR_MD5"])

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("FEDX_FAKE_CIFAR_MD5"):
    sys.meta_path.insert(0, _AfterImport())
