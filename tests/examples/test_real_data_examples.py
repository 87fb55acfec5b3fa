"""Smoke runs of the real-data examples on CPU through relconv (tiny epochs). They read data that
pip fetches into the cache, so they skip when it is neither cached nor downloadable."""

import importlib.util
import json
from pathlib import Path

import pytest

from relconv.datasets import DataUnavailable

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_lidar_segmentation_smoke(tmp_path):
    example = _example("train_lidar_seg")
    argv = ["--device", "cpu", "--epochs", "1", "--width", "0.25", "--max-blocks", "4"]
    argv += ["--out", str(tmp_path)]
    try:
        (result,) = example.main(argv)
    except DataUnavailable as err:
        pytest.skip(str(err))
    except ImportError as err:  # tiles not decoded in the cache, and no laspy/lazrs to decode them
        if "laspy" not in str(err):
            raise
        pytest.skip(str(err))
    assert result["train_blocks"] == 4 and result["val_blocks"] == 4
    epoch = result["epochs"][0]
    assert epoch["train_loss"] > 0 and 0.0 <= epoch["miou"] <= 1.0 and epoch["train_seconds"] > 0
    assert set(epoch["iou"]) == set(example.CLASSES)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["relconv"]["final_miou"] == result["final_miou"]


@pytest.mark.slow
def test_rgcn_entity_classification_smoke(tmp_path):
    example = _example("train_rgcn_entities")
    try:
        result = example.main(["--device", "cpu", "--epochs", "2", "--out", str(tmp_path)])
    except DataUnavailable as err:
        pytest.skip(str(err))
    assert result["graph"]["relations"] == 2 * 22  # 24 relations less the genre pair, with inverses
    assert sum(result["films"].values()) > 1000 and len(result["genres"]) == 10
    assert 0.0 <= result["test_at_best_val"]["micro_f1"] <= 1.0
    assert json.loads((tmp_path / "metrics.json").read_text())["best_epoch"] == result["best_epoch"]
