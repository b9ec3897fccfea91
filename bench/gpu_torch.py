#!/usr/bin/env python3
"""The PyTorch side of scripts/gpu-check.sh: the same two models tepdist's `lenet` and `widecnn`
presets build, trained for a fixed number of steps on the same GPU, in samples per second.

Each step copies a host batch to the device (as tepdist's step does), runs forward, loss, backward
and SGD with momentum. Two settings: strict float32 (TF32 off in cuDNN and cuBLAS, what tepdist's
CUDA backend computes) and PyTorch's defaults (cuDNN may use TF32 for convolutions). Prints one
JSON object per line."""
import json
import sys
import time

import torch
import torch.nn as nn


def lenet():
    return nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(20, 50, 5), nn.MaxPool2d(2),
                         nn.ReLU(), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))


def widecnn():
    return nn.Sequential(nn.Conv2d(1, 64, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1),
                         nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(6272, 512), nn.ReLU(),
                         nn.Linear(512, 10))


def run(name, make, batch, steps, strict):
    torch.backends.cudnn.allow_tf32 = not strict
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1)
    model = make().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    xs = [torch.randn(batch, 1, 28, 28) for _ in range(4)]
    ys = [torch.randint(0, 10, (batch,)) for _ in range(4)]

    def step(i):
        x = xs[i % 4].cuda(non_blocking=False)
        y = ys[i % 4].cuda(non_blocking=False)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for i in range(20):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(i)
    last = float(loss)  # the loss out, as tepdist's step returns it
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return {"framework": "pytorch " + torch.__version__, "model": name, "batch": batch, "steps": steps,
            "math": "fp32" if strict else "default (tf32 convolutions)", "samples_per_s": round(batch * steps / dt, 1),
            "last_loss": round(last, 4)}


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    print(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "cudnn": torch.backends.cudnn.version()}), flush=True)
    for name, make in (("lenet", lenet), ("widecnn", widecnn)):
        for batch in (64, 512):
            for strict in (True, False):
                print(json.dumps(run(name, make, batch, steps, strict)), flush=True)


if __name__ == "__main__":
    main()
