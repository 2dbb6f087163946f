"""The graph a GNN step samples: IGBH's relations in both directions as CSC, uniform neighbour
sampling from the seeds outward into layered blocks (DGL's message-flow graphs), and the
weighted reverse PageRank that picks the hot nodes for the CPU buffer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qual import engine
from qual.workloads.gnn.igbh import IGBH, NODE_TYPES, RELATIONS


@dataclass(frozen=True)
class Relation:
    """Messages flow src -> dst; the CSC lists every dst node's in-neighbours."""

    src: str
    name: str
    dst: str
    indptr: np.ndarray
    indices: np.ndarray

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.src, self.name, self.dst)


def _csc(src: np.ndarray, dst: np.ndarray, num_dst: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(num_dst + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
    return indptr, np.ascontiguousarray(src[order], dtype=np.int64)


@dataclass(frozen=True)
class Graph:
    counts: dict
    relations: tuple[Relation, ...]

    @classmethod
    def of(cls, dataset: IGBH) -> Graph:
        """Each IGBH relation and its reverse (rev_<name>), as GLT and MLPerf's RGAT use them."""
        rels = []
        for s, r, d in RELATIONS:
            e = np.asarray(dataset.edges((s, r, d)))
            rels.append(Relation(s, r, d, *_csc(e[:, 0], e[:, 1], dataset.counts[d])))
            rels.append(Relation(d, f"rev_{r}", s, *_csc(e[:, 1], e[:, 0], dataset.counts[s])))
        return cls(dict(dataset.counts), tuple(rels))


@dataclass
class Block:
    """One layer of message passing: edges from the outer frontier (src) to the inner (dst),
    in local indices; every type's dst nodes are the first n_dst of its src nodes."""

    n_src: dict
    n_dst: dict
    edges: dict  # relation key -> (src index, dst index) arrays


@dataclass
class Sample:
    seeds: np.ndarray        # paper ids
    nodes: dict              # node type -> ids of the outermost frontier (seeds first)
    blocks: list[Block]      # outermost first

    @property
    def node_count(self) -> int:
        return sum(len(v) for v in self.nodes.values())


def _merge(existing: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """existing followed by the new ids not already in it (first occurrence order), and the
    position of each new id in that list."""
    both = np.concatenate([existing, new])
    uniq, first = np.unique(both, return_index=True)
    order = np.argsort(first, kind="stable")
    nodes = uniq[order]
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return nodes, rank[np.searchsorted(uniq, new)]


def sample(graph: Graph, seeds: np.ndarray, fanouts: list[int], seed: int) -> Sample:
    """Up to fanouts[h] neighbours per relation at hop h + 1 from the seeds (paper nodes);
    deterministic for (seed, node)."""
    frontier = {t: np.empty(0, dtype=np.int64) for t in NODE_TYPES}
    frontier["paper"] = np.asarray(seeds, dtype=np.int64)
    blocks = []
    for hop, fanout in enumerate(fanouts):
        drawn = []
        for i, rel in enumerate(graph.relations):
            dst = frontier[rel.dst]
            if len(dst) == 0:
                continue
            src, pos = engine.sample(rel.indptr, rel.indices, dst, fanout,
                                     seed * 1_000_003 + hop * 101 + i)
            drawn.append((rel, src, pos))
        nxt, edges = dict(frontier), {}
        for t in NODE_TYPES:
            mine = [(rel, src, pos) for rel, src, pos in drawn if rel.src == t]
            if not mine:
                continue
            nodes, local = _merge(frontier[t], np.concatenate([src for _, src, _ in mine]))
            nxt[t] = nodes
            at = 0
            for rel, src, pos in mine:
                edges[rel.key] = (local[at:at + len(src)], pos)
                at += len(src)
        blocks.insert(0, Block(n_src={t: len(v) for t, v in nxt.items()},
                               n_dst={t: len(v) for t, v in frontier.items()}, edges=edges))
        frontier = nxt
    return Sample(seeds=np.asarray(seeds, dtype=np.int64), nodes=frontier, blocks=blocks)


def hot_rows(graph: Graph, offsets: dict, fanout: int, *, iterations: int = 20,
             damping: float = 0.85) -> np.ndarray:
    """Global rows, hottest first, by weighted reverse PageRank (Data Tiering, KDD'22, as GIDS
    uses it): a node's rank flows to the neighbours sampling would fetch for it, weighted by
    the chance each is drawn, min(1, fanout / in-degree)."""
    n = sum(graph.counts.values())
    rank = np.full(n, 1.0 / n)
    plans = []
    for rel in graph.relations:
        deg = np.diff(rel.indptr)
        dst_local = np.repeat(np.arange(len(deg)), deg)
        weight = np.minimum(1.0, fanout / np.maximum(deg, 1))[dst_local]
        plans.append((rel.indices + offsets[rel.src], dst_local + offsets[rel.dst], weight))
    for _ in range(iterations):
        new = np.full(n, (1 - damping) / n)
        for src, dst, weight in plans:
            new += damping * np.bincount(src, weights=rank[dst] * weight, minlength=n)
        rank = new / new.sum()
    return np.argsort(-rank, kind="stable")
