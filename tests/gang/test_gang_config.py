"""The policy file's gang: section: levels innermost first, validated at load naming the field."""

from __future__ import annotations

import pytest

from scheduler_plugin.gang import build_domains
from scheduler_plugin.gang.levels import GangPolicy
from scheduler_plugin.policies.policy_file import PolicyConfig
from scheduler_plugin.policies.registry import PolicyConfigError


def test_levels_load_from_the_policy_file_innermost_first() -> None:
    cfg = PolicyConfig.from_mapping(
        {
            "gang": {
                "levels": [
                    {"name": "rack", "label": "kelvin.dev/rack"},
                    {"name": "zone", "label": "topology.kubernetes.io/zone"},
                ]
            }
        }
    )
    assert cfg.gang.level_names == ("node", "rack", "zone", "cluster")


@pytest.mark.parametrize(
    ("levels", "words"),
    [
        ([{"name": "rack", "label": "a/rack"}, {"name": "rack", "label": "b/rack"}], "name 'rack' appears twice"),
        ([{"name": "rack", "label": "a/rack"}, {"name": "row", "label": "a/rack"}], "label 'a/rack' appears twice"),
        ([{"name": "node", "label": "a/rack"}], "reserved"),
        ([{"name": "Rack", "label": "a/rack"}], "gang.levels.0.name"),
        ([{"name": "rack", "label": "not a label"}], "gang.levels.0.label"),
        ([{"name": "rack"}], "gang.levels.0.label"),
    ],
)
def test_bad_levels_stop_the_load_naming_the_field(levels: list[dict[str, str]], words: str) -> None:
    with pytest.raises(PolicyConfigError) as exc:
        PolicyConfig.from_mapping({"gang": {"levels": levels}})
    assert words in str(exc.value)


def test_without_labels_each_node_is_its_own_domain() -> None:
    policy = GangPolicy.model_validate({"levels": [{"name": "rack", "label": "kelvin.dev/rack"}]})
    d = build_domains(["a", "b", "c"], [{"kelvin.dev/rack": "r1"}, {}, {"kelvin.dev/rack": "r1"}], policy)
    rack = d.ids[d.level_index("rack")]
    assert rack[0] == rack[2] != rack[1]
    assert d.names[d.level_index("rack")][int(rack[1])] == "b"
    none = build_domains(["a", "b"], [{}, {}], policy)
    assert none.labelled == (True, False, True)
