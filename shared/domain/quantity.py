"""Kubernetes quantities read exactly (pure): the grammar of resource.Quantity (sign, decimal, exponent or
suffix), as Fractions. The quota rules read any form with it; the slice requests only whole numbers in the
forms the API server leaves them (shared/domain/request.py), and name the value of any other form."""

from __future__ import annotations

import re
from fractions import Fraction

_QUANTITY = re.compile(r"^\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:([eE][-+]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")
_SUFFIX = {"": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
           "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
           "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
           "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60)}
MAX_EXPONENT = 30  # beyond it a value is out of any range here (and 10**exp would cost time)


def exact(text: str) -> Fraction | None:
    """The value of a non-negative quantity (callers bound its length first), or None when `text` is not one
    or its exponent is out of range."""
    m = _QUANTITY.match(text.strip())
    if m is None:
        return None
    exp = int(m.group(2)[1:]) if m.group(2) else 0
    if abs(exp) > MAX_EXPONENT:
        return None
    return Fraction(m.group(1)) * _SUFFIX[m.group(3) or ""] * Fraction(10) ** exp


def is_zero(text: str) -> bool:
    """Whether `text` is a quantity of value 0 in any form, signed or not ("-0", "0e99", "0.0Gi")."""
    m = _QUANTITY.match(text[1:] if text.startswith("-") else text)
    return m is not None and re.search("[1-9]", m.group(1)) is None
