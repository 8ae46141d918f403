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


#: a column's name ending -> (unit family, the unit its values are in)
_UNITS = (("_per_s", ("rate", "/s")), ("_pct", ("pct", "%")), ("_ms", ("time", "ms")),
          ("_us", ("time", "µs")), ("_s", ("time", "s")), ("_bytes", ("bytes", "B")),
          ("_gb", ("plain", "GB")), ("_mb", ("plain", "MB")))
_TIME = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))
_BYTES = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))
_TO_S = {"s": 1.0, "ms": 1e-3, "µs": 1e-6}


def _finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
            and v == v and abs(v) != float("inf")]


def column_unit(name: str, values) -> tuple[str, float]:
    """(header, factor) of a results column: the name in words with its unit, the unit chosen
    so the column's median reads between 1 and 1000 (times in s, ms or µs; bytes in B to GiB).

    >>> column_unit("step_time_s", [0.012, 0.020])
    ('step time (ms)', 1000.0)
    >>> column_unit("message_bytes", [4096, 8192])
    ('message (KiB)', 0.0009765625)
    >>> column_unit("world_size", [1, 2])
    ('world size', 1.0)
    """
    for end, (family, unit) in _UNITS:
        if name.endswith(end):
            words = name[: -len(end)].replace("_", " ")
            nums = sorted(abs(v) for v in _finite(values) if v)
            mid = nums[len(nums) // 2] if nums else 0.0
            if family == "time":
                base = mid * _TO_S[unit]
                scale, shown = next(((s, u) for s, u in _TIME if base >= s), _TIME[-1])
                return f"{words} ({shown})", _TO_S[unit] / scale
            if family == "bytes":
                scale, shown = next(((s, u) for s, u in _BYTES if mid >= s), _BYTES[-1])
                return f"{words} ({shown})", 1.0 / scale
            return f"{words} ({unit})", 1.0
    return name.replace("_", " "), 1.0


def cell(v) -> str:
    """One value as a page shows it: no "nan", no scientific notation in the usual range,
    thousands separated, three significant digits.

    >>> [cell(v) for v in (float("nan"), None, 1234567.0, 12.3456, 0.0123456, 3, True, 2.5e-7)]
    ['–', '–', '1,234,567', '12.3', '0.0123', '3', 'yes', '2.5e-07']
    """
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        a = abs(v)
        if a == 0 or a == float("inf"):
            return str(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 1e-4:
            return f"{v:.3g}" if a >= 0.001 else f"{v:.2g}"
        return f"{v:.2g}"
    if isinstance(v, (dict, list, tuple)):
        return f"({len(v)} items)"
    return str(v)


def frame_html(df) -> str:
    """A DataFrame as a notebook page shows it: units in the headers (values scaled to them),
    :func:`cell`'s numbers, no index unless it means something, every text in full, and the
    whole table scrolling inside its column when it is wider than the page."""
    import html
    import numbers

    import pandas as pd

    if not isinstance(df.index, pd.RangeIndex):
        df = df.reset_index()
    heads, cols = [], []
    for name in df.columns:
        values = df[name].tolist()
        head, factor = column_unit(str(name), values)
        if factor != 1.0:
            values = [v * factor if isinstance(v, numbers.Real) and not isinstance(v, bool)
                      else v for v in values]
        heads.append(head)
        cols.append([cell(v.item() if hasattr(v, "item") else v) for v in values])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in zip(*cols))
    head = "".join(f'<th scope="col">{html.escape(h)}</th>' for h in heads)
    return (f'<div class="labkit-table" style="overflow-x:auto;max-width:100%">'
            f'<table class="dataframe"><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            "</table></div>")


def show_frames_readably() -> None:
    """In a running IPython, show every DataFrame through :func:`frame_html` (cheap, and a no-op
    outside IPython: labkit imports nothing for it)."""
    import sys

    if "IPython" not in sys.modules:
        return
    ip = sys.modules["IPython"].get_ipython()
    if ip is not None:  # DataFrame's module reads "pandas" or "pandas.core.frame" by version
        html = ip.display_formatter.formatters["text/html"]
        for module in ("pandas", "pandas.core.frame"):
            html.for_type_by_name(module, "DataFrame", frame_html)


def size_text(size_bytes: float) -> str:
    """A size as people write it (powers of 1024).

    >>> size_text(8), size_text(2048), size_text(8 << 20), size_text(795402.9)
    ('8 B', '2 KiB', '8 MiB', '777 KiB')
    """
    b = float(size_bytes)
    if b < 1024:
        return f"{b:.0f} B"
    if b < 1 << 20:
        return f"{b / 1024:.3g} KiB"
    if b < 1 << 30:
        return f"{b / (1 << 20):.3g} MiB"
    return f"{b / (1 << 30):.3g} GiB"
