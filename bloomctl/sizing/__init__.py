"""Sizing: what RedisBloom allocates for a Bloom filter (``bloom``) or a cuckoo filter (``cuckoo``), to the byte.

Pure arithmetic: no server, no I/O.
"""
