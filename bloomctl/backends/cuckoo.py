"""Moved to ``bloomctl.backends.cuckoo_redisbloom`` (CF.*), ``bloomctl.backends.cuckoo_lua`` (the
module-free filter) and ``bloomctl.backends.cuckoo_base`` (what both share); this path stays for
code written against it."""

from bloomctl.backends import cuckoo_plan_for as plan_for  # noqa: F401
from bloomctl.backends.cuckoo_base import CuckooBackend  # noqa: F401
from bloomctl.backends.cuckoo_lua import (  # noqa: F401
    LARGE_RESERVE,
    LUA_BATCH_SIZE,
    LUA_FORMAT,
    LUA_HEADER,
    LUA_MAGIC,
    LuaCuckoo,
    lua_positions,
    parse_lua_header,
    recognise_lua,
)
from bloomctl.backends.cuckoo_redisbloom import (  # noqa: F401
    CF_HEADER,
    RedisBloomCuckoo,
    cf_size_bytes,
    parse_cf_header,
    translate_cuckoo_error,
)
from bloomctl.backends.strings import SLICE  # noqa: F401
