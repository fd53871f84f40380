#!/usr/bin/python3
"""Write a GPT-2 training reference (HDF5) computed by PyTorch autograd in float64.

The file holds initial float32 parameters, token batches, the loss and every
gradient at step 0, and the parameters after `steps` AdamW steps with global
grad-norm clipping. Layout and semantics: shared/reference/FORMAT.md.
--eod ID: packed documents with document masking, see tests/reference/README.md.
"""
import argparse, math
import h5py, numpy as np, torch

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--dim", type=int, default=64)
p.add_argument("--seq", type=int, default=16)
p.add_argument("--vocab", type=int, default=97)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--lr", type=float, default=3e-3)
p.add_argument("--wd", type=float, default=0.1)
p.add_argument("--clip", type=float, default=1.0)
p.add_argument("--seed", type=int, default=1234)
p.add_argument("--eod", type=int, default=None, help="end-of-document token: packed documents, document mask")
a = p.parse_args()
torch.manual_seed(a.seed)
L, H, d, T, V, B = a.layers, a.heads, a.dim, a.seq, a.vocab, a.batch
hd = d // H
B1, B2, EPS, LN_EPS = 0.9, 0.95, 1e-8, 1e-5

def w(*shape): return (0.02 * torch.randn(*shape)).float()
def ln_w(n): return (1.0 + 0.1 * torch.randn(n)).float()
def ln_b(n): return (0.1 * torch.randn(n)).float()

params = {"wte.weight": w(V, d), "wpe.weight": w(T, d)}
for i in range(L):
    q = f"h.{i}."
    params.update({
        q + "ln_1.weight": ln_w(d), q + "ln_1.bias": ln_b(d),
        q + "attn.c_attn.weight": w(3 * d, d), q + "attn.c_attn.bias": w(3 * d),
        q + "attn.c_proj.weight": w(d, d), q + "attn.c_proj.bias": w(d),
        q + "ln_2.weight": ln_w(d), q + "ln_2.bias": ln_b(d),
        q + "mlp.c_fc.weight": w(4 * d, d), q + "mlp.c_fc.bias": w(4 * d),
        q + "mlp.c_proj.weight": w(d, 4 * d), q + "mlp.c_proj.bias": w(d),
    })
params["ln_f.weight"] = ln_w(d); params["ln_f.bias"] = ln_b(d)
def packed_rows(steps, B, T, V, eod):
    """Rows of packed documents: random tokens from [0, V) except eod, each document ended by
    eod; lengths 1 .. T/3, the last document of a row cut off. Step 0: row 0 starts with a
    one-token document, row 1 has two eod in a row, row 2 is one document over its T inputs."""
    if B < 3 or not 0 <= eod < V: raise SystemExit("--eod needs --batch >= 3 and 0 <= ID < vocab")
    out = torch.empty(steps, B, T + 1, dtype=torch.int32)
    for t in range(steps):
        for b in range(B):
            row = torch.randint(0, V - 1, (T + 1,), dtype=torch.int32)
            row += (row >= eod).int()
            if t == 0 and b == 2: lens = [T + 1]
            else:
                lens = [1] if (t == 0 and b == 0) else []
                if t == 0 and b == 1: lens = [int(torch.randint(2, max(2, T // 3) + 1, ())), 1]
                while sum(lens) < T + 1: lens.append(int(torch.randint(1, max(2, T // 3) + 1, ())))
            ends = torch.tensor(lens).cumsum(0) - 1
            row[ends[ends <= T]] = eod
            out[t, b] = row
    return out
if a.eod is None: tokens = torch.randint(0, V, (a.steps, B, T + 1), dtype=torch.int32)
else: tokens = packed_rows(a.steps, B, T, V, a.eod)

P = {k: v.double().clone().requires_grad_(True) for k, v in params.items()}

def gelu(x): return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
def ln(x, g, b):
    mu = x.mean(-1, keepdim=True); var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + LN_EPS) * g + b

def loss_fn(batch):
    idx, tgt = batch[:, :T].long(), batch[:, 1:].long()
    x = P["wte.weight"][idx] + P["wpe.weight"][torch.arange(T)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    if a.eod is not None:  # same document: as many eod tokens strictly before i as before j
        end = idx == a.eod; doc = end.long().cumsum(1) - end.long()
        mask = (mask & (doc[:, :, None] == doc[:, None, :]))[:, None]  # [B, 1, T, T]
    for i in range(L):
        q = f"h.{i}."
        h = ln(x, P[q + "ln_1.weight"], P[q + "ln_1.bias"])
        qkv = h @ P[q + "attn.c_attn.weight"].T + P[q + "attn.c_attn.bias"]
        qq, kk, vv = qkv.split(d, dim=-1)
        qq, kk, vv = (t.view(B, T, H, hd).transpose(1, 2) for t in (qq, kk, vv))
        att = (qq @ kk.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ vv).transpose(1, 2).reshape(B, T, d)
        x = x + y @ P[q + "attn.c_proj.weight"].T + P[q + "attn.c_proj.bias"]
        h = ln(x, P[q + "ln_2.weight"], P[q + "ln_2.bias"])
        h = gelu(h @ P[q + "mlp.c_fc.weight"].T + P[q + "mlp.c_fc.bias"])
        x = x + h @ P[q + "mlp.c_proj.weight"].T + P[q + "mlp.c_proj.bias"]
    x = ln(x, P["ln_f.weight"], P["ln_f.bias"])
    logits = x @ P["wte.weight"].T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))

m = {k: torch.zeros_like(v) for k, v in P.items()}
s = {k: torch.zeros_like(v) for k, v in P.items()}
losses, norms = [], []
with h5py.File(a.out, "w") as f:
    f.attrs.update(dict(format="trident-reference-v1", model="gpt2", n_layer=L, n_head=H,
                        d_model=d, seq_len=T, vocab_size=V, batch_size=B, steps=a.steps,
                        layernorm_eps=LN_EPS, lr=a.lr, beta1=B1, beta2=B2, adam_eps=EPS,
                        weight_decay=a.wd, grad_clip=a.clip, seed=a.seed))
    if a.eod is not None: f.attrs["eod_token"] = np.int64(a.eod)
    for k, v in params.items(): f[f"params/{k}"] = v.numpy()
    f["batches/tokens"] = tokens.numpy()
    for t in range(a.steps):
        for v in P.values(): v.grad = None
        loss = loss_fn(tokens[t]); loss.backward()
        norm = math.sqrt(sum(float((v.grad ** 2).sum()) for v in P.values()))
        losses.append(float(loss)); norms.append(norm)
        if t == 0:
            f["step0/loss"] = float(loss)
            for k, v in P.items(): f[f"step0/grads/{k}"] = v.grad.numpy()
        coef = min(1.0, a.clip / (norm + 1e-6))
        with torch.no_grad():
            for k, v in P.items():
                g = v.grad * coef
                if v.dim() >= 2: v.mul_(1 - a.lr * a.wd)
                m[k].mul_(B1).add_(g, alpha=1 - B1); s[k].mul_(B2).addcmul_(g, g, value=1 - B2)
                mh = m[k] / (1 - B1 ** (t + 1)); vh = s[k] / (1 - B2 ** (t + 1))
                v.sub_(a.lr * mh / (vh.sqrt() + EPS))
    f["steps/loss"] = np.array(losses); f["steps/grad_norm"] = np.array(norms)
    for k, v in P.items(): f[f"final/params/{k}"] = v.detach().numpy()
print("losses", losses, "grad norms", norms)
