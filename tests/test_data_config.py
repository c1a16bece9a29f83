"""DataConfig: defaults, per-dataset protocol shapes, and every rejected key or value."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config.data_section import DataConfig
from pipeline.errors import FSCILError
from stages.prepare import run


def test_defaults_and_protocol_shapes() -> None:
    cfg = DataConfig.from_dict({})
    assert (cfg.dataset, cfg.resolved_image_size, cfg.protocol_shape(), cfg.seed) == ("synthetic", 32, (60, 5, 5, 8), 0)
    cub = DataConfig.from_dict({"dataset": "cub200", "root": "r", "split_dir": "s"})
    assert cub.protocol_shape() == (100, 10, 5, 10) and cub.resolved_image_size == 224
    mini = DataConfig.from_dict({"dataset": "mini_imagenet", "root": "r", "split_dir": "s", "ways": 4})
    assert mini.protocol_shape() == (60, 4, 5, 8) and mini.resolved_image_size == 84
    folder = DataConfig.from_dict({"dataset": "class_folder", "root": "r", "image_size": 64, "sessions": 3})
    assert folder.protocol_shape() == (None, 5, 5, 3) and folder.resolved_image_size == 64
    # null is a value: where the field allows it (image_size null: the preset's size), else a one-line error
    assert DataConfig.from_dict({"image_size": None}) == DataConfig()
    with pytest.raises(FSCILError, match="data.seed must be an integer, got null"):
        DataConfig.from_dict({"seed": None})


@pytest.mark.parametrize(("values", "message"), [
    ({"datset": "cifar100"}, r"params: unknown key data.datset \(valid: dataset, source, root, "),
    ({"dataset": "imagenet"}, "params: data.dataset must be one of synthetic, cifar100, mini_imagenet, cub200, "
                              "class_folder, omniglot, got 'imagenet'"),
    ({"image_size": "32"}, "params: data.image_size must be an integer, got '32'"),
    ({"image_size": 4}, "params: data.image_size must be >= 8, got 4"),
    ({"image_size": True}, "params: data.image_size must be an integer, got True"),
    ({"verify_checksums": "yes"}, "params: data.verify_checksums must be true or false, got 'yes'"),
    ({"test_fraction": 1.5}, "params: data.test_fraction must be strictly between 0 and 1, got 1.5"),
    ({"test_fraction": "half"}, "params: data.test_fraction must be a number, got 'half'"),
    ({"shots": 0}, "params: data.shots must be >= 1, got 0"),
    ({"seed": -1}, "params: data.seed must be >= 0, got -1"),
    ({"root": 3}, "params: data.root must be a string, got 3"),
    ({"dataset": "cifar100", "split_dir": "s"}, "params: data.root is required for dataset 'cifar100'"),
    ({"dataset": "cub200", "root": "r"}, "params: data.split_dir is required for dataset 'cub200'"),
    ({"checksums": ["abc"]}, "params: data.checksums must be a mapping of strings to strings"),
    ({"checksums": {"meta": "xyz"}}, "params: data.checksums.meta must be a hex md5 or sha256, got 'xyz'"),
    ({"base_classes": 200, "sessions": 10}, r"params: data.base_classes \+ ways x sessions must be <= 240"),
    ({"source": "synthetic"}, "params: data.source synthetic applies to cifar100, mini_imagenet, cub200, got dataset "
                              "'synthetic'"),
    ({"dataset": "cifar100", "source": "web"}, "params: data.source must be files or synthetic, got 'web'"),
    ({"shots": 30}, r"params: data.novel_pool_per_class must be >= shots \(30\), got 20"),
])
def test_rejects(values: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(FSCILError, match=message) as err:
        DataConfig.from_dict(values)
    assert "\n" not in str(err.value)
    with pytest.raises(FSCILError, match=message):  # the stage reports the same, and writes nothing
        run(values, tmp_path / "pack.h5")
    assert list(tmp_path.iterdir()) == []


def test_rejects_a_non_mapping() -> None:
    with pytest.raises(FSCILError, match="params: data must be a mapping, got list"):
        DataConfig.from_dict(["synthetic"])
    with pytest.raises(FSCILError, match="params: data.ways must be an integer"):
        DataConfig(ways=2.5)
