"""Print the comparison table of runs again: held-out accuracy before/after, reward, time, tokens.

    python scripts/compare_runs.py runs/multirun/2026-12-02_19-00-00      # a whole sweep
    python scripts/compare_runs.py runs/a runs/b                           # any run directories
"""

import sys
from pathlib import Path

from rlft.sweep import format_table, run_dirs_under, summarize_run

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runs = run_dirs_under([Path(p) for p in sys.argv[1:]])
    if not runs:
        sys.exit(f"no run directories (with metrics.jsonl) under {' '.join(sys.argv[1:])}")
    print(format_table([summarize_run(r) for r in runs]))
