"""GridSim's rules: one grid battery for one day of hourly prices, its exact optimum, the baselines, the score.

The battery holds CAPACITY MWh and moves POWER MWh an hour. Each hour's action is one integer: 1 charges
(buys POWER at that hour's price), -1 sells, 0 idles. It starts the day empty and what it holds at midnight
is worth nothing. There are no efficiency losses: a unit charged is a unit sold. An action the battery can't
take (charging when full, selling when empty) does nothing, so every well-formed schedule can be played.

The score maps a day's profit onto [0, 1]: 0.2 for idling all day, 1 for the day's optimum, linear in
between, lower (down to 0) for schedules that lose money, and 0 for a malformed schedule. Standard library
only: the env server ships this very file, so the env, the baselines and the tests score with one rule.

    >>> prices = [30.0] * 4 + [60.0] * 20
    >>> score(prices, optimal_schedule(prices))
    1.0
    >>> score(prices, [0] * 24)
    0.2
"""

from __future__ import annotations

HOURS = 24
CAPACITY = 4
POWER = 1
IDLE_SCORE = 0.2
ACTIONS = (-1, 0, 1)


class ScheduleError(ValueError):
    """A schedule that isn't HOURS integers from ACTIONS."""


def check_schedule(schedule: object, hours: int = HOURS) -> list[int]:
    """``schedule`` as a list of ``hours`` actions, or ScheduleError saying what is wrong with it."""
    if not isinstance(schedule, (list, tuple)):
        raise ScheduleError(f"a schedule is a list of {hours} integers, got {type(schedule).__name__}")
    if len(schedule) != hours:
        raise ScheduleError(f"a schedule has one action for each of the {hours} hours, got {len(schedule)}")
    bad = [f"hour {hour}: {action!r}" for hour, action in enumerate(schedule)
           if isinstance(action, bool) or not isinstance(action, int) or action not in ACTIONS]
    if bad:
        raise ScheduleError(f"each action is 1 (charge), -1 (sell) or 0 (idle); not {', '.join(bad[:4])}")
    return list(schedule)


def settle(prices: list[float], schedule: list[int]) -> tuple[float, list[int]]:
    """The day's profit of ``schedule`` and the actions the battery really took (impossible ones become 0)."""
    stored, profit, taken = 0, 0.0, []
    for price, action in zip(prices, check_schedule(schedule, len(prices))):
        if not 0 <= stored + action * POWER <= CAPACITY:
            action = 0
        stored += action * POWER
        profit -= action * POWER * price
        taken.append(action)
    return profit, taken


def optimum(prices: list[float]) -> tuple[float, list[int]]:
    """The day's best profit and a schedule that makes it: dynamic programming over the charge held each hour.
    Ties go to idling, so the schedule trades only where it earns."""
    levels = range(0, CAPACITY + 1, POWER)
    to_go = {level: 0.0 for level in levels}  # the best profit from this hour to midnight, by charge held
    plans = []  # for each hour, from the last: the best action by charge held
    for price in reversed(prices):
        plan, value = {}, {}
        for level in levels:
            options = [(round(to_go[level + action * POWER] - action * POWER * price, 9), action == 0, action)
                       for action in ACTIONS if 0 <= level + action * POWER <= CAPACITY]
            value[level], _, plan[level] = max(options)
        to_go = value
        plans.append(plan)
    schedule, level = [], 0
    for plan in reversed(plans):
        schedule.append(plan[level])
        level += plan[level] * POWER
    return to_go[0], schedule


def score(prices: list[float], schedule: object) -> float:
    """The env's grade of ``schedule`` on the day of ``prices``: 0 if malformed, 0.2 idle, 1 the optimum."""
    try:
        profit, _ = settle(prices, schedule)  # type: ignore[arg-type]
    except ScheduleError:
        return 0.0
    best, _ = optimum(prices)
    if best <= 1e-9:
        return 1.0 if profit >= -1e-9 else 0.0
    return round(min(1.0, max(0.0, IDLE_SCORE + (1 - IDLE_SCORE) * profit / best)), 6)


def idle_schedule(prices: list[float]) -> list[int]:
    """Do nothing all day: the 0.2 baseline."""
    return [0] * len(prices)


def greedy_schedule(prices: list[float]) -> list[int]:
    """Charge in the day's CAPACITY/POWER cheapest hours and sell in its dearest, whatever their order."""
    hours = sorted(range(len(prices)), key=lambda hour: (prices[hour], hour))
    cycles = CAPACITY // POWER
    schedule = [0] * len(prices)
    for hour in hours[:cycles]:
        schedule[hour] = 1
    for hour in hours[-cycles:]:
        schedule[hour] = -1
    return schedule


def optimal_schedule(prices: list[float]) -> list[int]:
    """A schedule that makes the day's best profit."""
    return optimum(prices)[1]


BASELINES = {"idle": idle_schedule, "greedy": greedy_schedule, "optimum": optimal_schedule}
