"""Kept for Flower projects that call ``fedx.ray_backend.install()``: fedx's backend is :mod:`fedx.simulation`."""

from fedx.simulation import install

__all__ = ["install"]
