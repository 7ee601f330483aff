"""fedx's benchmarks as a package: the harness they share and each benchmark's code.

``benchmarks/<name>.py`` is a benchmark's command: it runs ``fedx_bench.<name>``
(``python benchmarks/<name>.py --help``). Run that way, ``benchmarks/`` is
first on ``sys.path``, so this package imports without being installed; the
tests find it through pytest's ``pythonpath`` (pyproject.toml).

The harness:

* :mod:`fedx_bench.common`: the options every benchmark shares, the tables it
  prints, /proc readings, ``flwr run`` and the exit that never fails a caller;
* :mod:`fedx_bench.fake_cifar` (and ``fake_cifar_site/``): CIFAR-shaped files
  for machines that cannot download CIFAR;
* :mod:`fedx_bench.slow_links` and :mod:`fedx_bench.relay`: hosts joined by
  slow, distant links on one machine;
* ``trace/``: timestamps of one message's way through Flower's processes;
* :mod:`fedx_bench.gpu`: the GPU kit's runs and monitor (with ``benchmarks/gpu/``'s
  scripts; :mod:`fedx_bench.pack_ray` packs Ray for it).

The benchmarks, by what they measure:

* fedx's own operations: ``server_ops``, ``round_bytes``, ``secure_recombination``,
  ``hostile_replies``;
* the cost of Flower's runtime and of fedx's changes to it: ``simulation_overhead``,
  ``startup``, ``deployment``, ``fast_setup``, ``idle_federation``,
  ``clientapp_startups``, ``message_timeline``, ``links``;
* a GPU machine: ``gpu_round``, ``gpu_configs``.

Nothing here is imported by fedx, and nothing here is a test: a benchmark
reports and exits with status 0.
"""
