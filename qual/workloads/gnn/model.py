"""RGAT as MLPerf's reference shapes it (GLT examples/igbh/rgnn.py): per layer, one GATConv
per relation (no added self-loops), summed per destination type, leaky ReLU and dropout
between layers, a linear head on the paper seeds; run over the sampler's layered blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv

from qual.workloads.gnn.graph import Block


def _key(rel: tuple[str, str, str]) -> str:
    return "__".join(rel)


class RGAT(torch.nn.Module):
    def __init__(self, relations: list[tuple[str, str, str]], in_dim: int, hidden: int,
                 heads: int, classes: int, layers: int, dropout: float = 0.2):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of {heads} heads")
        self.layers = torch.nn.ModuleList()
        for i in range(layers):
            dim = in_dim if i == 0 else hidden
            self.layers.append(torch.nn.ModuleDict({
                _key(r): GATConv((dim, dim), hidden // heads, heads=heads, add_self_loops=False)
                for r in relations}))
        self.head = torch.nn.Linear(hidden, classes)
        self.dropout = dropout

    def forward(self, x: dict, blocks: list[Block]) -> torch.Tensor:
        h = x
        for i, (convs, block) in enumerate(zip(self.layers, blocks)):
            out = {}
            for rel, (src, dst) in block.edges.items():
                s, _, d = rel
                edge_index = torch.stack([torch.from_numpy(src), torch.from_numpy(dst)]).to(
                    h[s].device)
                y = convs[_key(rel)]((h[s], h[d][:block.n_dst[d]]), edge_index)
                out[d] = y if d not in out else out[d] + y
            for t, n in block.n_dst.items():  # a type no relation reached this time
                if n and t not in out:
                    out[t] = h[t].new_zeros((n, self.head.in_features))
            if i < len(blocks) - 1:
                out = {t: F.dropout(F.leaky_relu(v), self.dropout, self.training)
                       for t, v in out.items()}
            h = out
        return self.head(h["paper"])
