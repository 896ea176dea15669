"""Text of the user's data as a terminal shows it: control characters written as escapes, columns counted as
it draws them."""
from __future__ import annotations

import re
import unicodedata

# C0 and C1 controls, DEL, and the bidirectional overrides and isolates (a caption written right to left over
# the columns after it)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with each control character as its Python escape (``\\x1b``, ``\\n``, ``\\u202e``): a caption, a
    path or a file name from the user's data, printed raw, could clear the terminal, set its title, overwrite
    the columns before it or split one line of a table in two."""
    return _CONTROL.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), text)


def shown_width(text: str) -> int:
    """The columns ``text`` takes in a terminal: two for each wide or full-width character (CJK), none for a
    combining mark; ``len`` counted a Chinese file name's characters, and the columns after it slid."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def pad(text: str, width: int, align: str = "<") -> str:
    """``text`` padded with spaces to ``width`` columns as a terminal shows them (``align``: '<' left, '>' right)."""
    fill = " " * max(0, width - shown_width(text))
    return text + fill if align == "<" else fill + text
