"""Exact arithmetic helpers of the cost model: input checks, Fraction/float typing, and the
correctly rounded root of a polynomial on [0, 1).

A value is *exact* when it is an ``int`` or a ``Fraction``; a function that receives only exact
values computes in Fractions and returns Fractions. A float is converted to the Fraction it
equals (every double is a dyadic rational), so comparisons on floats are exact comparisons of
the given values, never of rounded intermediates.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from fractions import Fraction
from numbers import Real
from typing import Any

from specmoe.errors import InputError

Number = int | float | Fraction


def is_exact(x: Any) -> bool:
    return isinstance(x, int | Fraction) and not isinstance(x, bool)


def check_number(x: Any, name: str) -> Number:
    """A finite real number (int, float, Fraction or numpy scalar); ``InputError`` otherwise."""
    if isinstance(x, bool) or not isinstance(x, Real):
        raise InputError(f"{name}: expected a number, got {x!r}")
    if is_exact(x):
        return x
    if isinstance(x, int):  # numpy integers
        return int(x)
    v = float(x)
    if not math.isfinite(v):
        raise InputError(f"{name}: expected a finite number, got {x!r}")
    return v


def check_acceptance(a: Any, name: str = "a") -> Number:
    """The acceptance rate: a number in [0, 1)."""
    a = check_number(a, name)
    if not 0 <= a < 1:
        raise InputError(f"{name}: acceptance must lie in [0, 1), got {a!r}")
    return a


def check_step_times(V: Any, name: str = "V") -> list[Number]:
    """Step times V(0..k_max): at least two positive finite numbers (k_max >= 1)."""
    if isinstance(V, str | bytes) or not hasattr(V, "__len__"):
        raise InputError(f"{name}: expected a sequence of step times V(0..k_max)")
    vals = [check_number(v, f"{name}[{k}]") for k, v in enumerate(V)]
    if len(vals) < 2:
        raise InputError(
            f"{name}: needs V(0) and at least V(1) (k_max >= 1), got {len(vals)} value(s)"
        )
    for k, v in enumerate(vals):
        if not v > 0:
            raise InputError(f"{name}[{k}]: step times must be positive, got {v!r}")
    return vals


def check_draft_length(k: Any, k_max: int, name: str = "k") -> int:
    if isinstance(k, bool) or not hasattr(k, "__index__"):
        raise InputError(f"{name}: draft length must be an integer, got {k!r}")
    k = int(k)
    if not 0 <= k <= k_max:
        raise InputError(f"{name}: draft length must lie in 0..{k_max}, got {k}")
    return k


def to_fraction(x: Number) -> Fraction:
    return x if isinstance(x, Fraction) else Fraction(x)


def out(x: Fraction, exact: bool) -> Number:
    """Return ``x`` as a Fraction when the inputs were exact, else as the nearest float."""
    return x if exact else float(x)


# ------------------------------------------------------------------------------------------
# Polynomials with rational coefficients, ascending powers: c[0] + c[1] x + ... + c[d] x^d.


def integer_coefficients(coeffs: Sequence[Fraction]) -> list[int]:
    """The coefficients times the positive lcm of their denominators (same sign everywhere)."""
    den = 1
    for c in coeffs:
        den = den * c.denominator // math.gcd(den, c.denominator)
    return [int(c * den) for c in coeffs]


def sign_at(int_coeffs: Sequence[int], x: Fraction | float) -> int:
    """Exact sign of the integer polynomial at a rational (or float) point ``x``."""
    num, den = (x.numerator, x.denominator) if isinstance(x, Fraction) else x.as_integer_ratio()
    # p(num/den) * den^d = sum_s c_s num^s den^(d-s), by homogeneous Horner in integers:
    # acc = c_d; then acc = acc * num + c_s * den^(d-s) for s = d-1, ..., 0.
    acc = int_coeffs[-1]
    den_pow = 1
    for c in reversed(int_coeffs[:-1]):
        den_pow *= den
        acc = acc * num + c * den_pow
    return (acc > 0) - (acc < 0)


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _float(b: int) -> float:
    return struct.unpack("<d", struct.pack("<q", b))[0]


def unit_root(coeffs: Sequence[Fraction]) -> float:
    """The root in (0, 1) of a polynomial that is negative at 0, positive at 1 and changes sign
    once on [0, 1], correctly rounded to the nearest double (ties to even).

    Bisection on the bit patterns of non-negative doubles (at most 62 steps), each step an exact
    sign evaluation in integers; the last step compares with the exact midpoint of the two
    neighbouring doubles, so the result is the double nearest to the real root.
    """
    ci = integer_coefficients([to_fraction(c) for c in coeffs])
    if sign_at(ci, 0.0) >= 0 or sign_at(ci, 1.0) <= 0:
        raise ValueError("unit_root: the polynomial must be negative at 0 and positive at 1")
    lo, hi = _bits(0.0), _bits(1.0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        s = sign_at(ci, _float(mid))
        if s == 0:
            return _float(mid)
        if s < 0:
            lo = mid
        else:
            hi = mid
    x_lo, x_hi = _float(lo), _float(hi)
    s = sign_at(ci, (Fraction(x_lo) + Fraction(x_hi)) / 2)
    if s > 0:  # the root lies below the midpoint
        return x_lo
    if s < 0:
        return x_hi
    return x_lo if lo % 2 == 0 else x_hi
