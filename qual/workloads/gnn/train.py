"""Training RGAT through a feature loader: the measured window of steps with its stage
breakdown (sample, gather, transfer, train), then validation accuracy."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from qual.workloads.gnn.spec import STAGES
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
    accuracy: float | None     # validation accuracy after training: the mean of its batches
    # (None: not validated, in a repetition before a repeated run's last)
    interval: tuple | None     # its 95 % confidence interval over the batches (None: one)
    batches: int               # validation batches
    losses: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"loader": self.loader, "steps": self.steps, "measured": self.measured,
                "e2e_s": self.e2e_s, "stages": self.stages, "rows": self.rows,
                "accuracy": self.accuracy, "accuracy_interval": self.interval and list(self.interval),
                "accuracy_batches": self.batches,
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
          progress=None, on_pace=None, validate: bool = True) -> Training:
    """Train to the profile's epochs (and at least warm-up + measured steps), timing the steps
    of the measured window end to end (less what the measurement itself spent on a batch); then
    the validation accuracy, unless not `validate`. window_start and window_end run around the
    window (GIDS resets its counters at the warm-up's end and reports them 100 steps later).
    on_pace(seconds a step, steps in all) is called once, after the first steps, so the caller
    can say how long the run will take."""
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
    mean, interval, batches = accuracy(model, loader, val_ids) if validate else (None, None, 0)
    return Training(loader.name, step, min(measure, max(0, step - warmup)), e2e, stages, rows,
                    mean, interval, batches, losses)


@torch.no_grad()
def accuracy(model, loader, ids: np.ndarray) -> tuple[float, tuple | None, int]:
    """The mean of the validation batches' accuracies, its 95 % confidence interval (Student's
    t over the batches) and how many batches there were."""
    model.eval()
    per_batch = [float((model(b.x, b.sample.blocks).argmax(1) == b.y).float().mean())
                 for b in loader.batches(ids)]
    model.train()
    return (float(np.mean(per_batch)), mean_interval(per_batch), len(per_batch))


# Student's t, 97.5th percentile, by degrees of freedom (1..30); the normal's beyond
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def mean_interval(values: list[float]) -> tuple[float, float] | None:
    """The 95 % confidence interval of the mean of values; None for a single value (no
    spread known)."""
    n = len(values)
    mean = float(np.mean(values))
    if n < 2:
        return None
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.960
    half = t * float(np.std(values, ddof=1)) / math.sqrt(n)
    return (mean - half, mean + half)


def feature_only_accuracy(features: np.ndarray, labels: np.ndarray, train_ids: np.ndarray,
                          val_ids: np.ndarray, *, epochs: int = 30, seed: int = 0) -> float:
    """The best validation accuracy, over its epochs, of an MLP (1024-256-classes, dropout 0.5,
    Adam) trained on the papers' own features alone, with no graph: how much of the answer a
    paper's features hold."""
    torch.manual_seed(seed)
    x, y = torch.from_numpy(np.array(features, dtype=np.float32)), torch.from_numpy(labels)
    mlp = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 256), torch.nn.ReLU(),
                              torch.nn.Dropout(0.5), torch.nn.Linear(256, int(labels.max()) + 1))
    opt = torch.optim.Adam(mlp.parameters(), lr=1e-3, weight_decay=1e-4)
    rng, best = np.random.default_rng(seed), 0.0
    for _ in range(epochs):
        mlp.train()
        order = torch.from_numpy(train_ids[rng.permutation(len(train_ids))])
        for i in range(0, len(order), 512):
            b = order[i:i + 512]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(mlp(x[b]), y[b]).backward()
            opt.step()
        mlp.eval()
        with torch.no_grad():
            best = max(best, float((mlp(x[val_ids]).argmax(1) == y[val_ids]).float().mean()))
    return best
