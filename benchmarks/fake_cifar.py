"""The command of fedx_bench/fake_cifar.py: CIFAR-shaped files for machines that cannot download CIFAR."""

from fedx_bench import fake_cifar

if __name__ == "__main__":
    fake_cifar.main()
