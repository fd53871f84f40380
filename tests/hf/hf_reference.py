#!/usr/bin/python3
"""Hugging Face's side of trident's safetensors export and import, written from HF's
conventions (DATA_FORMATS.md section 4; transformers' modeling_gpt2.py, modeling_llama.py
and the Llama-style modeling_qwen2.py, modeling_qwen3.py, modeling_mistral.py,
modeling_mixtral.py, modeling_qwen3_moe.py, modeling_olmo2.py), in numpy float64, with its own safetensors
reader and writer:

  logits HF_DIR DUMP.json     the forward pass of the exported model (GPT-2: Conv1D
                              weights [in, out], tied head; Llama: rotate-half RoPE, GQA,
                              SwiGLU; Qwen2's q, k, v biases, Qwen3's q and k norms,
                              Mistral's sliding window; Mixtral's and Qwen3-MoE's
                              experts, softmax top-k routing; OLMo-2's post-norms and
                              whole-width q and k norms) on the tokens of
                              `trident generate --dump_logits`;
                              exit 0 when every position's logits agree to 1e-5 relative
  write HF_DIR OUT_DIR SEED   new random weights in HF's own layout and names, as
                              transformers' save_pretrained lays them out (GPT-2 with the
                              "transformer." prefix, the attn.bias buffers and the tied
                              lm_head; tensors in name order), for trident to import
  compare A_DIR B_DIR         every parameter of A equal, bit for bit, to B's

Python 3 with numpy (Debian: python3-numpy)."""
import json
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        buf = data[b:end]
        if e["dtype"] == "F32":
            a = np.frombuffer(buf, dtype="<f4")
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif e["dtype"] == "F16":
            a = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif e["dtype"] == "BOOL":
            a = np.frombuffer(buf, dtype=np.uint8).astype(bool)
        else:
            raise SystemExit(f"{path}: {name}: dtype {e['dtype']} not handled here")
        out[name] = a.reshape(e["shape"])
    return out, header.get("__metadata__", {})


def read_model(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    tensors = {}
    for f in files:
        t, meta = read_safetensors(os.path.join(folder, f))
        assert meta.get("format") == "pt", f"{f}: __metadata__ {meta} lacks format=pt"
        tensors.update(t)
    return json.load(open(os.path.join(folder, "config.json"))), tensors


def write_safetensors(path, tensors):
    """As the reference writer: sorted by (dtype alignment desc, name), header padded to 8."""
    order = sorted(tensors, key=lambda k: (-tensors[k].dtype.itemsize, k))
    header, at = {"__metadata__": {"format": "pt"}}, 0
    codes = {np.dtype("float32"): "F32", np.dtype("bool"): "BOOL"}
    for k in order:
        a = tensors[k]
        header[k] = {"dtype": codes[a.dtype], "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        at += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for k in order:
            f.write(np.ascontiguousarray(tensors[k]).tobytes())


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def causal_attention(q, k, v, window=None):  # [H, T, hd] each (k, v already repeated for GQA)
    T, hd = q.shape[1], q.shape[2]
    s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
    visible = np.tril(np.ones((T, T), dtype=bool))
    if window:  # Mistral: key j seen by query i iff i - window < j <= i
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        visible &= i - j < window
    s = np.where(visible, s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def gpt2_logits(c, w, tokens):
    g = lambda k: w[k].astype(np.float64)
    T, C, H = len(tokens), c["n_embd"], c["n_head"]
    eps = c.get("layer_norm_epsilon", 1e-5)
    x = g("wte.weight")[tokens] + g("wpe.weight")[:T]
    for i in range(c["n_layer"]):
        p = f"h.{i}."
        h = layer_norm(x, g(p + "ln_1.weight"), g(p + "ln_1.bias"), eps)
        qkv = h @ g(p + "attn.c_attn.weight") + g(p + "attn.c_attn.bias")  # Conv1D: x W + b, W [in, out]
        q, k, v = (a.reshape(T, H, C // H).transpose(1, 0, 2) for a in np.split(qkv, 3, axis=-1))
        a = causal_attention(q, k, v).transpose(1, 0, 2).reshape(T, C)
        x = x + a @ g(p + "attn.c_proj.weight") + g(p + "attn.c_proj.bias")
        h = layer_norm(x, g(p + "ln_2.weight"), g(p + "ln_2.bias"), eps)
        u = h @ g(p + "mlp.c_fc.weight") + g(p + "mlp.c_fc.bias")
        u = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))  # gelu_new
        x = x + u @ g(p + "mlp.c_proj.weight") + g(p + "mlp.c_proj.bias")
    x = layer_norm(x, g("ln_f.weight"), g("ln_f.bias"), eps)
    return x @ g("wte.weight").T  # tied head


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def llama_logits(c, w, tokens):
    g = lambda k: w[k].astype(np.float64)
    assert not c.get("rope_scaling"), "rope_scaling is not modelled here"
    T, C, H = len(tokens), c["hidden_size"], c["num_attention_heads"]
    KV = c.get("num_key_value_heads") or H
    hd = c.get("head_dim") or C // H
    eps, theta = c.get("rms_norm_eps", 1e-6), c.get("rope_theta", 10000.0)
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    freqs = np.outer(np.arange(T, dtype=np.float64), inv_freq)
    cos, sin = np.cos(np.concatenate([freqs, freqs], -1)), np.sin(np.concatenate([freqs, freqs], -1))

    def rope(x):  # rotate-half: pairs (i, i + hd/2)
        half = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos + half * sin

    def linear(h, name):  # Linear: W [out, in], a bias where the file has one (Qwen2's q, k, v)
        y = h @ g(name + ".weight").T
        return y + g(name + ".bias") if name + ".bias" in w else y

    window = c.get("sliding_window") if c["model_type"] in ("mistral", "mixtral") else None

    def swiglu(h, gate, up, down):
        a, b = h @ g(gate + ".weight").T, h @ g(up + ".weight").T
        return (a / (1 + np.exp(-a)) * b) @ g(down + ".weight").T

    def experts(h, p):
        """Mixtral's MixtralSparseMoeBlock, Qwen3-MoE's Qwen3MoeSparseMoeBlock: softmax over
        the router's logits, the top num_experts_per_tok, renormalized (Mixtral always,
        Qwen3-MoE when norm_topk_prob), the weighted sum of those experts' SwiGLU outputs."""
        mixtral = c["model_type"] == "mixtral"
        block, names = ("block_sparse_moe", ("w1", "w3", "w2")) if mixtral else ("mlp", ("gate_proj", "up_proj", "down_proj"))
        E, K = c["num_local_experts"] if mixtral else c["num_experts"], c["num_experts_per_tok"]
        logits = h @ g(p + block + ".gate.weight").T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :K]
        weights = np.take_along_axis(probs, chosen, -1)
        if mixtral or c.get("norm_topk_prob", False):
            weights /= weights.sum(-1, keepdims=True)
        out = np.zeros_like(h)
        for e in range(E):
            x = f"{p}{block}.experts.{e}."
            rows, slot = np.nonzero(chosen == e)
            if len(rows):
                out[rows] += weights[rows, slot][:, None] * swiglu(h[rows], *(x + n for n in names))
        return out

    # OLMo-2 (Olmo2DecoderLayer): x + norm(sublayer(x)), no norm before; q and k normalized
    # over the whole projection, before the split into heads.
    olmo2 = c["model_type"] == "olmo2"
    x = g("model.embed_tokens.weight")[tokens]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = x if olmo2 else rms_norm(x, g(p + "input_layernorm.weight"), eps)
        q, k = linear(h, p + "self_attn.q_proj"), linear(h, p + "self_attn.k_proj")
        if olmo2:
            q, k = rms_norm(q, g(p + "self_attn.q_norm.weight"), eps), rms_norm(k, g(p + "self_attn.k_norm.weight"), eps)
        q, k = q.reshape(T, H, hd), k.reshape(T, KV, hd)
        v = linear(h, p + "self_attn.v_proj").reshape(T, KV, hd).transpose(1, 0, 2)
        if p + "self_attn.q_norm.weight" in w and not olmo2:  # Qwen3: each head's q and k, before RoPE
            q, k = rms_norm(q, g(p + "self_attn.q_norm.weight"), eps), rms_norm(k, g(p + "self_attn.k_norm.weight"), eps)
        q, k = rope(q.transpose(1, 0, 2)), rope(k.transpose(1, 0, 2))
        k, v = np.repeat(k, H // KV, axis=0), np.repeat(v, H // KV, axis=0)  # repeat_kv
        a = causal_attention(q, k, v, window).transpose(1, 0, 2).reshape(T, H * hd)
        if olmo2:
            x = x + rms_norm(a @ g(p + "self_attn.o_proj.weight").T, g(p + "post_attention_layernorm.weight"), eps)
            y = swiglu(x, p + "mlp.gate_proj", p + "mlp.up_proj", p + "mlp.down_proj")
            x = x + rms_norm(y, g(p + "post_feedforward_layernorm.weight"), eps)
            continue
        x = x + a @ g(p + "self_attn.o_proj.weight").T
        h = rms_norm(x, g(p + "post_attention_layernorm.weight"), eps)
        if c["model_type"] in ("mixtral", "qwen3_moe"):
            x = x + experts(h, p)
        else:
            x = x + swiglu(h, p + "mlp.gate_proj", p + "mlp.up_proj", p + "mlp.down_proj")
    x = rms_norm(x, g("model.norm.weight"), eps)
    return x @ g("model.embed_tokens.weight" if c.get("tie_word_embeddings") else "lm_head.weight").T


def strip(name):  # what trident calls a parameter of a GPT-2 file
    return name[len("transformer."):] if name.startswith("transformer.") else name


def is_buffer(name):
    return name.endswith(".attn.bias") or name.endswith(".attn.masked_bias") or name.endswith("rotary_emb.inv_freq")


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "logits":
        c, w = read_model(sys.argv[2])
        dump = json.load(open(sys.argv[3]))
        tokens = np.array(dump["tokens"])
        ours = (gpt2_logits if c["model_type"] == "gpt2" else llama_logits)(c, w, tokens)
        theirs = np.array(dump["logits"], dtype=np.float64)[:, : ours.shape[1]]
        err = max(np.linalg.norm(ours[t] - theirs[t]) / np.linalg.norm(ours[t]) for t in range(len(tokens)))
        print(f"{c['model_type']}: {len(tokens)} positions x {ours.shape[1]} logits, max relative error {err:.2e} "
              f"(HF conventions in float64 vs trident)")
        sys.exit(0 if err <= 1e-5 else 1)
    if cmd == "write":
        c, w = read_model(sys.argv[2])
        out, rng = sys.argv[3], np.random.default_rng(int(sys.argv[4]))
        os.makedirs(out, exist_ok=True)
        fresh = {k: (rng.standard_normal(a.shape) * 0.02).astype(np.float32) for k, a in w.items()}
        if c["model_type"] == "gpt2":  # as save_pretrained of GPT2LMHeadModel in older versions
            fresh = {"transformer." + k: a for k, a in fresh.items()}
            fresh["lm_head.weight"] = fresh["transformer.wte.weight"].copy()
            for i in range(c["n_layer"]):
                T = c["n_positions"]
                fresh[f"transformer.h.{i}.attn.bias"] = np.tril(np.ones((1, 1, T, T), dtype=bool))
        elif c.get("tie_word_embeddings"):  # as Qwen3-0.6B's file: the tied head's copy stored too
            fresh["lm_head.weight"] = fresh["model.embed_tokens.weight"].copy()
        write_safetensors(os.path.join(out, "model.safetensors"), fresh)
        json.dump(c, open(os.path.join(out, "config.json"), "w"), indent=2)
        print(f"wrote {len(fresh)} tensors to {out}")
        return
    if cmd == "compare":
        c, a = read_model(sys.argv[2])
        _, b = read_model(sys.argv[3])
        tied = bool(c.get("tie_word_embeddings"))
        def parameters(t):  # buffers and GPT-2's tied head are not parameters
            p = {strip(k): v for k, v in t.items() if not is_buffer(k)}
            if "wte.weight" in p or "model.embed_tokens.weight" in p and "lm_head.weight" in t and tied:
                p.pop("lm_head.weight", None)
            return p

        pa, pb = parameters(a), parameters(b)
        bad = [k for k in pb if k not in pa or pa[k].shape != pb[k].shape or pa[k].tobytes() != pb[k].tobytes()]
        missing = [k for k in pa if k not in pb]
        print(f"{len(pb)} tensors compared bit for bit: {len(bad)} differ, {len(missing)} missing {bad[:3]} {missing[:3]}")
        sys.exit(0 if not bad and not missing else 1)
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
