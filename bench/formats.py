"""How bench/RESULTS.md writes a figure: a missing one (NaN) as n/a, and a target's verdict."""

from __future__ import annotations

import math


def ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def us(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1f}"


def ratio(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}"


def verdict(met: bool) -> str:
    return "**met**" if met else "**missed**"
