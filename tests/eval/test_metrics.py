"""Average@k and unbiased pass@k against brute-force definitions."""

import itertools
from fractions import Fraction

import pytest

from phf_megatron.eval.metrics import pass_at_k, score_benchmark, suite_average


def _pass_at_k_by_enumeration(n, c, k):
    """Fraction of the k-subsets of n samples (c correct) holding a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_unbiased_pass_at_k_equals_subset_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(_pass_at_k_by_enumeration(n, c, k)), abs=1e-12)


def test_pass_at_1_is_the_mean_and_bad_arguments_are_named():
    assert pass_at_k(12, 5, 1) == pytest.approx(5 / 12)
    with pytest.raises(ValueError, match="^c:"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="^k:"):
        pass_at_k(4, 1, 5)


def _rec(correct, boxed=True, finish="stop", extended=None):
    return {"correct": {"official": correct, "extended": correct if extended is None else extended},
            "boxed": boxed, "finish_reason": finish}


def test_average_at_k_pass_at_k_and_suite_average():
    per = {"p1": [_rec(True), _rec(False), _rec(True), _rec(False)],
           "p2": [_rec(False, boxed=False, finish="length")] * 4,
           "p3": [_rec(True)] * 4}
    s = score_benchmark("b", per, k=4, pass_ks=(1, 2))
    assert s.average_at_k == pytest.approx(100 * (2 / 4 + 0 + 1) / 3)
    assert s.pass_at_k[1] == pytest.approx(s.average_at_k)
    assert s.pass_at_k[2] == pytest.approx(100 * (pass_at_k(4, 2, 2) + 0 + 1) / 3)
    assert s.pass_at_k[4] == pytest.approx(100 * 2 / 3)
    assert s.boxed_rate == pytest.approx(100 * 8 / 12) and s.truncated_rate == pytest.approx(100 * 4 / 12)
    other = score_benchmark("c", {"q": [_rec(False)] * 4}, k=4)
    assert suite_average([s, other]) == pytest.approx(s.average_at_k / 2)
    with pytest.raises(ValueError, match="b/p1: 3 samples, expected 4"):
        score_benchmark("b", {"p1": per["p1"][:3]}, k=4)


def test_each_grader_has_its_average_and_the_chosen_one_its_pass_at_k():
    per = {"p1": [_rec(True), _rec(False, extended=True)], "p2": [_rec(False, extended=True), _rec(False)]}
    official = score_benchmark("b", per, k=2, pass_ks=(1,))
    extended = score_benchmark("b", per, k=2, pass_ks=(1,), grader="extended")
    assert official.average_at_k_by_grader == extended.average_at_k_by_grader == {"official": 25.0, "extended": 75.0}
    assert (official.grader, official.average_at_k, official.pass_at_k[2]) == ("official", 25.0, 50.0)
    assert (extended.grader, extended.average_at_k, extended.pass_at_k[2]) == ("extended", 75.0, 100.0)
    assert suite_average([official], "extended") == 75.0 and suite_average([extended]) == 75.0
    with pytest.raises(ValueError, match="grader: 'strict' is not one of"):
        score_benchmark("b", per, k=2, grader="strict")
