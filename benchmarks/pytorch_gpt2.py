#!/usr/bin/python3
"""The peer: PyTorch (Debian's python3-torch, float32, CPU) training the same GPT-2 as
trident (pre-LN, GELU-tanh, tied embeddings, AdamW, random tokens). Prints one table row
in the format of build/bench/throughput. Run with Debian's /usr/bin/python3; tuned:
benchmarks/pytorch_tuned.sh /usr/bin/python3 benchmarks/pytorch_gpt2.py ..."""
import argparse, math, os, time
import torch
from torch_peer import row

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=4)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--dim", type=int, default=128)
p.add_argument("--seq", type=int, default=128)
p.add_argument("--vocab", type=int, default=256)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
p.add_argument("--peak", type=float, default=0.0, help="sgemm peak GFLOP/s measured in the same run")
p.add_argument("--threads", type=int, default=os.cpu_count())
p.add_argument("--bf16", action="store_true", help="forward under torch.autocast(cpu, bfloat16): PyTorch's own mixed precision")
a = p.parse_args()
torch.set_num_threads(a.threads)  # Debian's build starts with one
torch.manual_seed(0)
L, H, d, T, V, B = a.layers, a.heads, a.dim, a.seq, a.vocab, a.batch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.c_attn, self.c_proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.c_fc, self.mlp_proj = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=-1)
        q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // H)
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf")).softmax(-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).reshape(B, T, d))
        return x + self.mlp_proj(torch.nn.functional.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(V, d), torch.nn.Embedding(T, d)
        self.h = torch.nn.ModuleList(Block() for _ in range(L))
        mask = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
        for b in self.h:
            b.mask = mask
        self.ln_f = torch.nn.LayerNorm(d)

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        return torch.nn.functional.cross_entropy(logits.view(-1, V), tgt.view(-1))


model = GPT()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
idx, tgt = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        loss = model(idx, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


for _ in range(a.warmup):
    step()
t0 = time.perf_counter()
for _ in range(a.steps):
    step()
dt = (time.perf_counter() - t0) / a.steps
n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
print(row(torch, f"gpt2 L{L} H{H} d{d} T{T} V{V}" + (" [autocast bf16]" if a.bf16 else ""), B, T, dt, 6 * n + 12 * L * T * d, a.peak))
