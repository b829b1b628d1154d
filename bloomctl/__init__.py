"""bloomctl: the lifecycle of Bloom filters kept in Redis.

The package is a library first; ``bloomctl.cli`` is a thin Click adapter over it.
Heavy dependencies (redis, rich, tqdm) are imported lazily by the modules that need them,
so ``bloomctl --help`` starts fast.
"""

__version__ = "0.1.0"
