"""Text tables for the terminal: one printer every command uses."""

from __future__ import annotations

import json
import sys


def print_frame(df, columns=None, floatfmt: str = "{:.4g}", file=None) -> None:
    """Print a DataFrame as an aligned text table (no index), formatting floats compactly."""
    file = file or sys.stdout
    if columns is not None:
        df = df[[c for c in columns if c in df.columns]]
    if df.empty:
        print("(no rows)", file=file)
        return

    def fmt(v):
        if isinstance(v, float):
            return "-" if v != v else floatfmt.format(v)
        if isinstance(v, (dict, list)):
            return json.dumps(v)[:40]
        return str(v)

    cells = [[str(c) for c in df.columns]] + [[fmt(v) for v in row] for row in df.itertuples(index=False)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    for j, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)), file=file)
        if j == 0:
            print("  ".join("-" * w for w in widths), file=file)


def print_table(frame, legend: str | None = None) -> None:
    """A lab's table as its command prints it (three significant digits), then its legend."""
    print_frame(frame, floatfmt="{:.3g}")
    if legend:
        print(legend)
