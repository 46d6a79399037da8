"""The real-process scaffolding that tests/ and benchmarks/ share; not part of the product.

Both import it and neither imports the other: `processes` (free ports, polling with a deadline,
starting and stopping processes, the repository root and the venv's console scripts), `device`
(a real `logjam-device` on free ports), `native` (the built C modules, for a test of the C path),
`courier_client` and `segment_client` (protocol clients written from the specs), `mesh` (a whole
mesh under supervisord on spare ports), `lumberjack_load` (the end-to-end Lumberjack load),
`fairness` (the quiet-against-loud scenario of benchmarks/fairness.py and tests/test_mesh_fairness.py)
`cpu` (the CPU seconds of a benchmarked process, from /proc), `prometheus` (a process's histograms
from its /metrics, and their quantiles) and `xdist_groups` (the pytest plugin
behind `make test`'s `--dist loadgroup`, registered by tests/conftest.py).

It is not installed: pyproject.toml's package list leaves it out, as it leaves out tests/ and
benchmarks/. pytest (run from the repository root) and every benchmark (which puts the root on
sys.path) import it from the checkout.
"""
