#!/usr/bin/python3
"""The peer: PyTorch (Debian's python3-torch, float32, CPU) training the same Llama as
trident (RMSNorm, rotary embeddings in Hugging Face's rotate-half convention, grouped-query
attention, SwiGLU, untied lm_head, no biases; AdamW, clipping at 1.0, random tokens), in
plain torch ops. Prints one table row in the format of build/bench/throughput. Run with
Debian's /usr/bin/python3; tuned: benchmarks/pytorch_tuned.sh /usr/bin/python3 ...

  --reference FILE: instead, the float32 loss of a reference's step 0
  (shared/reference/llama_ref_a.h5) beside its float64 loss, as a check of the model."""
import argparse, math, os, re, time
import torch
from torch_peer import row

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=4)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--kv-heads", type=int, default=2)
p.add_argument("--dim", type=int, default=128)
p.add_argument("--ffn", type=int, default=352)
p.add_argument("--seq", type=int, default=128)
p.add_argument("--vocab", type=int, default=256)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
p.add_argument("--theta", type=float, default=10000.0)
p.add_argument("--peak", type=float, default=0.0, help="sgemm peak GFLOP/s measured in the same run")
p.add_argument("--threads", type=int, default=os.cpu_count())
p.add_argument("--bf16", action="store_true", help="forward under torch.autocast(cpu, bfloat16): PyTorch's own mixed precision")
p.add_argument("--reference", help="HDF5 reference: print its step-0 loss beside this model's")
a = p.parse_args()
if a.reference:
    import h5py
    ref = h5py.File(a.reference, "r")
    at = ref.attrs
    a.layers, a.heads, a.kv_heads, a.dim, a.ffn = (int(at[k]) for k in ("n_layer", "n_head", "n_kv_head", "d_model", "ffn_dim"))
    a.seq, a.vocab, a.batch, a.theta = int(at["seq_len"]), int(at["vocab_size"]), int(at["batch_size"]), float(at["rope_theta"])
torch.set_num_threads(a.threads)  # Debian's build starts with one
torch.manual_seed(0)
L, H, KV, d, F, T, V, B = a.layers, a.heads, a.kv_heads, a.dim, a.ffn, a.seq, a.vocab, a.batch
hd = d // H
EPS = 1e-5


def linear(i, o):
    return torch.nn.Linear(i, o, bias=False)


class RMSNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
        self.q_proj, self.k_proj, self.v_proj = linear(d, H * hd), linear(d, KV * hd), linear(d, KV * hd)
        self.o_proj = linear(H * hd, d)
        self.gate_proj, self.up_proj, self.down_proj = linear(d, F), linear(d, F), linear(F, d)

    def forward(self, x, cos, sin, mask):
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, H, hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, KV, hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, KV, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)  # HF's repeat_kv
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.o_proj((att @ v).transpose(1, 2).reshape(B, T, H * hd))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(V, d)
        self.layers = torch.nn.ModuleList(Block() for _ in range(L))
        self.norm = RMSNorm()
        self.lm_head = linear(d, V)
        for m in self.modules():  # Hugging Face's initializer_range
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(m.weight, std=0.02)
        inv_freq = 1.0 / (a.theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().float(), emb.sin().float()
        self.mask = ~torch.tril(torch.ones(T, T, dtype=torch.bool))

    def forward(self, idx, tgt):
        x = self.embed_tokens(idx)
        for b in self.layers:
            x = b(x, self.cos, self.sin, self.mask)
        logits = self.lm_head(self.norm(x))
        return torch.nn.functional.cross_entropy(logits.view(-1, V), tgt.reshape(-1))


model = Llama()
if a.reference:
    def hf_name(k):  # layers.0.q_proj.weight -> model.layers.0.self_attn.q_proj.weight
        k = re.sub(r"\.([qkvo]_proj)", r".self_attn.\1", re.sub(r"\.((gate|up|down)_proj)", r".mlp.\1", k))
        return k if k.startswith("lm_head") else "model." + k
    hf = {hf_name(k): v for k, v in model.state_dict().items()}
    assert set(hf) == set(ref["params"].keys()), set(hf) ^ set(ref["params"].keys())
    with torch.no_grad():
        for name, t in hf.items():
            t.copy_(torch.from_numpy(ref["params/" + name][()]))
    batch = torch.from_numpy(ref["batches/tokens"][0]).long()
    loss, want = float(model(batch[:, :T], batch[:, 1:])), float(ref["step0/loss"][()])
    print(f"step-0 loss: PyTorch fp32 {loss:.7f}, reference fp64 {want:.7f}, relative error {abs(loss - want) / want:.2e}")
    raise SystemExit(0 if abs(loss - want) <= 1e-5 * want else 1)

opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
idx, tgt = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        loss = model(idx, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss)


for w in range(a.warmup):
    loss = step()
    if w == 0 and os.environ.get("PEER_PRINT_LOSS"):
        print(f"loss at init {loss:.4f} (ln V = {math.log(V):.4f})")
t0 = time.perf_counter()
for _ in range(a.steps):
    step()
dt = (time.perf_counter() - t0) / a.steps
n = sum(p.numel() for p in model.parameters()) - model.embed_tokens.weight.numel()  # as trident counts
flops = 6 * n + 12 * L * T * (H * hd)
describe = f"llama L{L} H{H}" + (f" KV{KV}" if KV != H else "") + f" d{d}" + (f" F{F}" if F != 4 * d else "") + f" T{T} V{V}"
print(row(torch, describe + (" [autocast bf16]" if a.bf16 else ""), B, T, dt, flops, a.peak))
