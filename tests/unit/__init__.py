"""Unit tests: no processes, containers, clusters, namespaces or browser (the quick tier)."""
