#!/usr/bin/env python3
"""The dynamic symbols the library exports must be exactly the functions the public header declares."""
import re
import subprocess
import sys

nm, library, header = sys.argv[1:4]
declared = set(re.findall(r"LBOPT_API\s+[^;(]*?\b(lbopt_\w+)\s*\(", open(header, encoding="utf-8").read()))
out = subprocess.run([nm, "-D", "--defined-only", library], check=True, capture_output=True, text=True).stdout
exported = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()[-2:-1] != ["A"]}
exported.discard("")
missing, extra = sorted(declared - exported), sorted(exported - declared)
print(f"{len(declared)} declared, {len(exported)} exported")
if missing or extra or not declared:
    print("declared but not exported:", missing)
    print("exported but not declared:", extra)
    sys.exit(1)
