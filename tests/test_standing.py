"""Where a run stands against the class means of its own backbone (pipeline/report.py `standing`), printed by the
report stage and `fscil show`: the AVG line and its sign, and the warnings of a run that learned nothing of its new
classes or ends below its own class means, on per-session tables made by hand."""

import pandas as pd

from pipeline.report import standing


def _table(acc, novel, means_acc, means_novel) -> pd.DataFrame:
    sessions = range(len(acc))
    return pd.DataFrame({"session": list(sessions), "acc": acc, "base_acc": acc, "novel_acc": novel,
                         "proto_backbone_acc": means_acc, "proto_backbone_base_acc": means_acc,
                         "proto_backbone_novel_acc": means_novel})


def test_a_run_above_its_class_means_gets_one_line():
    table = _table([80.0, 70.0, 60.0], [None, 40.0, 30.0], [80.0, 68.0, 57.0], [None, 35.0, 25.0])
    # AVG 70.00 against (80 + 68 + 57) / 3 = 68.33
    assert standing(table) == ["AVG 70.00 against the class means of its own backbone 68.33: +1.67"]


def test_novel_accuracy_stuck_at_zero_and_a_final_below_the_class_means_are_flagged_with_the_keys_set():
    table = _table([80.0, 64.0, 53.0], [None, 0.0, 0.0], [80.0, 68.0, 57.0], [None, 35.0, 25.0])
    lines = standing(table, ["incremental.lr=0.0001"])
    assert lines[0] == "AVG 65.67 against the class means of its own backbone 68.33: -2.67, not above them"
    assert lines[1] == ("warning: novel accuracy is 0 in every session after the base one: the sessions learned none "
                        "of the new classes (keys you set that the sessions read: incremental.lr=0.0001)")
    assert lines[2] == ("warning: the run ends below the class means of its own backbone (final 53.00 against "
                        "57.00) (keys you set that the sessions read: incremental.lr=0.0001)")
    assert len(lines) == 3


def test_without_the_baseline_only_the_novel_check_applies():
    table = _table([80.0, 70.0], [None, 0.0], [None, None], [None, None])
    assert standing(table) == ["warning: novel accuracy is 0 in every session after the base one: the sessions "
                               "learned none of the new classes"]


def test_the_keys_named_as_suspects_are_those_the_user_set(tmp_path):
    from stages.entry import load_config
    from stages.report import set_by_you
    from tests.pipeline_fixtures import write_params

    params = write_params(tmp_path / "params.yaml")  # the tiny params set incremental.steps, lambda1, ...
    cfg = load_config(params, ["incremental.lr=0.0001"])
    named = set_by_you(cfg, "incremental")
    assert "incremental.lr=0.0001" in named and "incremental.lambda1=10.0" in named
    assert not [k for k in named if k.startswith(("incremental.momentum", "incremental.schedule"))]  # preset's
