#!/usr/bin/env bash
# On a machine that reaches PyPI: put into .gpu/ (git-ignored) what benchmarks/gpu/run.sh installs
# on a GPU machine that reaches no index: the wheels of wheels.txt for CPython 3.12 on x86-64
# Linux, without dependencies, and Ray unpacked with every file's mode (its gcs_server and raylet
# stay executable), stripped of what Flower's simulation does not use (Java, RLlib, Serve, Tune,
# Train, Data, LLM) and packed as a .tar.xz (fedx_bench/pack_ray.py).
# Run from the checkout's root: bash benchmarks/gpu/prepare.sh
# PYTHON_VERSION (default 3.12) and DEST (default .gpu) prepare for another interpreter elsewhere
# (the GPU machine's environment rebuilt on a CPU one).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest=${DEST:-.gpu}
pyv=${PYTHON_VERSION:-3.12}
abi=cp${pyv/./}
mkdir -p "$dest"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyv" \
  --implementation cp --abi "$abi" --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform any \
  -d "$dest" $(grep -v '^#' "$here/wheels.txt")
ray_wheel=$(ls "$dest"/ray-*.whl)
ray_version=$(basename "$ray_wheel" | cut -d- -f2)
python3 "$here/../fedx_bench/pack_ray.py" "$ray_wheel" "$dest/ray-$ray_version-stripped.tar.xz"
rm "$ray_wheel"
du -sh "$dest"
