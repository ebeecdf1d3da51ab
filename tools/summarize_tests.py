#!/usr/bin/env python3
"""Sums the test cases of every suite into one line: "N passed, N failed, N skipped".

Arguments: meson's testlog.json (doctest executables report their own case counts; any other test counts as one
case), JUnit XML files (pytest) and cargo test logs (*.log).
"""
import json
import re
import sys
import xml.etree.ElementTree as ET

DOCTEST = re.compile(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped")


def meson_counts(path):
    passed = failed = skipped = 0
    for line in open(path, encoding="utf-8"):
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
    return passed, failed, skipped


def junit_counts(path):
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = failed = skipped = 0
    for s in suites:
        total += int(s.get("tests", 0))
        failed += int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
    return total - failed - skipped, failed, skipped


def cargo_counts(path):
    passed = failed = skipped = 0
    text = open(path, encoding="utf-8").read()
    for p, f, i in re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", text):
        passed, failed, skipped = passed + int(p), failed + int(f), skipped + int(i)
    if "test result:" not in text:  # it did not build or run
        failed += 1
    return passed, failed, skipped


totals = [0, 0, 0]
for path in sys.argv[1:]:
    try:
        counts = (meson_counts(path) if path.endswith(".json") else cargo_counts(path) if path.endswith(".log")
                  else junit_counts(path))
    except (OSError, ET.ParseError) as e:  # a suite that produced no report failed as a whole
        print(f"{path}: {e}", file=sys.stderr)
        counts = (0, 1, 0)
    totals = [a + b for a, b in zip(totals, counts)]
print(f"{totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
