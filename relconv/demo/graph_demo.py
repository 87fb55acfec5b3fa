"""Demo part 3: link prediction with an R-GCN encoder and a DistMult decoder (Schlichtkrull et al.).

Data: UMLS (135 entities, 46 relations, 5,216 / 652 / 661 train / valid / test triples) from the
`pykeen==1.11.1` wheel (fetched with `pip download --no-deps`, cached). The encoder is 2 R-GCN layers
(basis decomposition) over the training triples plus an inverse relation for each, with featureless
nodes (`x=None`: the first layer's per-relation weights act as entity embeddings); DistMult scores
a triple as sum(e_h * w_r * e_t). Training is full-batch with negative sampling (each positive
corrupted in its head or its tail) and binary cross-entropy. The test split is scored once at the
end: filtered MRR and Hits@10, each triple ranked against all entities as head and as tail, with the
other known true triples (train + valid + test) removed from the candidates.

The same model runs with `relconv.graph.RGCNConv` and `torch_geometric.nn.RGCNConv` (the only
difference is the class), from the same initial state_dict and the same negative samples; a
DistMult without the encoder (learned entity embeddings, the same epochs: it converges more slowly,
so this is a fixed-budget comparison) and a random ranking put the numbers in context.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from relconv.datasets import DataUnavailable
from relconv.datasets.kg import TripleSplits, pykeen_triples

EPOCHS = 150
HIDDEN = 32
NEGATIVES = 8  # corrupted triples per positive


class LinkPredictor(torch.nn.Module):
    """R-GCN encoder (`conv_cls` is the library; None: plain entity embeddings) + DistMult decoder."""

    def __init__(self, conv_cls: type | None, num_entities: int, num_relations: int) -> None:
        super().__init__()
        if conv_cls is None:
            self.embedding = torch.nn.Embedding(num_entities, HIDDEN)
        else:
            # 2 * num_relations: messages also flow along each relation's inverse, as in the paper.
            self.conv1 = conv_cls(num_entities, HIDDEN, 2 * num_relations, num_bases=8)
            self.conv2 = conv_cls(HIDDEN, HIDDEN, 2 * num_relations, num_bases=8)
        self.relation = torch.nn.Parameter(torch.randn(num_relations, HIDDEN) / HIDDEN**0.5)

    def encode(self, edge_index: torch.Tensor, edge_type: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "conv1"):
            return self.embedding.weight
        h = F.relu(self.conv1(None, edge_index, edge_type))
        return self.conv2(F.dropout(h, 0.2, self.training), edge_index, edge_type)

    def score(self, z: torch.Tensor, heads: torch.Tensor, rels: torch.Tensor, tails: torch.Tensor):
        return (z[heads] * self.relation[rels] * z[tails]).sum(-1)


def _message_graph(kg: TripleSplits, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Training triples as edges head -> tail of type r, and tail -> head of type r + R."""
    h, r, t = kg.splits["train"]
    edge_index = torch.cat([torch.stack([h, t]), torch.stack([t, h])], 1)
    edge_type = torch.cat([r, r + len(kg.relations)])
    return edge_index.to(device), edge_type.to(device)


def _train(model: LinkPredictor, kg: TripleSplits, device: torch.device) -> list[float]:
    """Full-batch epochs; returns each epoch's wall time."""
    edge_index, edge_type = _message_graph(kg, device)
    h, r, t = (x.to(device) for x in kg.splits["train"])
    n, num_entities = h.numel(), len(kg.entities)
    labels = torch.cat([torch.ones(n), torch.zeros(n * NEGATIVES)]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    # Negatives come from a CPU generator, so both libraries see the same ones on any device.
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(EPOCHS):
        start = time.perf_counter()
        model.train()
        # Each negative replaces the head or the tail of a positive by a uniformly random entity.
        random_entity = torch.randint(num_entities, (n * NEGATIVES,), generator=gen).to(device)
        corrupt_head = (torch.rand(n * NEGATIVES, generator=gen) < 0.5).to(device)
        nh, nt = h.repeat(NEGATIVES), t.repeat(NEGATIVES)
        heads = torch.cat([h, torch.where(corrupt_head, random_entity, nh)])
        tails = torch.cat([t, torch.where(corrupt_head, nt, random_entity)])
        rels = torch.cat([r, r.repeat(NEGATIVES)])
        opt.zero_grad()
        z = model.encode(edge_index, edge_type)
        logits = model.score(z, heads, rels, tails)
        # Small L2 on the used embeddings and relation vectors keeps DistMult's scores from exploding.
        reg = z.pow(2).mean() + model.relation.pow(2).mean()
        (F.binary_cross_entropy_with_logits(logits, labels) + 0.01 * reg).backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def _known_mask(kg: TripleSplits, device: torch.device) -> torch.Tensor:
    """known[h, r, t]: (h, r, t) is a true triple in any split (the filter of the filtered metrics)."""
    e, rel = len(kg.entities), len(kg.relations)
    known = torch.zeros(e, rel, e, dtype=torch.bool, device=device)
    for h, r, t in kg.splits.values():
        known[h.to(device), r.to(device), t.to(device)] = True
    return known


def _filtered_ranks(scores: torch.Tensor, truth: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """Rank of each row's true candidate among the candidates not known true; ties count half."""
    true_score = scores.gather(1, truth[:, None])
    others = ~known
    higher = ((scores > true_score) & others).sum(1)
    tied = ((scores == true_score) & others).sum(1)
    return 1 + higher + tied / 2


def _evaluate(model: LinkPredictor, kg: TripleSplits, known: torch.Tensor, device: torch.device):
    """Filtered MRR and Hits@10 over test triples, each ranked both as tail and as head query."""
    model.eval()
    h, r, t = (x.to(device) for x in kg.splits["test"])
    with torch.no_grad():
        z = model.encode(*_message_graph(kg, device))
        w = model.relation[r]
        tail_scores = (z[h] * w) @ z.T  # (h, r, ?) against every entity
        head_scores = (z[t] * w) @ z.T  # (?, r, t): DistMult is symmetric in head and tail
    ranks = torch.cat(
        [
            _filtered_ranks(tail_scores, t, known[h, r, :]),
            _filtered_ranks(head_scores, h, known[:, r, t].T),
        ]
    )
    return (1 / ranks).mean().item(), (ranks <= 10).float().mean().item()


def _random_baseline(kg: TripleSplits, known: torch.Tensor, device: torch.device) -> tuple[float, float]:
    """Expected filtered MRR and Hits@10 of a uniformly random ranking (n candidates: E[1/rank] = H_n / n)."""
    h, r, t = (x.to(device) for x in kg.splits["test"])
    # Candidates: the true entity plus every entity not known true for the query.
    n = torch.cat([(~known[h, r, :]).sum(1), (~known[:, r, t]).sum(0)]).double() + 1
    harmonic = torch.cumsum(1 / torch.arange(1, len(kg.entities) + 2, device=device, dtype=torch.double), 0)
    mrr = (harmonic[n.long() - 1] / n).mean().item()
    return mrr, (n.clamp(max=10) / n).mean().item()


def run(device: torch.device) -> None:
    print("\n== graph: link prediction, 2-layer R-GCN encoder + DistMult on UMLS (pykeen 1.11.1 files)")
    try:
        kg = pykeen_triples("umls")
    except DataUnavailable as err:
        print(f"skipped: the pykeen==1.11.1 wheel is not cached and could not be downloaded ({err})")
        return
    from torch_geometric.nn import RGCNConv as PygRGCNConv

    from relconv.graph import RGCNConv

    sizes = " / ".join(f"{len(kg.splits[s][0]):,}" for s in ("train", "valid", "test"))
    print(
        f"{len(kg.entities)} entities, {len(kg.relations)} relations (x2 with inverses), "
        f"train / valid / test triples {sizes}; {EPOCHS} full-batch epochs, {NEGATIVES} negatives each"
    )
    known = _known_mask(kg, device)
    num_e, num_r = len(kg.entities), len(kg.relations)
    torch.manual_seed(0)
    ours = LinkPredictor(RGCNConv, num_e, num_r).to(device)
    theirs = LinkPredictor(PygRGCNConv, num_e, num_r).to(device)
    theirs.load_state_dict(ours.state_dict())
    plain = LinkPredictor(None, num_e, num_r).to(device)
    print(f"{'model':<44}{'test MRR':>9}{'Hits@10':>9}{'epoch ms':>10}")
    rows = (
        ("R-GCN + DistMult, relconv.graph.RGCNConv", ours),
        ("R-GCN + DistMult, torch_geometric RGCNConv", theirs),
        ("DistMult alone (no encoder)", plain),
    )
    for name, model in rows:
        torch.manual_seed(1)  # the same dropout masks for both libraries
        times = _train(model, kg, device)
        mrr, hits = _evaluate(model, kg, known, device)
        print(f"{name:<44}{mrr:>9.3f}{hits:>9.3f}{statistics.mean(times) * 1e3:>10.1f}")
    mrr, hits = _random_baseline(kg, known, device)
    print(f"{'random ranking (expected)':<44}{mrr:>9.3f}{hits:>9.3f}")
    print("(filtered, ranked against all entities as head and as tail; epoch ms is the mean over all epochs)")
