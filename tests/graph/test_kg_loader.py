"""relconv.datasets.kg parses tab-separated triple files into id tensors (generated files, no download)."""

import pytest
import torch

from relconv.datasets.kg import read_triples


def _write(tmp_path, name, text):
    path = tmp_path / f"{name}.txt"
    path.write_text(text, encoding="utf-8")
    return path


def test_shared_sorted_vocabulary_and_ids(tmp_path):
    paths = {
        "train": _write(tmp_path, "train", "b\tlikes\ta\na\tknows\tc\n\n"),
        "valid": _write(tmp_path, "valid", ""),
        "test": _write(tmp_path, "test", "d\tlikes\tb\n"),  # d appears only in test
    }
    kg = read_triples(paths)
    assert kg.entities == ["a", "b", "c", "d"]
    assert kg.relations == ["knows", "likes"]
    heads, rels, tails = kg.splits["train"]
    assert heads.tolist() == [1, 0] and rels.tolist() == [1, 0] and tails.tolist() == [0, 2]
    assert all(t.dtype == torch.long for t in kg.splits["test"])
    assert [t.tolist() for t in kg.splits["test"]] == [[3], [1], [1]]
    assert all(t.shape == (0,) for t in kg.splits["valid"])


def test_malformed_line_names_file_and_line(tmp_path):
    path = _write(tmp_path, "train", "a\tr\tb\na\tr\n")
    with pytest.raises(ValueError, match=r"train\.txt:2"):
        read_triples({"train": path})
