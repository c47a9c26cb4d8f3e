"""The largest of some deviations, NaN as soon as any is NaN.

Python's max(0.1, nan) is 0.1 (a NaN never compares greater), so a NaN loss or gradient folded into a
worst deviation with max() would pass the bound checked next as if it matched. The reference scripts
fold their deviations with worst() instead.
"""
import math


def worst(*deviations):
    """max(*deviations) as floats, NaN if any is NaN; -inf for none."""
    out = -math.inf
    for d in map(float, deviations):
        if math.isnan(d):
            return math.nan
        out = d if d > out else out
    return out


if __name__ == "__main__":
    assert math.isnan(worst(0.1, math.nan)) and math.isnan(worst(*(x for x in (math.nan, 0.1))))
    assert worst(0.1, 0.3, 0.2) == 0.3 and worst() == -math.inf
    print("worst self-test OK")
