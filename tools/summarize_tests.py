#!/usr/bin/env python3
"""Sums the test cases of every suite in a meson test log into one line: "N passed, N failed, N skipped".

doctest executables report their own case counts; any other test counts as one case.
"""
import json
import re
import sys

DOCTEST = re.compile(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped")

passed = failed = skipped = 0
for line in open(sys.argv[1], encoding="utf-8"):
    entry = json.loads(line)
    result, out = entry["result"], entry.get("stdout", "") or ""
    counts = DOCTEST.findall(out)
    if result == "SKIP":
        skipped += 1
    elif counts:
        _, p, f, s = map(int, counts[-1])
        passed, failed, skipped = passed + p, failed + f, skipped + s
        if result != "OK" and f == 0:  # crashed or timed out after its last report
            failed += 1
    elif result == "OK":
        passed += 1
    else:
        failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
