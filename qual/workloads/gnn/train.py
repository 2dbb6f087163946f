"""Training RGAT through a feature loader: the measured window of steps with its stage
breakdown (sample, gather, transfer, train), then validation accuracy."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from qual.workloads.gnn import STAGES
from qual.workloads.gnn.igbh import FEATURE_DIM
from qual.workloads.gnn.model import RGAT



@dataclass
class Training:
    loader: str
    steps: int                 # steps trained in all
    measured: int              # steps in the measured window
    e2e_s: float               # wall time of the measured window
    stages: dict               # stage -> seconds within the measured window
    rows: int                  # feature rows delivered within the measured window
    accuracy: float            # validation accuracy after training
    losses: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"loader": self.loader, "steps": self.steps, "measured": self.measured,
                "e2e_s": self.e2e_s, "stages": self.stages, "rows": self.rows,
                "accuracy": self.accuracy,
                "first_loss": self.losses[0] if self.losses else None,
                "last_loss": self.losses[-1] if self.losses else None}


def splits(papers: int, seed: int = 42) -> tuple[np.ndarray, np.ndarray]:
    """60 % train, 20 % validation of a random permutation of the papers (the IGB loaders'
    split; seed 42 as MLPerf's)."""
    perm = np.random.default_rng(seed).permutation(papers)
    return perm[:int(0.6 * papers)], perm[int(0.6 * papers):int(0.8 * papers)]


PACE_STEPS = 8  # steps timed (after the first) to estimate how long training will take


def train(loader, relations, *, table: dict, train_ids: np.ndarray, val_ids: np.ndarray,
          seed: int, window_start=None, window_end=None,
          progress=None, on_pace=None) -> Training:
    """Train to the profile's epochs (and at least warm-up + measured steps), timing the steps
    of the measured window end to end (less what the measurement itself spent on a batch); then
    the validation accuracy. window_start and window_end run around the window (GIDS resets its
    counters at the warm-up's end and reports them 100 steps later). on_pace(seconds a step,
    steps in all) is called once, after the first steps, so the caller can say how long the
    run will take."""
    torch.manual_seed(seed)
    model = RGAT(relations, FEATURE_DIM, table["hidden"], table["heads"], table["classes"],
                 len(table["fanouts"])).to(loader.device)
    opt = torch.optim.Adam(model.parameters(), lr=table["lr"])
    loss_fn = torch.nn.CrossEntropyLoss()
    warmup, measure = table["warmup"], table["steps"]
    per_epoch = -(-len(train_ids) // table["batch_size"])
    total = max(table["epochs"] * per_epoch, warmup + measure)
    stages = dict.fromkeys(STAGES, 0.0)
    e2e, losses, step, rows = 0.0, [], 0, 0
    rng = np.random.default_rng(seed)
    model.train()
    while step < total:
        order = train_ids[rng.permutation(len(train_ids))]
        batches = loader.batches(order)
        while step < total:
            in_window = warmup <= step < warmup + measure
            if step == warmup and window_start:
                window_start()
            t0 = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            t1 = time.perf_counter()
            opt.zero_grad()
            loss = loss_fn(model(batch.x, batch.sample.blocks), batch.y)
            loss.backward()
            opt.step()
            if loader.device.type == "cuda":
                torch.cuda.synchronize(loader.device)
            t2 = time.perf_counter()
            losses.append(loss.item())
            if in_window:
                e2e += t2 - t0 - batch.untimed
                rows += batch.sample.node_count
                for k, v in batch.times.items():
                    stages[k] += v
                stages["train"] += t2 - t1
            step += 1
            if step == 1:
                paced = t2  # the first step pays for start-up; pace from the next ones
            elif step == PACE_STEPS + 1 and on_pace:
                on_pace((t2 - paced) / PACE_STEPS, total)
            if step == warmup + measure and window_end:
                window_end()
            if progress and step % 10 == 0:
                progress(f"{loader.name}: step {step}/{total}, loss {losses[-1]:.3f}", step / total)
        batches.close()
    return Training(loader.name, step, min(measure, max(0, step - warmup)), e2e, stages, rows,
                    accuracy(model, loader, val_ids), losses)


@torch.no_grad()
def accuracy(model, loader, ids: np.ndarray) -> float:
    model.eval()
    right = 0
    for batch in loader.batches(ids):
        right += int((model(batch.x, batch.sample.blocks).argmax(1) == batch.y).sum())
    model.train()
    return right / len(ids)
