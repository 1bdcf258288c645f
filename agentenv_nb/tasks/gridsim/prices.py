"""Synthetic day-ahead prices shaped like ERCOT's: a night trough, a morning shoulder, a solar dip at midday,
an evening peak, and now and then a scarcity spike or a negative hour.

    >>> days = synthetic_days(3, seed=0)
    >>> len(days[0]["prices"])
    24
"""

from __future__ import annotations

import datetime
import math
import random

from .battery import HOURS

FIRST_DAY = datetime.date(2024, 1, 1)


def day_prices(rng: random.Random, season: float) -> list[float]:
    """One day's 24 prices in $/MWh; ``season`` in [0, 1) moves the solar dip and the evening peak."""
    level = rng.uniform(22, 45)
    solar = max(0.0, math.sin(2 * math.pi * season)) * rng.uniform(0.3, 1.0)  # spring and summer dips
    peak = rng.uniform(0.6, 1.8) * (1 + 0.6 * max(0.0, -math.cos(2 * math.pi * season)))  # a hotter evening
    prices = []
    for hour in range(HOURS):
        night = -0.35 * math.exp(-((hour - 4) ** 2) / 6)
        morning = 0.6 * math.exp(-((hour - 8) ** 2) / 3)
        midday = -0.8 * solar * math.exp(-((hour - 13) ** 2) / 8)
        evening = peak * math.exp(-((hour - rng.choice((18, 19, 19, 20))) ** 2) / 4)
        noise = rng.gauss(0, 0.22)
        prices.append(level * (1 + night + morning + midday + evening + noise))
    if rng.random() < 0.12:  # a scarcity spike on a tight evening
        prices[rng.randint(15, 21)] *= rng.uniform(3, 12)
    if rng.random() < 0.10 * (1 + solar):  # too much wind or sun for an hour
        prices[rng.randint(1, 15)] = -rng.uniform(1, 25)
    return [round(price, 2) for price in prices]


def synthetic_days(count: int, seed: int = 0, first: int = 0) -> list[dict]:
    """``count`` days of prices from day number ``first`` on, each ``{"day": "YYYY-MM-DD", "prices": [...]}``;
    the same seed and numbers give the same days."""
    days = []
    for number in range(first, first + count):
        rng = random.Random(f"{seed}:{number}")
        date = FIRST_DAY + datetime.timedelta(days=number)
        days.append({"day": date.isoformat(), "prices": day_prices(rng, (date.timetuple().tm_yday - 1) / 365)})
    return days
