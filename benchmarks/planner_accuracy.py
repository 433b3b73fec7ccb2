"""The planner against published training runs, as a markdown table (not a test).

    python benchmarks/planner_accuracy.py [--all] [--by-source]

Plans every expressible run in tests/fixtures/planner/measured/ with all knobs pinned and prints
measured vs predicted memory and tokens/s/GPU, the errors, the fit verdicts and the medians
(the same evaluation tests/unit/test_planner_accuracy.py asserts on). ``--all`` also lists the
runs the planner cannot express yet, with the reason; ``--by-source`` a summary with one row per
source file (its runs, the median errors and the fit verdicts over the runs it has scored).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.unit.test_planner_accuracy import evaluate_all, load_cases, markdown_table, source_table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also list the runs that are not expressible")
    parser.add_argument("--by-source", action="store_true", help="also print one summary row per source file")
    args = parser.parse_args()
    cases = load_cases()
    outcomes = evaluate_all(cases)
    print(markdown_table(outcomes))
    if args.all:
        print("\n| not expressible | source | why |\n|---|---|---|")
        for case in cases:
            if not case.expressible:
                why = "; ".join(case.run.get("not_expressible_because") or [])
                print(f"| {case.id} | {case.file} | {why} |")
    if args.by_source:
        print("\n" + source_table(cases, outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
