"""timing.py — how the Python benchmarks time a call, as bench_dit.c does (shared by
bench_dit.py and bench_gpu.py)."""

import time


def time_calls(fn, seconds, warmup_calls=3, warmup_seconds=0.2, min_calls=5, after=None):
    """Warm-up (warmup_calls calls and warmup_seconds), then fn timed call by call until `seconds`
    have passed and min_calls have run; after() (e.g. a device synchronisation) ends every call,
    inside the timing. The figure is the median call."""
    def call():
        fn()
        if after:
            after()
    w0 = time.perf_counter()
    i = 0
    while i < warmup_calls or time.perf_counter() - w0 < warmup_seconds:
        call()
        i += 1
    calls = []
    start = time.perf_counter()
    total = 0.0
    while total < seconds or len(calls) < min_calls:
        c0 = time.perf_counter()
        call()
        c1 = time.perf_counter()
        calls.append(c1 - c0)
        total = c1 - start
    calls.sort()
    n = len(calls)
    median = calls[n // 2] if n % 2 else 0.5 * (calls[n // 2 - 1] + calls[n // 2])
    return {"calls": n, "seconds": total, "median_s": median, "mean_s": total / n,
            "min_s": calls[0]}
