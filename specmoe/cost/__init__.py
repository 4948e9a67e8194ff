"""The cost model (numpy and scipy only): bytes of a pass, verify and step times, the
speculation theory (speedup condition, staircase, reuse threshold) and its error bounds.

Modules: ``bytes`` (Eqs. (2), (3), (11), (12)), ``step`` (Eqs. (5)-(7), (22)), ``theory``
(Eqs. (8)-(10), (14)-(16), (B.4), (B.31)), ``bounds`` (Table 2, Eqs. (17)-(21), (C.7)) and
``plan`` (everything combined for ``specmoe plan``). Equation numbers are those of paper 002.
"""
