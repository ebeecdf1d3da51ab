"""The timing the Python benchmarks share: the median wall time of a callable after warm-up calls."""
import statistics
import time


def median_seconds(fn, reps, warm):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
