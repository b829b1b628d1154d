"""The client build's bit setting alone, native kernel against numpy, in one process.

    python benchmarks/build_kernel.py [--items 5000000] [--rounds 3]

The same N distinct emails (one Arrow array, as the CSV and Parquet readers give them), the same
layouts as a rebuild of capacity 2N at 1% plans (RedisBloom: one link; bitmap: format 1), built
in batches of 65,536 items by each kernel in turn, rounds interleaved. Prints seconds, items/s
and the kernel's speed over numpy's (medians), and checks both give the same bits and count.
No server is involved: this is the client's CPU work, which the whole-command benchmark
(rebuild_throughput.py) puts beside reading, uploading and the server's share.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from bloomctl import native as kernel
from bloomctl.rebuild.build import bitmap, redisbloom
from bloomctl.rebuild.build.bits import BitArray
from bloomctl.rebuild.build.items import buffers
from bloomctl.sizing.bloom import plan

BATCH = 65_536


def layouts(n: int) -> dict[str, tuple[object, object]]:
    """RedisBloom's one link and the bitmap format's bits for capacity 2n at 1%."""
    link = plan(2 * n, 0.01, expansion=None).first
    rb = redisbloom.Layout(b"", link.bytes, link.bits, link.hashes, link.capacity, True)
    m = (link.bits + 63) // 64 * 64
    return {"redisbloom": (redisbloom, rb), "bitmap": (bitmap, bitmap.Layout(m // 8, m, link.hashes, 2 * n))}


def with_numpy(scheme, layout, batches: list[pa.Array]) -> tuple[float, BitArray]:
    start = time.perf_counter()
    array = BitArray(layout.nbytes, msb_first=scheme is bitmap)
    for batch in batches:
        array.add(scheme.positions(layout, batch))
    return time.perf_counter() - start, array


def with_kernel(native, scheme, layout, batches: list[pa.Array]) -> tuple[float, np.ndarray, int]:
    start = time.perf_counter()
    bits, count = np.zeros(layout.nbytes, dtype=np.uint8), 0
    for batch in batches:
        data, offsets = buffers(batch)
        count += scheme.native_add(native, layout, bits, data, offsets)
    return time.perf_counter() - start, bits, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=5_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    native = kernel.native()
    if native is None:
        sys.exit("the native kernel is not built here: pip install -e . with a C compiler")
    n = args.items
    items = pa.array([f"user{i}@example.com" for i in range(n)], type=pa.string())
    batches = [items.slice(start, BATCH) for start in range(0, n, BATCH)]
    print(f"{n:,} emails, capacity {2 * n:,} at 1%, batches of {BATCH:,}; medians of {args.rounds} rounds\n")
    print("| backend | numpy s | kernel s | numpy items/s | kernel items/s | kernel / numpy |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, (scheme, layout) in layouts(n).items():
        slow, fast = [], []
        for _ in range(args.rounds):
            seconds, array = with_numpy(scheme, layout, batches)
            slow.append(seconds)
            seconds, bits, count = with_kernel(native, scheme, layout, batches)
            fast.append(seconds)
            if count != array.count or not np.array_equal(bits, array.data):
                sys.exit(f"{name}: the kernel's bits or count differ from numpy's")
        a, b = statistics.median(slow), statistics.median(fast)
        print(f"| {name} | {a:.2f} | {b:.2f} | {n / a:,.0f} | {n / b:,.0f} | {a / b:.1f}x |")


if __name__ == "__main__":
    main()
