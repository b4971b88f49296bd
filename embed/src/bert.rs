//! The BERT encoder of MiniLM-L6 (6 layers, 384 wide, 12 heads, 1536 in the feed-forward, exact
//! GELU, layer norm ε 1e-12), its weights read from the 4-bit file once, and mean pooling.
//!
//! Deterministic: every sum runs in one fixed order on one thread, so the same text gives the same
//! bits on the same machine. Matrix products of long sequences (a chunk) go to `matrixmultiply`'s
//! SGEMM (no threads); short ones (a question) are dot products that read each weight row once
//! (`simd`). Imports the crate's two kernels (`sgemm`, `simd`).

use half::f16;

/// Hidden width: the length of an embedding.
pub(crate) const HIDDEN: usize = 384;
const HEADS: usize = 12;
const HEAD: usize = HIDDEN / HEADS;
const FFN: usize = 1536;
const LAYERS: usize = 6;
/// Positions kept in the file (the model's `max_seq_length`).
pub(crate) const POSITIONS: usize = 256;
const GROUP: usize = 32;
/// Sequences at least this long use SGEMM.
const GEMM_ROWS: usize = 64;

/// A weight matrix `[out][in]` and its bias.
struct Linear {
    w: Vec<f32>,
    b: Vec<f32>,
    out: usize,
    inp: usize,
}

struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    norm1: Norm,
    up: Linear,
    down: Linear,
    norm2: Norm,
}

/// The loaded model.
pub(crate) struct Bert {
    /// The word embeddings stay 4-bit (their rows are read one token at a time): 6.6 MB, not 47.
    words: &'static [u8],
    positions: Vec<f32>,
    token_type: Vec<f32>,
    norm: Norm,
    layers: Vec<Layer>,
}

/// Reads the file's tensors in order.
struct Reader {
    data: &'static [u8],
    at: usize,
}

impl Reader {
    fn take(&mut self, n: usize) -> &'static [u8] {
        let s = &self.data[self.at..self.at + n];
        self.at += n;
        s
    }

    fn q4_bytes(rows: usize, cols: usize) -> usize {
        rows * cols / GROUP * (2 + GROUP / 2)
    }

    fn q4(&mut self, rows: usize, cols: usize) -> Vec<f32> {
        let raw = self.take(Self::q4_bytes(rows, cols));
        let mut out = vec![0.0; rows * cols];
        raw.chunks_exact(2 + GROUP / 2).zip(out.chunks_exact_mut(GROUP)).for_each(|(g, o)| dequantize(g, o));
        out
    }

    fn f16(&mut self, n: usize) -> Vec<f32> {
        self.take(2 * n).chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
    }

    fn linear(&mut self, out: usize, inp: usize) -> Linear {
        Linear { w: self.q4(out, inp), b: self.f16(out), out, inp }
    }

    fn norm(&mut self) -> Norm {
        Norm { w: self.f16(HIDDEN), b: self.f16(HIDDEN) }
    }
}

/// One group of 32: an f16 scale, then 16 bytes of two values each (low nibble first), value =
/// (nibble − 8) · scale.
fn dequantize(group: &[u8], out: &mut [f32]) {
    let scale = f16::from_le_bytes([group[0], group[1]]).to_f32();
    for (i, b) in group[2..].iter().enumerate() {
        out[2 * i] = (f32::from(b & 15) - 8.0) * scale;
        out[2 * i + 1] = (f32::from(b >> 4) - 8.0) * scale;
    }
}

impl Bert {
    /// The model in `data` (the file scripts/minilm_weights.py writes); panics on another file.
    pub(crate) fn load(data: &'static [u8], vocab: usize) -> Bert {
        assert_eq!(&data[..4], b"MQ4\x01", "not a model file of scripts/minilm_weights.py");
        let mut r = Reader { data, at: 4 };
        let words = r.take(Reader::q4_bytes(vocab, HIDDEN));
        let positions = r.f16(POSITIONS * HIDDEN);
        let token_type = r.f16(HIDDEN);
        let norm = r.norm();
        let layers = (0..LAYERS)
            .map(|_| {
                let (q, k, v, o) = (
                    r.linear(HIDDEN, HIDDEN),
                    r.linear(HIDDEN, HIDDEN),
                    r.linear(HIDDEN, HIDDEN),
                    r.linear(HIDDEN, HIDDEN),
                );
                let norm1 = r.norm();
                let (up, down) = (r.linear(FFN, HIDDEN), r.linear(HIDDEN, FFN));
                Layer { q, k, v, o, norm1, up, down, norm2: r.norm() }
            })
            .collect();
        assert_eq!(r.at, data.len(), "model file of another size than MiniLM-L6's");
        Bert { words, positions, token_type, norm, layers }
    }

    /// The mean of the last layer's states over `ids` (`[CLS]` … `[SEP]`, at most [`POSITIONS`]),
    /// scaled to length 1.
    pub(crate) fn embed(&self, ids: &[u32]) -> Vec<f32> {
        let n = ids.len().min(POSITIONS);
        let row = Reader::q4_bytes(1, HIDDEN);
        let mut x = vec![0.0f32; n * HIDDEN];
        for (t, &id) in ids[..n].iter().enumerate() {
            let xt = &mut x[t * HIDDEN..(t + 1) * HIDDEN];
            let raw = &self.words[id as usize * row..(id as usize + 1) * row];
            raw.chunks_exact(2 + GROUP / 2).zip(xt.chunks_exact_mut(GROUP)).for_each(|(g, o)| dequantize(g, o));
            for (i, v) in xt.iter_mut().enumerate() {
                *v += self.positions[t * HIDDEN + i] + self.token_type[i];
            }
        }
        layer_norm(&mut x, &self.norm);
        for l in &self.layers {
            let (q, k, v) = (l.q.apply(&x, n), l.k.apply(&x, n), l.v.apply(&x, n));
            let context = attention(&q, &k, &v, n);
            add(&mut x, &l.o.apply(&context, n));
            layer_norm(&mut x, &l.norm1);
            let mut h = l.up.apply(&x, n);
            h.iter_mut().for_each(|v| *v = gelu(*v));
            add(&mut x, &l.down.apply(&h, n));
            layer_norm(&mut x, &l.norm2);
        }
        let mut mean = vec![0.0f32; HIDDEN];
        for xt in x.chunks_exact(HIDDEN) {
            mean.iter_mut().zip(xt).for_each(|(m, v)| *m += v);
        }
        let len = mean.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        mean.iter_mut().for_each(|v| *v /= len);
        mean
    }
}

impl Linear {
    /// `x · Wᵀ + b` for `n` rows of `x`.
    fn apply(&self, x: &[f32], n: usize) -> Vec<f32> {
        let (out, inp) = (self.out, self.inp);
        let mut y = vec![0.0f32; n * out];
        if n >= GEMM_ROWS {
            gemm(n, inp, out, x, &self.w, &mut y);
        } else {
            crate::simd::xwt(x, n, &self.w, out, inp, &mut y);
        }
        for yt in y.chunks_exact_mut(out) {
            yt.iter_mut().zip(&self.b).for_each(|(v, b)| *v += b);
        }
        y
    }
}

/// `y[m×n] = a[m×k] · bᵀ` with `b` stored `[n][k]`.
fn gemm(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], y: &mut [f32]) {
    crate::sgemm::abt(m, k, n, a, b, y);
}

/// A dot product in eight lanes, added in a fixed order (vectorised by the compiler).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let rest: f32 = a.chunks_exact(8).remainder().iter().zip(b.chunks_exact(8).remainder()).map(|(x, y)| x * y).sum();
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + rest
}

fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

fn layer_norm(x: &mut [f32], n: &Norm) {
    for xt in x.chunks_exact_mut(HIDDEN) {
        let mean = xt.iter().sum::<f32>() / HIDDEN as f32;
        let var = xt.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / HIDDEN as f32;
        let inv = 1.0 / (var + 1e-12).sqrt();
        for ((v, w), b) in xt.iter_mut().zip(&n.w).zip(&n.b) {
            *v = (*v - mean) * inv * w + b;
        }
    }
}

/// Scaled dot-product attention over all `n` positions (no padding: one sequence), per head.
fn attention(q: &[f32], k: &[f32], v: &[f32], n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n * HIDDEN];
    let scale = 1.0 / (HEAD as f32).sqrt();
    let mut scores = vec![0.0f32; n];
    for h in 0..HEADS {
        let at = |t: usize| -> std::ops::Range<usize> { t * HIDDEN + h * HEAD..t * HIDDEN + (h + 1) * HEAD };
        for t in 0..n {
            let qt = &q[at(t)];
            for (s, score) in scores.iter_mut().enumerate() {
                *score = dot(qt, &k[at(s)]) * scale;
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            scores.iter_mut().for_each(|s| {
                *s = (*s - max).exp();
                sum += *s;
            });
            let o = &mut out[t * HIDDEN + h * HEAD..t * HIDDEN + (h + 1) * HEAD];
            for (s, &p) in scores.iter().enumerate() {
                let vs = &v[at(s)];
                o.iter_mut().zip(vs).for_each(|(o, v)| *o += p / sum * v);
            }
        }
    }
    out
}

/// GELU with erf (Abramowitz and Stegun 7.1.26, |error| < 1.5e-7), as the model was trained.
fn gelu(x: f32) -> f32 {
    let z = (x / std::f32::consts::SQRT_2).abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = ((((1.061_405_4 * t - 1.453_152) * t + 1.421_413_8) * t - 0.284_496_74) * t + 0.254_829_6) * t;
    let erf = (1.0 - poly * (-z * z).exp()).copysign(x);
    0.5 * x * (1.0 + erf)
}
