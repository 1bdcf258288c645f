"""A table of text as a notebook shows it: every cell whole (pandas' own display cuts text past 50 characters with
"…"), wrapped between words, left-aligned and top-aligned, under one header row (no row of its own for an index's
name, which sits out of line with the columns).

    text_table(pd.DataFrame({"tool": ["define"], "description": ["The meaning of an English word, ..."]}))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    from pandas.io.formats.style import Styler


def text_table(table: pd.DataFrame, caption: str = "") -> Styler:
    """``table`` with its index as columns, shown whole and wrapped (a pandas Styler; ``.data`` is the table)."""
    shown = table.reset_index() if any(table.index.names) else table
    styled = (shown.style.hide(axis="index").format(escape="html")
              .set_properties(**{"text-align": "left", "white-space": "pre-wrap", "vertical-align": "top"})
              .set_table_styles([{"selector": "th", "props": [("text-align", "left")]}]))
    return styled.set_caption(caption) if caption else styled
