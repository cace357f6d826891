"""A few training steps of a small transformer, for the shim's PyTorch check.

Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that every tensor is a
cudaMalloc/cudaFree. Prints the losses (compared between the native and the
shim run only loosely: both must be finite and decrease) and exits non-zero
on any CUDA error.
"""
import math
import sys

import torch

torch.manual_seed(0)
device = "cuda"
model = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, batch_first=True),
    num_layers=2,
).to(device)
head = torch.nn.Linear(128, 1).to(device)
optimizer = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-3)
losses = []
for step in range(8):
    length = 32 + 16 * (step % 4)  # varying sizes, as NLP batches
    x = torch.randn(16, length, 128, device=device)
    target = x.mean(dim=(1, 2), keepdim=False).unsqueeze(1)
    loss = torch.nn.functional.mse_loss(head(model(x).mean(dim=1)), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
torch.cuda.synchronize()
print("losses", " ".join(f"{v:.4f}" for v in losses))
ok = all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
print("steps ok" if ok else "steps FAILED")
sys.exit(0 if ok else 1)
