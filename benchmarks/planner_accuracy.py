"""The planner against published training runs, as markdown tables (not a test).

    python benchmarks/planner_accuracy.py [--all] [--by-source] [--fit] [--prospective FILE ...]
    python benchmarks/planner_accuracy.py --bands-module > fstrain/core/plan/fittedbands.py

Plans every expressible run in tests/fixtures/planner/measured/ with all knobs pinned and prints
the figures in sample (the shipped constants, fitted on every source) and leave one source out
(each source predicted by constants re-fitted without it: the headline), then the error table
of each, measured vs predicted memory and tokens/s/GPU with the fit verdicts (the same
evaluation tests/unit/test_planner_accuracy.py asserts on), the error bands per class with their
held-out coverage (tests/unit/test_planner_bands.py), and the calibration sources.
``--all`` also lists the runs the planner cannot express yet, with the reason; ``--by-source``
a summary with one row per source file; ``--fit`` the constants fitted on every source (what
fstrain/core/plan/fitted.py must hold) and on each leave-one-out fold. ``--bands-module`` prints
only the text of fstrain/core/plan/fittedbands.py (the bands the harness learns), nothing else.
``--prospective FILE ...``
prints only the named source files' figures, per file and together: planned with the constants
fitted on every other source (before anything is fitted to them: the prospective figure; with an
unchanged model, the constants shipped before the files joined), then leave one source out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fstrain.core.plan.fit import fit_constants
from fstrain.core.plan.fitted import COMPUTE_TIME_SCALE, FRAGMENTATION_FRACTION
from tests.unit.test_planner_accuracy import (
    Case,
    calibration_sources,
    evaluate_all,
    evaluate_loso,
    evaluate_prospective,
    fit_runs,
    load_cases,
    markdown_table,
    side_by_side,
    source_table,
    summary_by_source,
)
from tests.unit.test_planner_bands import (
    bands_markdown,
    bands_module,
    coverage_by_source,
    harness_bands,
    nested_loso,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also list the runs that are not expressible")
    parser.add_argument("--by-source", action="store_true", help="also print one summary row per source file")
    parser.add_argument("--fit", action="store_true", help="also print the fitted constants, overall and per fold")
    parser.add_argument("--bands-module", action="store_true",
                        help="print only fstrain/core/plan/fittedbands.py as the harness computes it")
    parser.add_argument("--prospective", nargs="+", metavar="FILE",
                        help="only these source files (names in tests/fixtures/planner/measured/), scored "
                             "with the constants fitted without them, then leave one source out")
    args = parser.parse_args()
    cases = load_cases()
    if args.prospective:
        unknown = sorted(set(args.prospective) - {case.file for case in cases})
        if unknown:
            parser.error(f"no source file {', '.join(unknown)} in tests/fixtures/planner/measured/")
        return prospective(cases, args.prospective)
    nested = nested_loso(cases)
    bands = harness_bands(nested)
    if args.bands_module:
        print(bands_module(bands), end="")
        return 0
    outcomes = evaluate_all(cases)
    loso, folds = evaluate_loso(cases)
    print(side_by_side(outcomes, loso))
    print(f"\n### Error bands ({bands.nominal_pct} %)\n\n" + bands_markdown(bands))
    print("\n### Leave one source out\n\n" + markdown_table(loso))
    print("\n### In sample\n\n" + markdown_table(outcomes))
    print("\n### Calibration sources\n\n" + calibration_sources(cases))
    if args.all:
        print("\n| not expressible | source | why |\n|---|---|---|")
        for case in cases:
            if not case.expressible:
                why = "; ".join(case.run.get("not_expressible_because") or [])
                print(f"| {case.id} | {case.file} | {why} |")
    if args.by_source:
        print("\n### Error bands, held-out runs inside their band by source\n\n" + coverage_by_source(nested))
        print("\n### By source, leave one source out\n\n" + source_table(cases, loso))
        print("\n### By source, in sample\n\n" + source_table(cases, outcomes))
    if args.fit:
        times, memories = fit_runs(cases)
        print(f"\nfitted on every source: {fit_constants(times, memories).as_dict()}")
        for source, constants in folds.items():
            print(f"without {source}: {constants.as_dict()}")
    return 0


def prospective(cases: list[Case], files: list[str]) -> int:
    """The prospective figures of ``files``, then their leave-one-source-out figures."""
    before, constants = evaluate_prospective(cases, files)
    shipped = constants.compute_time_scale == COMPUTE_TIME_SCALE and \
        constants.fragmentation_fraction == FRAGMENTATION_FRACTION
    print(f"constants fitted without them: {constants.as_dict()} "
          f"({'equal to' if shipped else 'not'} the shipped fstrain/core/plan/fitted.py)")
    print("\n### Prospective (before fitting)\n\n" + summary_by_source(before))
    print("\n" + markdown_table(before))
    loso, _ = evaluate_loso(cases)
    print("\n### Leave one source out (after)\n\n" + summary_by_source([o for o in loso if o.case.file in files]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
