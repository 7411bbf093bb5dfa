#!/usr/bin/env python3
"""Trains a logistic regression with PyTorch on the CNTK tutorial's data (examples/data/logreg.ctf: 2 features,
1 label per line), reading the CTF file with cntkio.torch — shuffled per epoch as CNTK shuffles its sweeps.
By default batches come from cntkio.torch.Loader (native threads, on the GPU when there is one); with
--workers N from a DataLoader with N worker processes over cntkio.torch.IterableDataset.

    pip install . torch          # from the repository root
    python examples/train_logreg.py [--epochs 20] [--workers 2] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Optional

import torch
from torch.utils.data import DataLoader

import cntkio
import cntkio.torch

DATA = Path(__file__).resolve().parent / "data" / "logreg.ctf"


def main(argv: Optional[List[str]] = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=25, help="samples per minibatch (CNTK's minibatch size)")
    ap.add_argument("--workers", type=int, default=None, help="read through a DataLoader with this many workers")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)

    streams = cntkio.StreamDefs(
        features=cntkio.StreamDef(field="features", shape=2),
        labels=cntkio.StreamDef(field="labels", shape=1),
    )
    device = torch.device(args.device)
    # Small chunks: with shuffling, chunks are dealt to the DataLoader workers (CNTK's distributed reading).
    train = cntkio.CTFDeserializer(args.data, streams, chunkSizeInBytes=1024)
    if args.workers is None:
        # Batches assembled by native threads and copied to the device ahead of the step.
        ds = cntkio.torch.Loader(train, batch_size=args.batch_size, shuffle=True, seed=args.seed, device=device)
        loader = ds
    else:
        ds = cntkio.torch.IterableDataset(train, batch_size=args.batch_size, shuffle=True, seed=args.seed)
        loader = DataLoader(ds, batch_size=None, num_workers=args.workers)

    model = torch.nn.Linear(2, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for epoch in range(args.epochs):
        ds.set_epoch(epoch)  # epoch e is shuffled with seed + e: CNTK's sweep e
        total, seen = 0.0, 0
        for batch in loader:
            x, y = batch["features"].to(device), batch["labels"].to(device)  # (samples, 2), (samples, 1) float32
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item() * len(x)
            seen += len(x)
        print(f"epoch {epoch + 1:2d}: loss {total / seen:.4f} over {seen} samples")

    data = cntkio.CTFDeserializer(args.data, streams).read()  # the whole file, in order
    x = torch.from_numpy(data["features"].values).to(device)
    y = torch.from_numpy(data["labels"].values).to(device)
    with torch.no_grad():
        accuracy = ((model(x) > 0).float() == y).float().mean().item()
    print(f"accuracy on {len(x)} samples: {accuracy:.3f}")
    return accuracy


if __name__ == "__main__":
    main()
