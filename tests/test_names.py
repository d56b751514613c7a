"""NameGenerator.fresh_grid: the names of one-by-one ``fresh`` calls, made a base at a time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from graphkit.rewrite.lowering.builder import NameGenerator

# few letters, so that bases, their suffixes and the names taken meet often
_PART = st.text(alphabet="ab_/1", max_size=4)


def _one_by_one(taken: list[str], calls: list[tuple[list[str], list[str]]]) -> tuple[list[list[str]], set, dict]:
    names = NameGenerator(taken)
    made = [[names.fresh(p + s) for p in prefixes for s in suffixes] for prefixes, suffixes in calls]
    return made, names._taken, names._next


@settings(max_examples=300, deadline=None)
@given(taken=st.lists(_PART, max_size=6),
       calls=st.lists(st.tuples(st.one_of(st.lists(_PART, max_size=5),
                                          st.builds(lambda p, n: [p] * n, _PART, st.integers(0, 6))),
                                st.lists(_PART, min_size=1, max_size=4)), min_size=1, max_size=4))
def test_fresh_grid_makes_the_names_fresh_makes(taken, calls):
    names = NameGenerator(taken)
    made = [names.fresh_grid(prefixes, suffixes) for prefixes, suffixes in calls]
    assert (made, names._taken, names._next) == _one_by_one(taken, calls)


def test_fresh_grid_one_prefix_repeated_and_distinct_prefixes():
    names = NameGenerator(["n/Mul_2"])
    assert names.fresh_grid(["n"] * 3, ["/const", "/Mul", "/const"]) == [
        "n/const", "n/Mul", "n/const_1", "n/const_2", "n/Mul_1", "n/const_3", "n/const_4", "n/Mul_3", "n/const_5"]
    assert names.fresh_grid(["a", "b"], ["/x"]) == ["a/x", "b/x"]
    assert names.fresh_grid(["a", "b"], ["/x"]) == ["a/x_1", "b/x_1"]
    assert names.fresh("n/Mul") == "n/Mul_4"


def test_fresh_grid_asks_a_subclass_one_by_one():
    class Upper(NameGenerator):
        def fresh(self, base: str) -> str:
            return super().fresh(base.upper())

    assert Upper().fresh_grid(["a"] * 2, ["/x"]) == ["A/X", "A/X_1"]
