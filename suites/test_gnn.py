"""GNN qualification, seeds 000/002: RGAT trained on an IGBH graph through a GIDS/BaM-style
loader on the native engine and through the DGL-style mmap baseline: accuracy of both (the
loaders delivered the right data), GIDS's speedup, and its cache behaviour: the family's tests
(qual.workloads.gnn.TESTS); here, what only a GPU can check."""

import allure
import numpy as np
import pytest

from qual.workloads import gnn

pytestmark = [pytest.mark.gnn]


@pytest.mark.gpu
@allure.feature("GNN accelerator destination")
def test_gids_features_reach_the_accelerator(table, target):
    """Through pinned staging and an asynchronous copy, the rows on the accelerator equal the
    store's."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from qual.workloads.gnn.graph import Graph
    from qual.workloads.gnn.loaders import GidsLoader
    from qual.workloads.gnn.store import build

    dataset = gnn.dataset_of(target, table)
    store = build(dataset, target.directory, page_size=table["page_size"])
    graph = Graph.of(dataset)
    loader = GidsLoader(store, graph, dataset.labels(), cache_pages=gnn.cache_pages(table, store),
                        window=table["window"], threshold=0, cpu_rows=None,
                        fanouts=table["fanouts"], batch_size=table["batch_size"], seed=1,
                        device="cuda")
    try:
        batch = next(loader.batches(np.arange(table["batch_size"])))
        torch.cuda.synchronize()
        rows = loader.rows_of(batch.sample)
        got = torch.cat([batch.x[t] for t in batch.x]).cpu().numpy()
        assert np.array_equal(got.view(np.uint32), store.memmap()[rows].view(np.uint32))
    finally:
        loader.close()
