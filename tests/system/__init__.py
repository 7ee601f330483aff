"""System tests: each starts a system; this folder gives them the ``system`` mark."""
