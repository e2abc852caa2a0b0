"""Run a command and report its wall time and peak resident memory (the largest child's).

python docs/bench/peak.py python scripts/export.py --target DIR --draft ngram --out OUT
"""

import resource
import subprocess
import sys
import time

start = time.perf_counter()
code = subprocess.run(sys.argv[1:]).returncode
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6  # kB -> GB
print(f"peak: {seconds:.0f} s, {peak:.2f} GB peak RSS, exit {code}", file=sys.stderr)
sys.exit(code)
