"""Helpers shared by the test modules (the fixtures are in tests/fixtures/): Redis look-ups and
set-ups (redis.py), files and the items read back from them (files.py), bloomctl in a process of
its own (processes.py), the compatibility table's rows (matrix.py), a model of RedisBloom's chain
(bloom_model.py) and a reader hammering a key (hammer.py)."""
