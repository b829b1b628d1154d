"""Defaults and limits shared by the library and the command line (a light module: no imports).

The CLI shows these in ``--help`` and the library uses them as parameter defaults: change a
number here and both follow.
"""

AUTO = "auto"  # --backend auto, --capacity auto

# --- connection ---------------------------------------------------------------------------------
DEFAULT_URL = "redis://localhost:6379/0"
URL_ENV = "BLOOMCTL_URL"
PASSWORD_ENV = "BLOOMCTL_PASSWORD"
BACKEND_ENV = "BLOOMCTL_BACKEND"
DB_URL_ENV = "BLOOMCTL_DB_URL"
CONFIG_ENV = "BLOOMCTL_CONFIG"  # the application's filters (bloomctl.toml)
DEFAULT_CONNECT_TIMEOUT = 5.0  # seconds to wait for a connection
DEFAULT_TIMEOUT = 30.0  # seconds to wait for a reply

# --- sizing -------------------------------------------------------------------------------------
DEFAULT_EXPANSION = 2  # RedisBloom's own default growth factor
MAX_SHARDS = 1024  # members of one sharded filter

# --- swap ---------------------------------------------------------------------------------------
DEFAULT_KEEP_OLD_SECONDS = 3600  # a swap keeps the replaced filter this long for `rollback` (0: unlink it)
MAX_LOCK_WAIT_SECONDS = 24 * 3600  # the longest --lock-wait
DEFAULT_MIN_RATIO = 0.5  # swap refuses a standby with fewer items than this fraction of the active filter's
MAX_KEEP_OLD_SECONDS = 10 * 365 * 24 * 3600  # the longest keep-old (PEXPIRE must not overflow)
DEFAULT_LOCK_TTL_MS = 30_000  # a dead holder's lock expires after this; a live one renews it

# --- rebuild ------------------------------------------------------------------------------------
BUILD_CHOICES = (AUTO, "client", "server")  # where a rebuild computes the filter's bits
DEFAULT_CLIENT_MEMORY = 1 << 30  # bytes a client build may hold (the filter's bits + working memory)
CLIENT_BATCH = 1 << 16  # items hashed per step of a client build
MAX_WINDOW_KEEP = 1000  # buckets of one time-windowed filter
MAX_JOBS = 64  # processes of one client build
ENGINES = ("dask", "spark")  # distributed engines that build the bits (bloomctl.distributed)
DEFAULT_BATCH_SIZE = 5000  # items per BF.INSERT (about 1 ms on the server)
BITMAP_BATCH_SIZE = (
    1000  # items per FCALL bloomctl_madd: ~5 ms on the server (2000: ~11 ms, outliers to 29 ms), as fast overall
)
DEFAULT_WINDOW = 4  # batches in flight per connection
DEFAULT_VERIFY_SAMPLE = 10_000  # random source items checked in the standby before a swap
DEFAULT_HEADROOM = 2.0  # capacity auto = counted rows x headroom
MAX_HEADROOM = 1000
DEFAULT_CATCHUP_SKEW = 60.0  # seconds subtracted from the load start for the SQL catch-up
MAX_CATCHUP_SKEW = 7 * 24 * 3600

# --- sources ------------------------------------------------------------------------------------
DEFAULT_DELIMITER = ","
DEFAULT_ENCODING = "utf-8"
DEFAULT_SKIP_BAD_ROWS = 0

# --- fill-ratio ---------------------------------------------------------------------------------
DEFAULT_WARN = 0.8  # WARN above this fill ratio (or the max, when that is lower)
DEFAULT_MAX_FILL = 1.0  # OVER (exit 1) above this fill ratio
MAX_TIMEOUT = 86_400.0  # seconds: --timeout and --connect-timeout (a socket timeout must be finite)

# --- counts a filter's bits must support --------------------------------------------------------
# A count above the estimate from the bits by more than this share (or the estimate's own noise)
# is settled by a parallel build (items repeated across its parts), and is the most a restore
# accepts before it takes the dump for damaged: a dump of any filter bloomctl built restores.
COUNT_TOLERANCE = 0.01  # the estimate is within 0.003% of the true count at 10M distinct items
