"""Framework profiles against the measured runs that name one, as a markdown table (not a test).

    python benchmarks/framework_profiles.py

For every expressible run in tests/fixtures/planner/measured/ whose ``fstrain`` block names a
``framework`` other than fstrain's, the memory error planned with that profile and again with
fstrain's default in its place (``framework: fstrain``, ``loss: full``, everything else equal),
through the same evaluation as tests/unit/test_planner_accuracy.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.unit.test_planner_accuracy import Case, Outcome, deep_merge, evaluate, load_cases

DEFAULT = {"framework": "fstrain", "loss": "full"}


def _error(outcome: Outcome) -> str:
    if outcome.memory_error_pct is None:
        return outcome.error or "n/a"
    return f"{outcome.memory_error_pct:+.1f} %"


def main() -> int:
    print("| run | source | measured | profile, loss | with the profile | default (fstrain, loss full) |")
    print("|---|---|---|---|---|---|")
    for case in load_cases():
        framework = case.flags.get("framework", "fstrain")
        if not case.expressible or framework == "fstrain":
            continue
        default = Case(case.id, case.file, case.source, case.shapes, deep_merge(case.run, {"fstrain": DEFAULT}))
        m = case.measured
        measured = f"{m.get('memory')} {m.get('memory_unit')} ({m.get('memory_kind')})"
        print(f"| {case.id} | {case.file} | {measured} | {framework}, {case.flags.get('loss', 'full')} | "
              f"{_error(evaluate(case))} | {_error(evaluate(default))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
