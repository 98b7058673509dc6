"""The validation suite: published training runs simulated and compared (``stepsim validate``).

* :mod:`.cases` — the case files (a scenario plus the published figure; the format is in its
  docstring), the built-in suite's folder and the metrics a case can name;
* :mod:`.run` — one case simulated and its metric read off the summary, the suite on worker
  processes;
* :mod:`.table` — error statistics overall, per chip family and per model kind (MoE or
  dense), the printed table, the CSV and the parity plot.
"""

from simulator.studies.validate.cases import (
    BOOLEAN_METRICS,
    MEMORY_METRICS,
    METRICS,
    SUITE_DIR,
    TIME_METRICS,
    Case,
    CaseResult,
    ValidationError,
    discover,
    load_case,
)
from simulator.studies.validate.run import CaseFailure, run_case, run_suite
from simulator.studies.validate.table import (
    CSV_COLUMNS,
    FAMILY_ORDER,
    KIND_ORDER,
    error_stats,
    family_stats,
    format_table,
    kind_stats,
    plot_parity,
    plot_parity_rows,
    write_csv,
)

__all__ = [
    "BOOLEAN_METRICS",
    "CSV_COLUMNS",
    "FAMILY_ORDER",
    "KIND_ORDER",
    "MEMORY_METRICS",
    "METRICS",
    "SUITE_DIR",
    "TIME_METRICS",
    "Case",
    "CaseFailure",
    "CaseResult",
    "ValidationError",
    "discover",
    "error_stats",
    "family_stats",
    "format_table",
    "kind_stats",
    "load_case",
    "plot_parity",
    "plot_parity_rows",
    "run_case",
    "run_suite",
    "write_csv",
]
