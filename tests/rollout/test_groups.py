"""Engine groups (``rollout.num_engines``) from Megatron's own rank layout, and per-sample seeds."""

import pytest

from phf_megatron.errors import ConfigError
from phf_megatron.rollout.groups import AUTO, RankPlace, plan_engine_groups, span
from phf_megatron.rollout.seeds import sample_seed


def places(tp: int, dp: int, pp: int, ranks_per_node: int) -> list[RankPlace]:
    """Each rank's data-parallel index as Megatron-Core assigns it (its default order), on nodes of
    ``ranks_per_node`` consecutive ranks."""
    from megatron.core.parallel_state import RankGenerator

    dp_of = {}
    for group in RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1, order="tp-cp-ep-dp-pp").get_ranks("dp"):
        dp_of.update({rank: i for i, rank in enumerate(group)})
    return [RankPlace(r, dp_of[r], r // ranks_per_node, r % ranks_per_node) for r in range(tp * dp * pp)]


def test_groups_are_contiguous_blocks_of_whole_replicas_without_pipeline_parallelism():
    g = plan_engine_groups(2, places(tp=2, dp=4, pp=1, ranks_per_node=8), prompts_per_step=8)
    assert g.ranks == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert [g.host(e) for e in range(2)] == [0, 4] and g.group_of(5) == 1
    assert list(g.dp_ranks(1)) == [2, 3] and list(g.prompts(1, 8)) == [4, 5, 6, 7]
    assert g.local_sync == (True, True)


def test_auto_is_one_engine_per_node():
    g = plan_engine_groups(AUTO, places(tp=2, dp=4, pp=1, ranks_per_node=4), prompts_per_step=4)
    assert g.ranks == ((0, 1, 2, 3), (4, 5, 6, 7)) and g.nodes == (0, 1) and g.local_sync == (True, True)
    assert plan_engine_groups(AUTO, places(tp=1, dp=4, pp=1, ranks_per_node=4), prompts_per_step=4).num_engines == 1


def test_with_pipeline_parallelism_a_group_holds_every_stage_of_its_replicas():
    # tp 1, dp 2, pp 2: Megatron puts the stages of replica 0 on ranks 0 and 2
    g = plan_engine_groups(2, places(tp=1, dp=2, pp=2, ranks_per_node=4), prompts_per_step=2)
    assert g.ranks == ((0, 2), (1, 3)) and g.local_sync == (True, True)
    # the same on two nodes: one engine reads its replica's second stage from the other node
    g = plan_engine_groups(1, places(tp=1, dp=2, pp=2, ranks_per_node=2), prompts_per_step=2)
    assert g.ranks == ((0, 1, 2, 3),) and g.local_sync == (False,)
    assert "crossing nodes" in g.describe()


@pytest.mark.parametrize("num_engines, layout, prompts, field, words", [
    (3, dict(tp=1, dp=4, pp=1, ranks_per_node=4), 12, "rollout.num_engines", "4 data-parallel ranks"),
    (2, dict(tp=1, dp=4, pp=1, ranks_per_node=4), 3, "rollout.num_engines", "3 prompts"),
    (AUTO, dict(tp=1, dp=6, pp=1, ranks_per_node=2), 4, "rollout.num_engines", "auto: one per node, 3 nodes"),
    # 2 nodes of 3 ranks, 3 groups of 2: group 1 takes rank 2 of node 0 and rank 3 of node 1
    (3, dict(tp=1, dp=6, pp=1, ranks_per_node=3), 6, "rollout.num_engines", "only part of node 0"),
    # pipeline stages on two nodes: a group of replica 0 would split both nodes
    (2, dict(tp=1, dp=2, pp=2, ranks_per_node=2), 2, "rollout.num_engines", "spans several nodes"),
])
def test_a_layout_that_does_not_align_is_one_line_naming_the_field(num_engines, layout, prompts, field, words):
    with pytest.raises(ConfigError) as err:
        plan_engine_groups(num_engines, places(**layout), prompts_per_step=prompts)
    assert err.value.key == field and words in err.value.line and "\n" not in err.value.line


def test_an_engine_never_takes_a_device_of_another_group():
    layout = places(tp=1, dp=4, pp=1, ranks_per_node=4)
    assert plan_engine_groups(2, layout, prompts_per_step=4, engine_tp=2).num_engines == 2
    with pytest.raises(ConfigError) as err:
        plan_engine_groups(2, layout, prompts_per_step=4, engine_tp=4)
    assert err.value.line.startswith("--rollout.tensor_parallel_size: engine 0 (host rank 0) would take 4 devices")
    assert "local rank(s) 2-3 are missing or belong to another engine group" in err.value.line


def test_span():
    assert span([3, 1, 2]) == "1-3" and span([0, 2]) == "0, 2" and span([5]) == "5"


def test_sample_seeds_are_fixed_distinct_and_in_range():
    seeds = {sample_seed(42, step, prompt, sample, stream)
             for step in range(4) for prompt in range(8) for sample in range(3) for stream in ("rollout", "analysis")}
    assert len(seeds) == 4 * 8 * 3 * 2 and all(0 <= s < 2**63 for s in seeds)
    assert sample_seed(42, 1, 2, 0) == sample_seed(42, 1, 2) == 5473267244656471011  # never changes with a version
    assert sample_seed(43, 1, 2) != sample_seed(42, 1, 2)
    with pytest.raises(ValueError, match="stream"):
        sample_seed(1, 0, 0, stream="teacher")
