"""TrainConfig's declarations for `train --help`: every field names an option group of
OPTION_GROUPS and every group holds a field; ENGINE_PROFILES in words names each flag once,
as set or left off."""

from __future__ import annotations

from eagle3lab.train.config import (ENGINE_PROFILES, OPTION_GROUPS, TrainConfig,
                                    engine_profiles_text)


def test_every_field_names_a_group_and_every_group_is_used():
    groups = {name: (f.json_schema_extra or {}).get("group")
              for name, f in TrainConfig.model_fields.items()}
    assert {n: g for n, g in groups.items() if g not in OPTION_GROUPS} == {}
    assert set(groups.values()) == set(OPTION_GROUPS)
    assert set(OPTION_GROUPS) >= {"data", "model", "optimiser", "schedule", "checkpoints",
                                  "distributed"}


def test_engine_profiles_in_words():
    text = engine_profiles_text()
    parts = text.split("; ")
    assert len(parts) == len(ENGINE_PROFILES)
    for part, (engine, flags) in zip(parts, ENGINE_PROFILES.items()):
        head, _, off = part.partition(" (")
        assert head.startswith(f"{engine} sets ")
        for flag, value in flags.items():
            assert (flag in head, flag in off) == (value, not value), (engine, flag)
