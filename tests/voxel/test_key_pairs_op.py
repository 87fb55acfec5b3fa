"""relconv::sorted_key_pairs, the search of the CPU kernel maps, against a brute-force match of every
(input, output, relation) and its argument errors."""

import pytest
import torch

import relconv  # noqa: F401  (registers the ops)

OP = torch.ops.relconv.sorted_key_pairs.default


def _brute_force(keys, perm, out_keys, out_perm, deltas):
    row_of_key = {int(k): int(p) for k, p in zip(keys, perm, strict=True)}
    out_row_key = sorted((int(p), int(k)) for k, p in zip(out_keys, out_perm, strict=True))
    pairs = [
        (row_of_key[key + int(d)], o, r)
        for r, d in enumerate(deltas)
        for o, key in out_row_key
        if key + int(d) in row_of_key
    ]
    return pairs


@pytest.mark.parametrize(("n", "m", "span"), [(200, 200, 400), (300, 80, 300), (50, 500, 2000), (1, 1, 3)])
def test_pairs_match_every_key_equality(n, m, span):
    g = torch.Generator().manual_seed(n + m)
    keys = torch.randperm(span, generator=g)[:n].sort().values
    perm = torch.randperm(n, generator=g)
    out_keys = torch.randperm(span, generator=g)[:m].sort().values
    out_perm = torch.randperm(m, generator=g)
    deltas = torch.tensor([-3, 0, 1, 7, -50])
    in_index, out_index, rel_ptr = OP(keys, perm, out_keys, out_perm, deltas)
    want = _brute_force(keys, perm, out_keys, out_perm, deltas)
    got = [
        (int(i), int(o), r)
        for r in range(5)
        for i, o in zip(
            in_index[rel_ptr[r] : rel_ptr[r + 1]], out_index[rel_ptr[r] : rel_ptr[r + 1]], strict=True
        )
    ]
    assert got == want  # grouped by relation, outputs ascending within each
    assert rel_ptr[0] == 0 and rel_ptr[-1] == len(want)


def test_no_inputs_or_outputs_gives_no_pairs():
    empty = torch.empty(0, dtype=torch.long)
    in_index, _, rel_ptr = OP(empty, empty, torch.tensor([1, 2]), torch.tensor([1, 0]), torch.tensor([0, 1]))
    assert in_index.numel() == 0 and rel_ptr.tolist() == [0, 0, 0]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: {**a, "keys": a["keys"].int()}, "keys must be a 1-D int64 tensor"),
        (lambda a: {**a, "perm": a["perm"][:-1]}, "perm must be a 1-D int64 tensor with one row per key"),
        (lambda a: {**a, "out_perm": a["out_perm"] + 5}, "out_perm must hold rows in"),
        (lambda a: {**a, "perm": -a["perm"] - 1}, "perm must hold rows in"),
        (lambda a: {**a, "deltas": a["deltas"].view(1, -1)}, "deltas must be a 1-D int64 tensor"),
    ],
)
def test_bad_arguments_raise_naming_them(change, match):
    args = dict(
        keys=torch.tensor([1, 4, 9]),
        perm=torch.tensor([2, 0, 1]),
        out_keys=torch.tensor([0, 4]),
        out_perm=torch.tensor([1, 0]),
        deltas=torch.tensor([0, 1]),
    )
    with pytest.raises(ValueError, match=match):
        OP(**change(args))
