"""The cost model (numpy and scipy only): bytes of a pass, verify and step times, the
speculation theory (speedup condition, staircase, reuse threshold) and its error bounds.

Modules: ``bytes`` (Eqs. (2), (3), (11), (12)), ``step`` (Eqs. (5), (7), (22) and the
crossover), ``theory`` (G_a(k), Eqs. (8)-(10), (14)-(16), (B.4), (B.31), (B.36)), ``bounds``
(Table 2: Eqs. (17)-(21), (C.1), (C.7)), ``efficiency`` (paper 003's target efficiency, its
speedup by Eq. (9)) and ``plan`` (everything combined for ``specmoe plan``). Equation numbers
are those of paper 002 unless a docstring names another paper.

One definition per equation. The function that implements an equation is the only one whose
docstring's first line begins ``Eq. (N) of paper 002:`` (``Eqs. (N) and (M) of paper 002:`` for
a function that implements two); every other place that uses the equation calls that function
and cites it as "by Eq. (N)" with the function's name, e.g. "tau_p(n) by Eq. (5)
(:func:`specmoe.cost.step.verify_time`)". ``tests/test_equations.py`` scans the package source
and holds each equation to exactly one such definition, called from the package. The saving
S(n) = tau_slot(n) - tau_dedup(n) is computed as the difference of the two verify times by
Eq. (5) (:func:`specmoe.cost.step.verify_model`); Eq. (6), its closed form with f_l = 1, is an
identity the tests check, not a second computation.
"""
