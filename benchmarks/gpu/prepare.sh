#!/usr/bin/env bash
# On a machine that reaches PyPI: put into .gpu/ (git-ignored) what benchmarks/gpu/run.sh installs
# on a GPU machine that reaches no index: the wheels of wheels.txt for CPython 3.12 on x86-64
# Linux, without dependencies, and Ray unpacked, stripped of what Flower's simulation does not use
# (Java, RLlib, Serve, Tune, Train, Data, LLM) and packed as a .tar.xz.
# Run from the checkout's root: bash benchmarks/gpu/prepare.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest=.gpu
mkdir -p "$dest"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform any \
  -d "$dest" $(grep -v '^#' "$here/wheels.txt")
ray_wheel=$(ls "$dest"/ray-*.whl)
work=$(mktemp -d)
python3 -m zipfile -e "$ray_wheel" "$work"
rm -rf "$work"/ray/jars "$work"/ray/rllib "$work"/ray/serve "$work"/ray/tune "$work"/ray/train \
  "$work"/ray/llm "$work"/ray/data
tar -C "$work" -cJf "$dest/ray-2.55.1-stripped.tar.xz" .
rm -rf "$work" "$ray_wheel"
du -sh "$dest"
