"""Boundary types of generated code, the analogue for this corpus of the script change of paper
000 Appendix B (Figures B3, B5: "a structural or language transition coincides with the
stopping point").

Legend for shapes: ``T`` tokens of one response.

The text of a response is the concatenation of its tokens' decoded pieces (a byte-level BPE:
exact for ASCII). The boundary *before* token p (between tokens p-1 and p) is typed, first rule
that applies:

1. ``indent``: token p holds a newline and the line it starts (the text after its last newline,
   read on into the following tokens) is not blank and has another indentation (leading spaces
   and tabs) than the line token p-1 ends on;
2. ``newline``: token p holds a newline (same indentation, or a blank line);
3. ``string/comment``: token p holds the opening character of a string literal (``'``, ``"``,
   ``'''``, ``\"\"\"``) or of a comment (``#``), found by a small lexer run over the whole text
   (:func:`string_comment_starts`);
4. ``ident/punct``: the last non-blank character of token p-1 and the first of token p differ in
   class, identifier (letters, digits, ``_``) against punctuation (anything else non-blank);
5. ``same``: none of these (an identifier continued, punctuation after punctuation).

A boundary next to an unknown token (-1: the prompt's last token, not recorded) is
``unknown``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["TYPES", "boundary_types", "string_comment_starts"]

TYPES = ("indent", "newline", "string/comment", "ident/punct", "same")
UNKNOWN = "unknown"


def string_comment_starts(text: str) -> np.ndarray:
    """bool [len(text)]: the characters that open a string literal or a comment.

    A lexer of Python's surface: ``#`` opens a comment to the end of the line; a quote opens a
    string closed by the same quote (three for a triple-quoted one), with backslash escapes; a
    single-quoted string left open ends at the line's end (generated text need not parse).
    """
    n = len(text)
    mark = np.zeros(n, dtype=bool)
    i, state = 0, None
    while i < n:
        ch = text[i]
        if state is None:
            if ch == "#":
                mark[i], state = True, "#"
            elif ch in "\"'":
                q = text[i : i + 3] if text[i : i + 3] in ('"""', "'''") else ch
                mark[i], state = True, q
                i += len(q)
                continue
        elif state == "#":
            if ch == "\n":
                state = None
        else:
            if ch == "\\":
                i += 2
                continue
            if text.startswith(state, i):
                i += len(state)
                state = None
                continue
            if len(state) == 1 and ch == "\n":
                state = None
        i += 1
    return mark


def _indent(text: str, start: int) -> tuple[str, bool]:
    """(leading blanks of the line starting at ``start``, whether the line is blank)."""
    j = start
    while j < len(text) and text[j] in " \t":
        j += 1
    return text[start:j], j >= len(text) or text[j] in "\r\n"


def _cls(ch: str) -> str:
    return "ident" if (ch.isalnum() or ch == "_") else "punct"


def boundary_types(tokens: np.ndarray, pieces: Sequence[str]) -> np.ndarray:
    """object [T]: the type of the boundary before each token (entry 0: ``unknown``).

    ``tokens`` [T] token ids (-1: unknown), ``pieces`` the decoded text of each id.
    """
    toks = np.asarray(tokens, dtype=np.int64)
    text_of = ["" if t < 0 else pieces[t] for t in toks]
    starts = np.concatenate([[0], np.cumsum([len(s) for s in text_of])]).astype(np.int64)
    text = "".join(text_of)
    opens = string_comment_starts(text)
    out = np.empty(len(toks), dtype=object)
    for p in range(len(toks)):
        if p == 0 or toks[p] < 0 or toks[p - 1] < 0:
            out[p] = UNKNOWN
            continue
        a, b = text_of[p - 1], text_of[p]
        lo, hi = int(starts[p]), int(starts[p + 1])
        nl = b.rfind("\n")
        if nl >= 0:
            line_start = text.rfind("\n", 0, lo) + 1  # the line token p-1 ends on
            before, _ = _indent(text, line_start)
            after, blank = _indent(text, lo + nl + 1)
            out[p] = "indent" if (not blank and after != before) else "newline"
            continue
        if opens[lo:hi].any():
            out[p] = "string/comment"
            continue
        a_s, b_s = a.rstrip(), b.lstrip()
        if a_s and b_s and _cls(a_s[-1]) != _cls(b_s[0]):
            out[p] = "ident/punct"
        else:
            out[p] = "same"
    return out
