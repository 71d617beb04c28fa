"""Parameter types shared by the commands."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """click's ``FloatRange`` that refuses ``nan`` and ``inf`` as bad usage (exit 2).

    Every comparison with NaN is false, so ``FloatRange`` lets ``--interval nan`` through its bounds
    and the command fails later with an unexpected ValueError (exit 1); a range without an upper
    bound lets ``inf`` through too. Neither is ever a meaningful number of seconds.
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
