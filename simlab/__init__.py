"""simlab: a lab for speculative decoding.

The package is a one-way pipeline (see docs/architecture.md):
``trace`` (schema, IO, synthetic traces) <- ``record`` (real models);
``latency`` (cost models); ``analytic`` (closed forms); ``policies`` (decisions);
``rounds`` (the protocol between a policy and an executor); ``sim`` (SimPy executor);
``live`` (real executor); ``metrics``; ``cli``.
"""

__version__ = "0.1.0"
