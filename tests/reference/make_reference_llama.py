#!/usr/bin/python3
"""Write a Llama training reference (HDF5) computed by PyTorch autograd in float64.

Same file layout as make_reference.py (see shared/reference/FORMAT.md), model = "llama":
RMSNorm, rotary position embeddings (rotate-half convention, theta attribute), SwiGLU MLP,
grouped-query attention, untied lm_head, no biases. Parameter names are Hugging Face's.
--eod ID: packed documents with document masking, see tests/reference/README.md.
--family: a Llama-style family, see tests/reference/README.md: qwen2 (biases on q, k and v),
qwen3 (RMSNorm of each query and key head before the rotary embedding), mistral (with
--window W: each token attends to the W latest tokens, itself included), mixtral and qwen3_moe
(--experts E --top-k K: a mixture of experts in place of each MLP, with the load-balancing
and z-losses of --aux-coef and --z-coef; qwen3_moe has qwen3's norms, --moe-ffn wide experts;
--score sigmoid: each expert's score sigmoid(logit), the balance loss on the scores normalized).
"""
import argparse, math
import h5py, numpy as np, torch

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--kv-heads", type=int, default=2)
p.add_argument("--dim", type=int, default=64)
p.add_argument("--ffn", type=int, default=176)
p.add_argument("--seq", type=int, default=16)
p.add_argument("--vocab", type=int, default=97)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--lr", type=float, default=3e-3)
p.add_argument("--wd", type=float, default=0.1)
p.add_argument("--clip", type=float, default=1.0)
p.add_argument("--theta", type=float, default=10000.0)
p.add_argument("--seed", type=int, default=4321)
p.add_argument("--eod", type=int, default=None, help="end-of-document token: packed documents, document mask")
p.add_argument("--family", choices=["llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen3_moe", "olmo2"], default="llama")
p.add_argument("--experts", type=int, default=4)
p.add_argument("--top-k", type=int, default=2)
p.add_argument("--moe-ffn", type=int, default=0, help="qwen3_moe: each expert's width (0: --ffn)")
p.add_argument("--no-renormalize", action="store_true", help="qwen3_moe: norm_topk_prob false")
p.add_argument("--score", choices=["softmax", "sigmoid"], default="softmax",
               help="the router's scores: sigmoid(logits) (DeepSeek-V3), the balance loss on them normalized")
p.add_argument("--capacity-factor", type=float, default=0.0,
               help="each expert takes at most ceil(factor T K / E) of a sequence's tokens, the rest dropped (0: dropless)")
p.add_argument("--drop-policy", choices=["probs", "position"], default="probs",
               help="which of an expert's tokens over its capacity are dropped: the lowest scores, or the latest")
p.add_argument("--bias-update-rate", type=float, default=0.0,
               help="loss-free balancing (DeepSeek-V3): an expert bias added to the scores for the choice only, "
                    "moved after each step by this rate times sign(mean load - load)")
p.add_argument("--aux-coef", type=float, default=0.01)
p.add_argument("--z-coef", type=float, default=0.001)
p.add_argument("--window", type=int, default=0, help="mistral: sliding-window attention over this many tokens")
p.add_argument("--head-dim", type=int, default=0, help="each head's width (0: dim / heads; Qwen3's head_dim)")
p.add_argument("--tie", action="store_true", help="tie_word_embeddings: the head reads model.embed_tokens.weight")
p.add_argument("--optimizer", choices=["adamw", "muon"], default="adamw",
               help="muon: Moonlight's Muon (momentum 0.95, Nesterov) for the blocks' 2-D matrices but the "
                    "routers, AdamW for the rest (tests/reference/README.md)")
a = p.parse_args()
if a.window > 0 and a.family not in ("mistral", "mixtral"): raise SystemExit("--window goes with mistral or mixtral")
MOE = a.family in ("mixtral", "qwen3_moe")
E, K = a.experts, a.top_k
FE = a.moe_ffn if a.moe_ffn > 0 else a.ffn  # an expert's width
torch.manual_seed(a.seed)
L, H, KV, d, F, T, V, B = a.layers, a.heads, a.kv_heads, a.dim, a.ffn, a.seq, a.vocab, a.batch
hd = a.head_dim if a.head_dim > 0 else d // H
B1, B2, EPS, NORM_EPS = 0.9, 0.95, 1e-8, 1e-5

def w(*shape): return (0.02 * torch.randn(*shape)).float()
def norm_w(n): return (1.0 + 0.1 * torch.randn(n)).float()

params = {"model.embed_tokens.weight": w(V, d)}
for i in range(L):
    q = f"model.layers.{i}."
    params.update({
        q + "input_layernorm.weight": norm_w(d),
        q + "self_attn.q_proj.weight": w(H * hd, d), q + "self_attn.k_proj.weight": w(KV * hd, d),
        q + "self_attn.v_proj.weight": w(KV * hd, d), q + "self_attn.o_proj.weight": w(d, H * hd),
        q + "post_attention_layernorm.weight": norm_w(d),
        q + "mlp.gate_proj.weight": w(F, d), q + "mlp.up_proj.weight": w(F, d),
        q + "mlp.down_proj.weight": w(d, F),
    })
params["model.norm.weight"] = norm_w(d)
params["lm_head.weight"] = w(V, d)
if a.tie: del params["lm_head.weight"]  # drawn all the same: the draws after it stay as they were
HEAD = "model.embed_tokens.weight" if a.tie else "lm_head.weight"
for i in range(L):  # drawn after Llama's parameters: a llama reference is what it was
    q = f"model.layers.{i}.self_attn."
    if a.family == "qwen2":
        params.update({q + "q_proj.bias": w(H * hd), q + "k_proj.bias": w(KV * hd), q + "v_proj.bias": w(KV * hd)})
    if a.family in ("qwen3", "qwen3_moe"):
        params.update({q + "q_norm.weight": norm_w(hd), q + "k_norm.weight": norm_w(hd)})
    if a.family == "olmo2":  # post-norm branches; q and k RMS-normalized over their whole width
        del params[f"model.layers.{i}.input_layernorm.weight"]
        params.update({f"model.layers.{i}.post_feedforward_layernorm.weight": norm_w(d),
                       q + "q_norm.weight": norm_w(H * hd), q + "k_norm.weight": norm_w(KV * hd)})
# A mixture of experts replaces the MLP: its tensors drawn last, the MLP's dropped.
MOE_BLOCK = "block_sparse_moe" if a.family == "mixtral" else "mlp"
MOE_NAMES = ("w1", "w3", "w2") if a.family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
if MOE:
    for i in range(L):
        q = f"model.layers.{i}."
        for n in ("gate_proj", "up_proj", "down_proj"): del params[q + "mlp." + n + ".weight"]
        params[q + MOE_BLOCK + ".gate.weight"] = w(E, d)
        for e in range(E):
            x = q + MOE_BLOCK + f".experts.{e}."
            params.update({x + MOE_NAMES[0] + ".weight": w(FE, d), x + MOE_NAMES[1] + ".weight": w(FE, d),
                           x + MOE_NAMES[2] + ".weight": w(d, FE)})
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

inv_freq = 1.0 / (a.theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
def rot_half(x): x1, x2 = x.chunk(2, -1); return torch.cat([-x2, x1], -1)
def rope(x): return x * cos + rot_half(x) * sin
def rms(x, g): return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + NORM_EPS) * g

AUX = []  # this step's auxiliary losses, one per layer
DROPPED = []  # this step's (token, expert) pairs dropped over the experts' capacity, per layer
CHOSEN, GAP = [], []  # this step's routing per layer: the experts [B, T, K], each token's margin [B, T]
LOAD = []  # this step's tokens per expert, per layer [E]
BIAS = [torch.zeros(E, dtype=torch.float64) for _ in range(L)]  # --bias-update-rate: each layer's expert bias
def over_capacity(wts, chosen):
    """--capacity-factor: per sequence and expert, the pairs routed to it beyond its capacity
    ceil(factor T K / E), by --drop-policy (probs: the lowest routing weights go, after the
    renormalization as Megatron's, the later token first among equals; position: the later
    tokens go). True where a pair is dropped."""
    dropped = torch.zeros_like(chosen, dtype=torch.bool)
    if a.capacity_factor <= 0: return dropped
    cap = math.ceil(a.capacity_factor * T * K / E)
    for b in range(B):
        for e in range(E):
            ts, js = (chosen[b] == e).nonzero(as_tuple=True)
            key = (lambda i: (-float(wts[b, ts[i], js[i]]), int(ts[i]))) if a.drop_policy == "probs" \
                else (lambda i: int(ts[i]))
            for i in sorted(range(len(ts)), key=key)[cap:]: dropped[b, ts[i], js[i]] = True
    return dropped
def moe(q, h):
    """Route each token to its K best experts (softmax, top-k, renormalized unless
    --no-renormalize), each a SwiGLU MLP; the weighted sum of their outputs. Auxiliary losses
    (model/layers/moe.h): per sequence aux * E / (K T^2) sum_e count(s,e) sum_t p(t,e),
    averaged over the batch; z * mean over tokens of logsumexp(logits)^2."""
    logits = h @ P[q + MOE_BLOCK + ".gate.weight"].T  # [B, T, E]
    if a.score == "sigmoid":  # each expert's score on its own; the balance on them normalized (Megatron)
        scores = torch.sigmoid(logits)
        p = scores / scores.sum(-1, keepdim=True)
    else:
        scores = p = logits.softmax(-1)
    # The choice by score (+ the expert bias, loss-free balancing), the weights the scores.
    rank = scores + BIAS[int(q.split(".")[2])] if a.bias_update_rate > 0 else scores
    chosen = rank.detach().topk(K, dim=-1).indices
    top = scores.gather(-1, chosen)
    # The routing, for verify to count the choices a run makes otherwise: the experts, and
    # each token's margin (its K-th rank over the next one; rounding flips a small one).
    CHOSEN.append(chosen.detach().int())
    LOAD.append(torch.bincount(chosen.flatten(), minlength=E).double())
    ranked = rank.detach().topk(min(K + 1, E), dim=-1).values
    GAP.append(ranked[..., K - 1] - ranked[..., K] if K < E else torch.full((B, T), math.inf, dtype=torch.float64))
    wts = top / top.sum(-1, keepdim=True) if not a.no_renormalize else top
    dropped = over_capacity(wts.detach(), chosen)  # their weights 0 after the renormalization (Megatron)
    wts = wts.masked_fill(dropped, 0.0)
    DROPPED.append(int(dropped.sum()))
    out = torch.zeros_like(h)
    for e in range(E):
        x = q + MOE_BLOCK + f".experts.{e}."
        y = (torch.nn.functional.silu(h @ P[x + MOE_NAMES[0] + ".weight"].T) * (h @ P[x + MOE_NAMES[1] + ".weight"].T)) \
            @ P[x + MOE_NAMES[2] + ".weight"].T
        weight = (wts * (chosen == e)).sum(-1, keepdim=True)  # 0 where e was not chosen
        out = out + weight * y
    count = torch.nn.functional.one_hot(chosen, E).sum(2).double()  # [B, T, E]: 0/1 per token
    balance = (count.sum(1) * p.sum(1)).sum(-1) * E / (K * T * T)  # [B]
    z = torch.logsumexp(logits, -1) ** 2
    AUX.append(a.aux_coef * balance.mean() + a.z_coef * z.mean())
    return out

def loss_fn(batch):
    idx, tgt = batch[:, :T].long(), batch[:, 1:].long()
    x = P["model.embed_tokens.weight"][idx]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    if a.window > 0:  # key j seen by query i iff i - W < j <= i
        pos = torch.arange(T)
        mask = mask & (pos[:, None] - pos[None, :] < a.window)
    if a.eod is not None:  # same document: as many eod tokens strictly before i as before j
        end = idx == a.eod; doc = end.long().cumsum(1) - end.long()
        mask = (mask & (doc[:, :, None] == doc[:, None, :]))[:, None]  # [B, 1, T, T]
    for i in range(L):
        q = f"model.layers.{i}."
        OLMO2 = a.family == "olmo2"  # h = x + post_norm(sublayer(x)) (Olmo2DecoderLayer)
        h = x if OLMO2 else rms(x, P[q + "input_layernorm.weight"])
        def proj(name):
            y = h @ P[q + f"self_attn.{name}.weight"].T
            return y + P[q + f"self_attn.{name}.bias"] if q + f"self_attn.{name}.bias" in P else y
        qq, kk = proj("q_proj"), proj("k_proj")
        if OLMO2:  # over the whole projection, before the split into heads (Olmo2Attention)
            qq, kk = rms(qq, P[q + "self_attn.q_norm.weight"]), rms(kk, P[q + "self_attn.k_norm.weight"])
        qq, kk = qq.view(B, T, H, hd), kk.view(B, T, KV, hd)
        vv = proj("v_proj").view(B, T, KV, hd).transpose(1, 2)
        if a.family in ("qwen3", "qwen3_moe"):  # each head's RMSNorm, before the rotary embedding (Qwen3Attention)
            qq, kk = rms(qq, P[q + "self_attn.q_norm.weight"]), rms(kk, P[q + "self_attn.k_norm.weight"])
        qq, kk = rope(qq.transpose(1, 2)), rope(kk.transpose(1, 2))
        kk, vv = kk.repeat_interleave(H // KV, dim=1), vv.repeat_interleave(H // KV, dim=1)
        att = (qq @ kk.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ vv).transpose(1, 2).reshape(B, T, H * hd)
        y = y @ P[q + "self_attn.o_proj.weight"].T
        if OLMO2:
            x = x + rms(y, P[q + "post_attention_layernorm.weight"])
            g = x @ P[q + "mlp.gate_proj.weight"].T
            y = (torch.nn.functional.silu(g) * (x @ P[q + "mlp.up_proj.weight"].T)) @ P[q + "mlp.down_proj.weight"].T
            x = x + rms(y, P[q + "post_feedforward_layernorm.weight"])
            continue
        x = x + y
        h = rms(x, P[q + "post_attention_layernorm.weight"])
        if MOE:
            x = x + moe(q, h)
            continue
        g = h @ P[q + "mlp.gate_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * (h @ P[q + "mlp.up_proj.weight"].T)) @ P[q + "mlp.down_proj.weight"].T
    x = rms(x, P["model.norm.weight"])
    logits = x @ P[HEAD].T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))

def objective(batch):
    """The loss, and the objective its gradients are of (with the auxiliary losses)."""
    AUX.clear(); DROPPED.clear(); CHOSEN.clear(); GAP.clear(); LOAD.clear()
    loss = loss_fn(batch)
    aux = sum(AUX) if AUX else torch.zeros((), dtype=torch.float64)
    return loss, loss + aux, float(aux)

# Muon (Moonlight's examples/toy_train.py): the blocks' 2-D matrices but the routers
# (`.gate.weight`, a classifier over the experts, like the head) take Nesterov momentum and
# 5 Newton-Schulz steps over the whole matrix; every other tensor AdamW as below.
MUON_MOMENTUM = 0.95
def hidden_matrix(k, v): return v.dim() == 2 and k.startswith("model.layers.") and not k.endswith(".gate.weight")
def newton_schulz(G):
    X = G / (G.norm() + 1e-7)
    tall = X.size(0) > X.size(1)
    if tall: X = X.T
    for _ in range(5):
        A = X @ X.T
        X = 3.4445 * X + (-4.7750 * A + 2.0315 * A @ A) @ X
    return X.T if tall else X
buf = {k: torch.zeros_like(v) for k, v in P.items()}
m = {k: torch.zeros_like(v) for k, v in P.items()}
s = {k: torch.zeros_like(v) for k, v in P.items()}
losses, norms, aux_losses, dropped, chosen_steps, gap_steps, bias_steps = [], [], [], [], [], [], []
with h5py.File(a.out, "w") as f:
    f.attrs.update(dict(format="trident-reference-v1", model=a.family, n_layer=L, n_head=H, n_kv_head=KV,
                        d_model=d, ffn_dim=F, seq_len=T, vocab_size=V, batch_size=B, steps=a.steps,
                        norm_eps=NORM_EPS, rope_theta=a.theta, lr=a.lr, beta1=B1, beta2=B2, adam_eps=EPS,
                        weight_decay=a.wd, grad_clip=a.clip, seed=a.seed))
    if a.eod is not None: f.attrs["eod_token"] = np.int64(a.eod)
    if a.window > 0: f.attrs["sliding_window"] = np.int64(a.window)
    if a.head_dim > 0: f.attrs["head_dim"] = np.int64(hd)
    if a.tie: f.attrs["tie_word_embeddings"] = np.int64(1)
    if a.optimizer != "adamw": f.attrs.update(dict(optimizer=a.optimizer, muon_momentum=MUON_MOMENTUM))
    if MOE:
        f.attrs.update(dict(n_experts=np.int64(E), n_experts_per_token=np.int64(K), moe_ffn_dim=np.int64(FE),
                            moe_norm_topk=np.int64(0 if a.no_renormalize else 1),
                            router_aux_loss_coef=a.aux_coef, router_z_loss_coef=a.z_coef))
        if a.score != "softmax": f.attrs["moe_router_score"] = a.score
        if a.bias_update_rate > 0: f.attrs["moe_router_bias_update_rate"] = a.bias_update_rate
        if a.capacity_factor > 0:
            f.attrs.update(dict(moe_capacity_factor=a.capacity_factor, moe_token_drop_policy=a.drop_policy))
    for k, v in params.items(): f[f"params/{k}"] = v.numpy()
    f["batches/tokens"] = tokens.numpy()
    for t in range(a.steps):
        for v in P.values(): v.grad = None
        loss, total, aux = objective(tokens[t]); total.backward(); aux_losses.append(aux)
        dropped.append(sum(DROPPED))
        if MOE: chosen_steps.append(torch.stack(CHOSEN).numpy()); gap_steps.append(torch.stack(GAP).numpy())
        norm = math.sqrt(sum(float((v.grad ** 2).sum()) for v in P.values()))
        losses.append(float(loss)); norms.append(norm)
        if t == 0:
            f["step0/loss"] = float(loss)
            for k, v in P.items(): f[f"step0/grads/{k}"] = v.grad.numpy()
        coef = min(1.0, a.clip / (norm + 1e-6))
        with torch.no_grad():
            for k, v in P.items():
                g = v.grad * coef
                if a.optimizer == "muon" and hidden_matrix(k, v):
                    buf[k].mul_(MUON_MOMENTUM).add_(g)
                    v.mul_(1 - a.lr * a.wd)
                    v.sub_(a.lr * 0.2 * math.sqrt(max(v.shape)) * newton_schulz(g + MUON_MOMENTUM * buf[k]))
                    continue
                if v.dim() >= 2: v.mul_(1 - a.lr * a.wd)
                m[k].mul_(B1).add_(g, alpha=1 - B1); s[k].mul_(B2).addcmul_(g, g, value=1 - B2)
                mh = m[k] / (1 - B1 ** (t + 1)); vh = s[k] / (1 - B2 ** (t + 1))
                v.sub_(a.lr * mh / (vh.sqrt() + EPS))
        if a.bias_update_rate > 0:  # after the update, from the step's load of each layer's experts
            for i, load in enumerate(LOAD): BIAS[i] += a.bias_update_rate * torch.sign(load.mean() - load)
            bias_steps.append(torch.stack(BIAS).numpy().copy())
    f["steps/loss"] = np.array(losses); f["steps/grad_norm"] = np.array(norms)
    if MOE:
        f["steps/aux_loss"] = np.array(aux_losses)
        f["steps/router_chosen"] = np.array(chosen_steps, dtype=np.int32)  # [steps, layers, B, T, K]
        f["steps/router_gap"] = np.array(gap_steps)  # [steps, layers, B, T]
        if a.bias_update_rate > 0: f["steps/expert_bias"] = np.array(bias_steps)  # [steps, layers, E] after each step
    if a.capacity_factor > 0: f["steps/tokens_dropped"] = np.array(dropped, dtype=np.float64)
    for k, v in P.items(): f[f"final/params/{k}"] = v.detach().numpy()
print("losses", losses, "grad norms", norms, *(["tokens dropped", dropped] if a.capacity_factor > 0 else []))
