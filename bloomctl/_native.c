/* bloomctl's native kernel: the two loops that Python and numpy make slow.
 *
 * 1. A client build's bits: hash every item of a batch and set its bits, in order, counting the
 *    items that set a bit no earlier item had set, exactly as the server counts adds. Two
 *    schemes, each the server's own:
 *   redisbloom: MurmurHash64A twice (a with RedisBloom's seed, b seeded with a), bit
 *               (a + i*b) mod bits, least significant bit of a byte first (RedisBloom's bloom.c);
 *   bitmap:     SHA-1 of the item, two big-endian 48-bit halves h1 and h2, bit
 *               (h1 mod m + i * max(h2 mod m, 1)) mod m, most significant bit first (Redis's
 *               own bit order: bloomctl's function library).
 *
 * The items arrive as Arrow lays them out: one byte buffer and offsets (int32 or int64), item i
 * being data[offsets[i] .. offsets[i+1]). Nothing is copied and the GIL is released while the
 * batch is worked, so a reader thread parses the next batch meanwhile. The numpy code in
 * murmur.py, bits.py and bitmap.py is the reference; the tests compare the three (kernel, numpy,
 * server) bit for bit.
 */
/* 2. The strict CSV check of the bytes pyarrow parses (sources/arrow_csv.py, StrictStream):
 *    every quote either opens a field (after a delimiter, a line end or a closing quote) or
 *    closes one (before a quote, a delimiter or a line end).
 * 3. Where a CSV file can be cut into byte ranges for ``--jobs`` (sources/csv.py, find_cuts):
 *    line ends outside quotes, found 64 bytes at a time. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the kernel reads items as little-endian words; setup.py builds it only on little-endian machines"
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const uint64_t M = 0xc6a4a7935bd1e995ULL;
static const int R = 47;
enum { GROUP = 16, MAX_HASHES = 64, REDISBLOOM = 0, BITMAP = 1 };

static uint64_t murmur64a(const uint8_t *data, size_t len, uint64_t seed) {
    uint64_t h = seed ^ (len * M);
    const uint8_t *end = data + (len / 8) * 8;
    for (const uint8_t *p = data; p != end; p += 8) {
        uint64_t k;
        memcpy(&k, p, 8); /* little-endian machines only: setup.py builds the kernel there */
        k *= M;
        k ^= k >> R;
        k *= M;
        h ^= k;
        h *= M;
    }
    switch (len & 7) {
    case 7: h ^= (uint64_t)end[6] << 48; /* fall through */
    case 6: h ^= (uint64_t)end[5] << 40; /* fall through */
    case 5: h ^= (uint64_t)end[4] << 32; /* fall through */
    case 4: h ^= (uint64_t)end[3] << 24; /* fall through */
    case 3: h ^= (uint64_t)end[2] << 16; /* fall through */
    case 2: h ^= (uint64_t)end[1] << 8;  /* fall through */
    case 1: h ^= (uint64_t)end[0]; h *= M;
    }
    h ^= h >> R;
    h *= M;
    h ^= h >> R;
    return h;
}

/* SHA-1 (FIPS 180-4), enough of it for short items: the bitmap scheme needs its first 12 bytes. */
#define ROL(x, n) (((x) << (n)) | ((x) >> (32 - (n))))

static void sha1_block(uint32_t st[5], const uint8_t *block) {
    uint32_t w[80];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 | (uint32_t)block[4 * i + 2] << 8 |
               (uint32_t)block[4 * i + 3];
    for (int i = 16; i < 80; i++) w[i] = ROL(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = st[0], b = st[1], c = st[2], d = st[3], e = st[4];
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) { f = (b & c) | (~b & d); k = 0x5a827999; }
        else if (i < 40) { f = b ^ c ^ d; k = 0x6ed9eba1; }
        else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8f1bbcdc; }
        else { f = b ^ c ^ d; k = 0xca62c1d6; }
        uint32_t t = ROL(a, 5) + f + e + k + w[i];
        e = d; d = c; c = ROL(b, 30); b = a; a = t;
    }
    st[0] += a; st[1] += b; st[2] += c; st[3] += d; st[4] += e;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHA_NI_CODE 1

/* The same block with the processor's SHA instructions (Intel's published sequence: four rounds
 * per sha1rnds4, the message schedule by sha1msg1/sha1msg2), several times faster where the
 * processor has them; chosen at import by CPUID, checked by the tests against hashlib. */
/* Rounds 16 to 79, four at a time: ``cur`` (the message words of these rounds) goes into ``ein``,
 * ``next``'s schedule is finished, ``prev``'s begun and ``cur`` folded into ``far``; ``f`` picks
 * the round function. The last groups compute a few words no later round reads. */
#define SHA1_FOUR(ein, eout, cur, next, far, prev, f) \
    ein = _mm_sha1nexte_epu32(ein, cur);             \
    eout = abcd;                                      \
    next = _mm_sha1msg2_epu32(next, cur);            \
    abcd = _mm_sha1rnds4_epu32(abcd, ein, f);         \
    prev = _mm_sha1msg1_epu32(prev, cur);            \
    far = _mm_xor_si128(far, cur);

__attribute__((target("sha,sse4.1,ssse3")))
static void sha1_block_ni(uint32_t st[5], const uint8_t *block) {
    const __m128i mask = _mm_set_epi64x(0x0001020304050607ULL, 0x08090a0b0c0d0e0fULL);
    __m128i abcd = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)st), 0x1B);
    __m128i e0 = _mm_set_epi32((int)st[4], 0, 0, 0), e1;
    const __m128i abcd_save = abcd, e0_save = e0;
    __m128i msg0, msg1, msg2, msg3;
    msg0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(block + 0)), mask);
    e0 = _mm_add_epi32(e0, msg0);
    e1 = abcd;
    abcd = _mm_sha1rnds4_epu32(abcd, e0, 0);
    msg1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(block + 16)), mask);
    e1 = _mm_sha1nexte_epu32(e1, msg1);
    e0 = abcd;
    abcd = _mm_sha1rnds4_epu32(abcd, e1, 0);
    msg0 = _mm_sha1msg1_epu32(msg0, msg1);
    msg2 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(block + 32)), mask);
    e0 = _mm_sha1nexte_epu32(e0, msg2);
    e1 = abcd;
    abcd = _mm_sha1rnds4_epu32(abcd, e0, 0);
    msg1 = _mm_sha1msg1_epu32(msg1, msg2);
    msg0 = _mm_xor_si128(msg0, msg2);
    msg3 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(block + 48)), mask);
    e1 = _mm_sha1nexte_epu32(e1, msg3);
    e0 = abcd;
    msg0 = _mm_sha1msg2_epu32(msg0, msg3);
    abcd = _mm_sha1rnds4_epu32(abcd, e1, 0);
    msg2 = _mm_sha1msg1_epu32(msg2, msg3);
    msg1 = _mm_xor_si128(msg1, msg3);
    SHA1_FOUR(e0, e1, msg0, msg1, msg2, msg3, 0);
    SHA1_FOUR(e1, e0, msg1, msg2, msg3, msg0, 1);
    SHA1_FOUR(e0, e1, msg2, msg3, msg0, msg1, 1);
    SHA1_FOUR(e1, e0, msg3, msg0, msg1, msg2, 1);
    SHA1_FOUR(e0, e1, msg0, msg1, msg2, msg3, 1);
    SHA1_FOUR(e1, e0, msg1, msg2, msg3, msg0, 1);
    SHA1_FOUR(e0, e1, msg2, msg3, msg0, msg1, 2);
    SHA1_FOUR(e1, e0, msg3, msg0, msg1, msg2, 2);
    SHA1_FOUR(e0, e1, msg0, msg1, msg2, msg3, 2);
    SHA1_FOUR(e1, e0, msg1, msg2, msg3, msg0, 2);
    SHA1_FOUR(e0, e1, msg2, msg3, msg0, msg1, 2);
    SHA1_FOUR(e1, e0, msg3, msg0, msg1, msg2, 3);
    SHA1_FOUR(e0, e1, msg0, msg1, msg2, msg3, 3);
    SHA1_FOUR(e1, e0, msg1, msg2, msg3, msg0, 3);
    SHA1_FOUR(e0, e1, msg2, msg3, msg0, msg1, 3);
    SHA1_FOUR(e1, e0, msg3, msg0, msg1, msg2, 3);
    e0 = _mm_sha1nexte_epu32(e0, e0_save);
    abcd = _mm_add_epi32(abcd, abcd_save);
    _mm_storeu_si128((__m128i *)st, _mm_shuffle_epi32(abcd, 0x1B));
    st[4] = (uint32_t)_mm_extract_epi32(e0, 3);
}

static int cpu_has_sha_ni(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 19)) || !(c & (1u << 9))) return 0; /* SSE4.1, SSSE3 */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 29) & 1; /* SHA */
}
#else
static int cpu_has_sha_ni(void) { return 0; }
#endif

typedef void (*block_fn)(uint32_t st[5], const uint8_t *block);
static block_fn best_block = sha1_block;

static void sha1_halves(block_fn block, const uint8_t *data, size_t len, uint64_t *h1, uint64_t *h2) {
    uint32_t st[5] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476, 0xc3d2e1f0};
    size_t whole = len / 64 * 64;
    for (size_t at = 0; at < whole; at += 64) block(st, data + at);
    uint8_t last[128] = {0};
    size_t rest = len - whole, padded = rest < 56 ? 64 : 128;
    memcpy(last, data + whole, rest);
    last[rest] = 0x80;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++) last[padded - 1 - i] = (uint8_t)(bits >> (8 * i));
    block(st, last);
    if (padded == 128) block(st, last + 64);
    /* digest bytes 0..5 and 6..11, read big-endian */
    *h1 = (uint64_t)st[0] << 16 | st[1] >> 16;
    *h2 = (uint64_t)(st[1] & 0xffff) << 32 | st[2];
}

/* The items of a batch: its buffers, checked once before the GIL is let go. */
typedef struct {
    Py_buffer data, offsets, bits;
    Py_ssize_t n;  /* items */
    int wide;      /* int64 offsets (else int32) */
} Batch;

static int64_t offset_at(const Batch *b, Py_ssize_t i) {
    if (b->wide) {
        int64_t v;
        memcpy(&v, (const char *)b->offsets.buf + 8 * i, 8);
        return v;
    }
    int32_t v;
    memcpy(&v, (const char *)b->offsets.buf + 4 * i, 4);
    return v;
}

static void release(Batch *b) {
    PyBuffer_Release(&b->data);
    PyBuffer_Release(&b->offsets);
    PyBuffer_Release(&b->bits);
}

/* Parse (data, offsets, offset width, bits, nbits, hashes) and check the sizes; the offsets
 * themselves are checked by valid(), without the GIL, before any bit is set. */
static int parse(PyObject *args, Batch *b, uint64_t *nbits, long *hashes) {
    unsigned long long m;
    int width;
    memset(b, 0, sizeof(*b));
    if (!PyArg_ParseTuple(args, "y*y*iw*Kl", &b->data, &b->offsets, &width, &b->bits, &m, hashes)) return -1;
    *nbits = m;
    const char *why = NULL;
    if ((width != 4 && width != 8) || b->offsets.len % width || b->offsets.len < width)
        why = "offsets must be int32 or int64 (width 4 or 8), one more than the items";
    else if (m == 0 || m > (uint64_t)b->bits.len * 8)
        why = "the bit count must be at least 1 and fit the bit array";
    else if (*hashes < 1 || *hashes > 1 << 20)
        why = "the hash count must be between 1 and 2**20";
    if (why != NULL) {
        release(b);
        PyErr_SetString(PyExc_ValueError, why);
        return -1;
    }
    b->wide = width == 8;
    b->n = b->offsets.len / width - 1;
    return 0;
}

/* Every item lies in the data: a wrong buffer is a ValueError, never a read outside it. */
static int valid(const Batch *b) {
    int64_t previous = offset_at(b, 0);
    if (previous < 0) return 0;
    for (Py_ssize_t i = 1; i <= b->n; i++) {
        int64_t next = offset_at(b, i);
        if (next < previous || next > (int64_t)b->data.len) return 0;
        previous = next;
    }
    return 1;
}

static PyObject *invalid(Batch *b) {
    release(b);
    PyErr_SetString(PyExc_ValueError, "offsets must grow from 0 or more and stay within the data");
    return NULL;
}

/* Items are worked GROUP at a time: every position of the group is computed and its byte
 * prefetched, then the bits are tested and set in the items' order, so the count stays the
 * server's while the memory reads of a large filter overlap instead of waiting one by one. */

/* An item's first position and step, by its scheme. */
static void start_and_step(int scheme, block_fn block, const uint8_t *item, size_t len, uint64_t m, uint64_t *base,
                           uint64_t *step) {
    if (scheme == REDISBLOOM) {
        *base = murmur64a(item, len, M);
        *step = murmur64a(item, len, *base);
        return;
    }
    sha1_halves(block, item, len, base, step);
    *base %= m;
    *step %= m;
    if (*step == 0) *step = 1;
}

static int test_and_set(uint8_t *bits, uint64_t x, int scheme) {
    uint8_t mask = (uint8_t)(scheme == REDISBLOOM ? 1u << (x & 7) : 0x80u >> (x & 7));
    if (bits[x >> 3] & mask) return 0;
    bits[x >> 3] |= mask;
    return 1;
}

/* Filters of more than MAX_HASHES hashes (error rates below about 1e-19): one item at a time,
 * no prefetch; the same bits and count. */
static Py_ssize_t add_each(const Batch *b, int scheme, block_fn block, uint8_t *bits, uint64_t m, long hashes) {
    const uint8_t *data = b->data.buf;
    Py_ssize_t fresh = 0;
    for (Py_ssize_t i = 0; i < b->n; i++) {
        int64_t start = offset_at(b, i), end = offset_at(b, i + 1);
        uint64_t base, step;
        int unset = 0;
        start_and_step(scheme, block, data + start, (size_t)(end - start), m, &base, &step);
        for (long j = 0; j < hashes; j++) unset |= test_and_set(bits, (base + (uint64_t)j * step) % m, scheme);
        fresh += unset;
    }
    return fresh;
}

static Py_ssize_t add_all(const Batch *b, int scheme, block_fn block, uint8_t *bits, uint64_t m, long hashes) {
    if (hashes > MAX_HASHES) return add_each(b, scheme, block, bits, m, hashes);
    uint64_t pos[GROUP][MAX_HASHES];
    const uint8_t *data = b->data.buf;
    Py_ssize_t fresh = 0;
    for (Py_ssize_t first = 0; first < b->n; first += GROUP) {
        Py_ssize_t count = b->n - first < GROUP ? b->n - first : GROUP;
        for (Py_ssize_t g = 0; g < count; g++) {
            int64_t start = offset_at(b, first + g), end = offset_at(b, first + g + 1);
            uint64_t base, step;
            start_and_step(scheme, block, data + start, (size_t)(end - start), m, &base, &step);
            for (long j = 0; j < hashes; j++) pos[g][j] = (base + (uint64_t)j * step) % m;
            for (long j = 0; j < hashes; j++) __builtin_prefetch(bits + (pos[g][j] >> 3), 1);
        }
        for (Py_ssize_t g = 0; g < count; g++) {
            int unset = 0;
            for (long j = 0; j < hashes; j++) unset |= test_and_set(bits, pos[g][j], scheme);
            fresh += unset;
        }
    }
    return fresh;
}

static PyObject *add(PyObject *args, int scheme) {
    Batch b;
    uint64_t m;
    long hashes;
    if (parse(args, &b, &m, &hashes) < 0) return NULL;
    Py_ssize_t fresh = 0;
    int ok;
    block_fn block = best_block;
    Py_BEGIN_ALLOW_THREADS
    ok = valid(&b);
    if (ok) fresh = add_all(&b, scheme, block, b.bits.buf, m, hashes);
    Py_END_ALLOW_THREADS
    if (!ok) return invalid(&b);
    release(&b);
    return PyLong_FromSsize_t(fresh);
}

static PyObject *redisbloom_add(PyObject *self, PyObject *args) {
    (void)self;
    return add(args, REDISBLOOM);
}

static PyObject *bitmap_add(PyObject *self, PyObject *args) {
    (void)self;
    return add(args, BITMAP);
}

/* Which SHA-1 code the bitmap scheme uses: "ni" (the processor's SHA instructions) or
 * "portable"; use_sha1("portable") or use_sha1("ni") switches it, so that the tests check both. */
static PyObject *sha1_code(PyObject *self, PyObject *args) {
    (void)self;
    const char *wanted = NULL;
    if (!PyArg_ParseTuple(args, "|s", &wanted)) return NULL;
    if (wanted != NULL) {
        if (strcmp(wanted, "portable") == 0) best_block = sha1_block;
#ifdef HAVE_SHA_NI_CODE
        else if (strcmp(wanted, "ni") == 0 && cpu_has_sha_ni()) best_block = sha1_block_ni;
#endif
        else {
            PyErr_Format(PyExc_ValueError, "no SHA-1 code %s here", wanted);
            return NULL;
        }
    }
#ifdef HAVE_SHA_NI_CODE
    if (best_block == sha1_block_ni) return PyUnicode_FromString("ni");
#endif
    return PyUnicode_FromString("portable");
}

/* csv_quotes(chunk, delimiter, quotes, previous, pending_close) -> (problem, quotes, pending_close)
 *
 * Checks the quotes of one chunk of a CSV stream, in order, as StrictStream._check_quotes does:
 * ``quotes`` counts the quotes before this chunk (an even count: the next one opens a field),
 * ``previous`` is the byte before the chunk, ``pending_close`` says the chunk before ended with
 * a closing quote. ``problem`` is 0, 1 (a quote inside an unquoted field) or 2 (a closing quote
 * followed by text). */
static PyObject *csv_quotes(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer chunk;
    int delimiter, previous, pending;
    unsigned long long quotes;
    if (!PyArg_ParseTuple(args, "y*iKip", &chunk, &delimiter, &quotes, &previous, &pending)) return NULL;
    const uint8_t *data = chunk.buf, *end = data + chunk.len;
    int problem = 0;
    Py_BEGIN_ALLOW_THREADS
    if (pending && chunk.len > 0) {
        uint8_t next = data[0];
        if (next != '"' && next != delimiter && next != '\n' && next != '\r') problem = 2;
        pending = 0;
    }
    const uint8_t *at = data;
    while (!problem && (at = memchr(at, '"', (size_t)(end - at))) != NULL) {
        if ((quotes & 1) == 0) {
            uint8_t before = at > data ? at[-1] : (uint8_t)previous;
            if (before != delimiter && before != '\n' && before != '\r' && before != '"') problem = 1;
        } else if (at + 1 < end) {
            uint8_t after = at[1];
            if (after != '"' && after != delimiter && after != '\n' && after != '\r') problem = 2;
        } else {
            pending = 1; /* the byte after it comes with the next chunk */
        }
        quotes++;
        at++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&chunk);
    return Py_BuildValue("iKO", problem, quotes, pending ? Py_True : Py_False);
}

/* is_ascii(buffer) -> whether every byte is below 0x80 (the UTF-8 check's fast path). */
static PyObject *is_ascii(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    const uint8_t *data = view.buf;
    uint8_t seen = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < view.len; i++) seen |= data[i];
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyBool_FromLong(seen < 0x80);
}

/* csv_cuts(data, delimiter, targets, stop) -> (cuts, lines, problem, safe, safe_lines, non_ascii)
 *
 * Where a CSV file may be cut into byte ranges that jobs read on their own (sources/csv.py,
 * ``scan_cuts``, whose numpy code is the reference). A cut is the position after a \n outside
 * quoted fields (an even count of quotes before it), not followed by a UTF-8 signature; for
 * each target (ascending) the first cut at or after it, with the line breaks before it (\n,
 * \r\n and a lone \r each end a line, as bytes.splitlines counts them). Cuts are safe only up to
 * the first quote that strict CSV refuses (as csv_quotes judges it) or ``stop``: a cut is never
 * past that ``problem``. When the scan ends there with targets left, ``problem`` is its position,
 * ``safe`` the last cut before it (0 when none) and ``safe_lines`` its line breaks; otherwise
 * problem is -1 and safe 0. ``non_ascii`` is the first byte >= 0x80 before the last cut found
 * (or before the problem, or the end), -1 when none.
 *
 * The file is read 64 bytes at a time as bit masks (SSE2): the quote mask's prefix XOR says
 * which bytes are inside quotes, as in simdjson's scanner. A large file is read as fast as
 * memory delivers it. */
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

enum { SCAN = 64 };

typedef struct {
    uint64_t quote, newline, cr, special, high; /* special: a quote, \n, \r or the delimiter */
} Masks;

typedef struct {
    const uint8_t *data;
    size_t len, stop, count, found, lines, safe, safe_lines, end;
    const size_t *targets;
    size_t *cuts, *cut_lines;
    long long problem, non_ascii;
    uint64_t odd, previous_special;
    uint8_t delimiter;
} CutScan;

/* The bytes after the file's last ones: zeros, which match nothing but a zero delimiter (masked). */
static const uint8_t *padded(const uint8_t *p, size_t n, uint8_t pad[SCAN]) {
    if (n == SCAN) return p;
    memset(pad, 0, SCAN);
    memcpy(pad, p, n);
    return pad;
}

static void classify(const uint8_t *p, size_t n, uint8_t delimiter, Masks *m) {
    uint8_t pad[SCAN];
    p = padded(p, n, pad);
    memset(m, 0, sizeof *m);
#if defined(__SSE2__)
    const __m128i q = _mm_set1_epi8('"'), nl = _mm_set1_epi8('\n'), cr = _mm_set1_epi8('\r');
    const __m128i d = _mm_set1_epi8((char)delimiter);
    __m128i any_cr = _mm_setzero_si128(), any_high = _mm_setzero_si128();
    __m128i v[SCAN / 16], c[SCAN / 16];
    for (int i = 0; i < SCAN / 16; i++) {
        v[i] = _mm_loadu_si128((const __m128i *)(p + 16 * i));
        __m128i isq = _mm_cmpeq_epi8(v[i], q), isn = _mm_cmpeq_epi8(v[i], nl);
        c[i] = _mm_cmpeq_epi8(v[i], cr);
        __m128i special = _mm_or_si128(_mm_or_si128(isq, isn), _mm_or_si128(c[i], _mm_cmpeq_epi8(v[i], d)));
        m->quote |= (uint64_t)(uint16_t)_mm_movemask_epi8(isq) << (16 * i);
        m->newline |= (uint64_t)(uint16_t)_mm_movemask_epi8(isn) << (16 * i);
        m->special |= (uint64_t)(uint16_t)_mm_movemask_epi8(special) << (16 * i);
        any_cr = _mm_or_si128(any_cr, c[i]);
        any_high = _mm_or_si128(any_high, v[i]);
    }
    if (_mm_movemask_epi8(any_cr))
        for (int i = 0; i < SCAN / 16; i++) m->cr |= (uint64_t)(uint16_t)_mm_movemask_epi8(c[i]) << (16 * i);
    if (_mm_movemask_epi8(any_high))
        for (int i = 0; i < SCAN / 16; i++) m->high |= (uint64_t)(uint16_t)_mm_movemask_epi8(v[i]) << (16 * i);
#else
    for (int i = 0; i < SCAN; i++) {
        uint64_t bit = (uint64_t)1 << i;
        if (p[i] == '"') m->quote |= bit;
        if (p[i] == '\n') m->newline |= bit;
        if (p[i] == '\r') m->cr |= bit;
        if (p[i] == '"' || p[i] == '\n' || p[i] == '\r' || p[i] == delimiter) m->special |= bit;
        if (p[i] >= 0x80) m->high |= bit;
    }
#endif
}

static uint64_t prefix_xor(uint64_t x) { /* bit i: the XOR of bits 0..i */
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    return x;
}

static uint64_t upto(int pos) { /* bits 0..pos */
    return pos >= 63 ? ~(uint64_t)0 : ((uint64_t)1 << (pos + 1)) - 1;
}

static int signature_at(const uint8_t *data, size_t len, size_t p) {
    return p + 3 <= len && data[p] == 0xEF && data[p + 1] == 0xBB && data[p + 2] == 0xBF;
}

/* One block of 64 bytes (n of them in the file) at ``base``: returns 1 when the scan is over. */
static int scan_block(CutScan *s, const Masks *m, size_t base, size_t n) {
    const uint8_t *data = s->data;
    int next_special = 1, next_newline = 0; /* past the end: a closing quote may end the file */
    if (base + n < s->len) {
        uint8_t next = data[base + n];
        next_special = next == '"' || next == '\n' || next == '\r' || next == s->delimiter;
        next_newline = next == '\n';
    }
    uint64_t valid = n == SCAN ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
    uint64_t quote = m->quote & valid, newline = m->newline & valid, special = m->special & valid;
    uint64_t inside = prefix_xor(quote) ^ (s->odd ? ~(uint64_t)0 : 0);
    uint64_t before_ok = (special << 1) | s->previous_special;
    uint64_t after_ok = (special >> 1) | ((uint64_t)next_special << (n - 1));
    uint64_t bad = quote & ((inside & ~before_ok) | (~inside & ~after_ok));
    uint64_t breaks = newline;
    if (m->cr) breaks |= m->cr & valid & ~((newline >> 1) | ((uint64_t)next_newline << (n - 1)));
    uint64_t allowed = newline & ~inside;
    size_t limit = SIZE_MAX; /* cuts up to here are safe */
    if (bad) limit = base + (size_t)__builtin_ctzll(bad);
    if (s->stop >= base && s->stop < base + n && s->stop < limit) limit = s->stop;
    if (limit != SIZE_MAX) allowed &= limit > base ? upto((int)(limit - base) - 1) : 0;
    while (s->found < s->count && s->targets[s->found] <= base + n) {
        size_t t = s->targets[s->found];
        uint64_t candidates = allowed;
        if (t > base + 1) candidates &= ~upto((int)(t - base) - 2); /* cut = pos + 1 >= t */
        while (candidates && signature_at(data, s->len, base + (size_t)__builtin_ctzll(candidates) + 1))
            candidates &= candidates - 1;
        if (!candidates) break;
        int pos = __builtin_ctzll(candidates);
        s->cuts[s->found] = base + (size_t)pos + 1;
        s->cut_lines[s->found] = s->lines + (size_t)__builtin_popcountll(breaks & upto(pos));
        s->found++;
    }
    for (uint64_t last = allowed; last;) {
        int pos = 63 - __builtin_clzll(last);
        if (!signature_at(data, s->len, base + (size_t)pos + 1)) {
            s->safe = base + (size_t)pos + 1;
            s->safe_lines = s->lines + (size_t)__builtin_popcountll(breaks & upto(pos));
            break;
        }
        last &= ~((uint64_t)1 << pos);
    }
    uint64_t high = m->high & valid;
    if (high && s->non_ascii < 0) s->non_ascii = (long long)(base + (size_t)__builtin_ctzll(high));
    if (s->found == s->count) {
        s->end = s->count ? s->cuts[s->count - 1] : 0;
        return 1;
    }
    if (limit != SIZE_MAX) {
        s->problem = (long long)limit;
        s->end = limit;
        return 1;
    }
    s->lines += (size_t)__builtin_popcountll(breaks);
    s->odd = (inside >> (n - 1)) & 1;
    s->previous_special = (special >> (n - 1)) & 1;
    return 0;
}

static void scan(CutScan *s) {
    for (size_t base = 0; base < s->len && s->found < s->count; base += SCAN) {
        size_t n = s->len - base < SCAN ? s->len - base : SCAN;
        Masks m;
        classify(s->data + base, n, s->delimiter, &m);
        if (scan_block(s, &m, base, n)) break;
    }
}

/* csv_cuts' targets, checked: ascending offsets within the data (NULL, an error set, otherwise). */
static size_t *read_targets(PyObject *seq, size_t len) {
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    size_t *targets = PyMem_Malloc(sizeof(size_t) * (size_t)(count ? count : 1));
    if (targets == NULL) return (size_t *)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t t = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if (t == -1 && PyErr_Occurred()) break;
        if (t < 0 || (size_t)t > len || (i > 0 && (size_t)t < targets[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "targets must ascend within the data");
            break;
        }
        targets[i] = (size_t)t;
    }
    if (!PyErr_Occurred()) return targets;
    PyMem_Free(targets);
    return NULL;
}

static PyObject *cut_result(CutScan *s) {
    if (s->count == 0) s->end = 0;
    if (s->non_ascii >= (long long)s->end) s->non_ascii = -1;
    if (s->problem < 0) s->safe = s->safe_lines = 0;
    PyObject *cuts = PyList_New((Py_ssize_t)s->found), *lines = PyList_New((Py_ssize_t)s->found), *result = NULL;
    if (cuts != NULL && lines != NULL) {
        for (size_t i = 0; i < s->found; i++) {
            PyList_SET_ITEM(cuts, (Py_ssize_t)i, PyLong_FromSize_t(s->cuts[i]));
            PyList_SET_ITEM(lines, (Py_ssize_t)i, PyLong_FromSize_t(s->cut_lines[i]));
        }
        result = Py_BuildValue("OOLnnL", cuts, lines, s->problem, (Py_ssize_t)s->safe, (Py_ssize_t)s->safe_lines,
                               s->non_ascii);
    }
    Py_XDECREF(cuts);
    Py_XDECREF(lines);
    return result;
}

static PyObject *csv_cuts(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    int delimiter;
    PyObject *targets_obj;
    Py_ssize_t stop;
    if (!PyArg_ParseTuple(args, "y*iOn", &view, &delimiter, &targets_obj, &stop)) return NULL;
    if (stop < 0 || delimiter < 0 || delimiter > 255) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "stop must be an offset and delimiter a byte");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(targets_obj, "targets must be a sequence of offsets");
    size_t count = seq != NULL ? (size_t)PySequence_Fast_GET_SIZE(seq) : 0, room = sizeof(size_t) * (count ? count : 1);
    size_t *targets = seq != NULL ? read_targets(seq, (size_t)view.len) : NULL;
    size_t *cuts = targets != NULL ? PyMem_Malloc(room) : NULL, *cut_lines = cuts != NULL ? PyMem_Malloc(room) : NULL;
    PyObject *result = NULL;
    if (cut_lines != NULL) { /* previous_special 1: the file starts as after a line end */
        CutScan s = {view.buf, (size_t)view.len, (size_t)stop, count, 0, 0, 0, 0, (size_t)view.len, targets, cuts,
                     cut_lines, -1, -1, 0, 1, (uint8_t)delimiter};
        Py_BEGIN_ALLOW_THREADS
        scan(&s);
        Py_END_ALLOW_THREADS
        result = cut_result(&s);
    } else if (!PyErr_Occurred()) {
        PyErr_NoMemory();
    }
    PyMem_Free(targets), PyMem_Free(cuts), PyMem_Free(cut_lines);
    Py_XDECREF(seq);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"redisbloom_add", redisbloom_add, METH_VARARGS,
     "redisbloom_add(data, offsets, width, bits, nbits, hashes) -> items that set a new bit\n\n"
     "Set the RedisBloom bits of every item, in order; bits is a writable byte array."},
    {"bitmap_add", bitmap_add, METH_VARARGS,
     "bitmap_add(data, offsets, width, bits, nbits, hashes) -> items that set a new bit\n\n"
     "Set the bitmap backend's scheme-1 bits of every item, in order."},
    {"csv_quotes", csv_quotes, METH_VARARGS,
     "csv_quotes(chunk, delimiter, quotes, previous, pending_close) -> (problem, quotes, pending_close)"},
    {"is_ascii", is_ascii, METH_VARARGS, "is_ascii(buffer) -> whether every byte is below 0x80"},
    {"csv_cuts", csv_cuts, METH_VARARGS,
     "csv_cuts(data, delimiter, targets, stop) -> (cuts, lines, problem, safe, safe_lines, non_ascii)"},
    {"sha1_code", sha1_code, METH_VARARGS,
     "sha1_code([\"portable\" | \"ni\"]) -> the SHA-1 code the bitmap scheme uses (after switching it)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "bloomctl's native kernel (see _native.c).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
#ifdef HAVE_SHA_NI_CODE
    if (cpu_has_sha_ni()) best_block = sha1_block_ni;
#endif
    return PyModule_Create(&module);
}
