//! Byte-for-byte Rust port of the peer lab's deterministic benchmark workload
//! (`lab/workload.py` + the resource construction in `lab/bench_server.py`).
//!
//! Everything here reproduces CPython 3.11 exactly: the Mersenne Twister behind
//! `random.Random` (seeding from a non-negative int, `random()`,
//! `getrandbits`, `_randbelow`, `randrange`, `randint`, `choice`, `choices`,
//! `randbytes`), the pseudo-English text generator `make_text`, the blob
//! generator `blob_bytes`, the per-resource metadata, the `offset:{start}`
//! list cursors and the canonical LLM-context string.
//!
//! Only `std` and the `base64` crate (0.22) are used, so this file can be
//! copied verbatim into another crate (e.g. as `examples/bench/workload.rs`).
//!
//! Seeds are `u128` so that `resource_seed(base_seed, i)` =
//! `base_seed * 1_000_003 + i` never overflows for any `u64` base seed
//! (Python ints are unbounded; negative seeds are not supported here, Python
//! would use `abs(seed)`).

#![allow(unreachable_pub, reason = "shared by several examples, benches and tests through #[path]")]
#![allow(dead_code)]

use std::borrow::Cow;
use std::ops::Range;
use std::sync::OnceLock;

use base64::Engine as _;

// ---------------------------------------------------------------------------
// Workload constants (mirror workload.py)
// ---------------------------------------------------------------------------

/// Default number of resources (`DEFAULT_N`).
pub const DEFAULT_N: usize = 1000;
/// Default bytes of content per resource (`DEFAULT_SIZE`).
pub const DEFAULT_SIZE: usize = 2048;
/// Default resources per `resources/list` page (`DEFAULT_PAGE_SIZE`).
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// Default base seed (`DEFAULT_SEED`).
pub const DEFAULT_SEED: u64 = 20240601;
/// Resource `i` is a blob iff `i % BLOB_EVERY == BLOB_EVERY - 1`.
pub const BLOB_EVERY: usize = 10;
/// MIME type of blob resources.
pub const BLOB_MIME: &str = "image/png";
/// MIME type of text resources.
pub const TEXT_MIME: &str = "text/plain";
/// Joiner of the canonical context string.
pub const CONTEXT_JOINER: &str = "\n\n";
/// `annotations.audience` of every resource.
pub const AUDIENCE: [&str; 1] = ["assistant"];
/// XOR mask applied to a resource seed before generating blob bytes.
pub const BLOB_SEED_XOR: u128 = 0x5EED_B10B;
/// Multiplier of `resource_seed`.
pub const RESOURCE_SEED_MUL: u128 = 1_000_003;

// ---------------------------------------------------------------------------
// CPython 3.11 random.Random (MT19937)
// ---------------------------------------------------------------------------

const MT_N: usize = 624;
const MT_M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// A clone of CPython 3.11's `random.Random` for the methods the workload uses.
///
/// Every method consumes the generator exactly like its Python counterpart, so
/// interleaved call sequences stay in lock-step with Python.
#[derive(Clone)]
pub struct Random {
    mt: [u32; MT_N],
    mti: usize,
}

impl Random {
    /// `random.Random(seed)` for a non-negative integer seed.
    ///
    /// CPython (`random_seed` in `_randommodule.c`) feeds `init_by_array` with the
    /// 32-bit little-endian words of `abs(seed)`, dropping high zero words but
    /// always keeping at least one word (so seed 0 uses the key `[0]`).
    pub fn new(seed: u128) -> Self {
        let mut key = [0u32; 4];
        let mut len = 0;
        let mut s = seed;
        while s != 0 {
            key[len] = s as u32;
            len += 1;
            s >>= 32;
        }
        Self::from_key(&key[..len.max(1)])
    }

    /// Seeds via MT19937 `init_by_array(key)`; `key` must be non-empty to match
    /// CPython (an empty key is treated as `[0]`).
    pub fn from_key(key: &[u32]) -> Self {
        let key: &[u32] = if key.is_empty() { &[0] } else { key };
        let mut r = Random { mt: [0; MT_N], mti: MT_N };
        r.init_genrand(19_650_218);
        let mt = &mut r.mt;
        let mut i = 1usize;
        let mut j = 0usize;
        let mut k = MT_N.max(key.len());
        while k > 0 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= MT_N {
                mt[0] = mt[MT_N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
            k -= 1;
        }
        k = MT_N - 1;
        while k > 0 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= MT_N {
                mt[0] = mt[MT_N - 1];
                i = 1;
            }
            k -= 1;
        }
        mt[0] = 0x8000_0000;
        r
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..MT_N {
            let prev = self.mt[i - 1];
            self.mt[i] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
        }
        self.mti = MT_N;
    }

    fn twist(&mut self) {
        #[inline(always)]
        fn mix(cur: u32, next: u32, far: u32) -> u32 {
            let y = (cur & UPPER_MASK) | (next & LOWER_MASK);
            far ^ (y >> 1) ^ (0u32.wrapping_sub(y & 1) & MATRIX_A)
        }
        let mt = &mut self.mt;
        for kk in 0..MT_N - MT_M {
            mt[kk] = mix(mt[kk], mt[kk + 1], mt[kk + MT_M]);
        }
        for kk in MT_N - MT_M..MT_N - 1 {
            mt[kk] = mix(mt[kk], mt[kk + 1], mt[kk + MT_M - MT_N]);
        }
        mt[MT_N - 1] = mix(mt[MT_N - 1], mt[0], mt[MT_M - 1]);
        self.mti = 0;
    }

    /// MT19937 `genrand_uint32`: the next raw 32-bit output.
    pub fn genrand_u32(&mut self) -> u32 {
        if self.mti >= MT_N {
            self.twist();
        }
        let mut y = self.mt[self.mti];
        self.mti += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// `random()`: a 53-bit float in `[0, 1)` from two outputs
    /// (`(a >> 5) * 67108864 + (b >> 6)) / 2**53`).
    pub fn random(&mut self) -> f64 {
        let a = (self.genrand_u32() >> 5) as f64;
        let b = (self.genrand_u32() >> 6) as f64;
        (a * 67_108_864.0 + b) * (1.0 / 9_007_199_254_740_992.0)
    }

    /// `getrandbits(k)` for `0 <= k <= 64` (`getrandbits(0)` returns 0 and
    /// consumes nothing, as in CPython >= 3.9).
    ///
    /// Words are taken least-significant first; a final partial word keeps the
    /// *top* bits of its output (`genrand >> (32 - bits)`).
    ///
    /// # Panics
    /// If `k > 64` (use [`Random::randbytes`] for long bit strings).
    pub fn getrandbits(&mut self, k: u32) -> u64 {
        assert!(k <= 64, "getrandbits: k = {k} > 64 is not supported");
        if k == 0 {
            return 0;
        }
        if k <= 32 {
            return u64::from(self.genrand_u32() >> (32 - k));
        }
        let lo = u64::from(self.genrand_u32());
        let hi = u64::from(self.genrand_u32() >> (64 - k));
        lo | (hi << 32)
    }

    /// `_randbelow(n)` (= `_randbelow_with_getrandbits`): rejection sampling with
    /// `k = n.bit_length()` bits (not `(n-1).bit_length()`, so a power of two
    /// wastes about half the draws, exactly like CPython).
    ///
    /// Returns 0 without consuming anything for `n == 0` (CPython would loop
    /// forever; it documents the method as defined only for `n > 0`).
    pub fn randbelow(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let k = 64 - n.leading_zeros();
        let mut r = self.getrandbits(k);
        while r >= n {
            r = self.getrandbits(k);
        }
        r
    }

    /// `randrange(stop)`: uniform in `[0, stop)`.
    ///
    /// # Panics
    /// If `stop <= 0` (Python raises `ValueError("empty range for randrange()")`).
    pub fn randrange(&mut self, stop: i64) -> i64 {
        assert!(stop > 0, "empty range for randrange()");
        self.randbelow(stop as u64) as i64
    }

    /// `randrange(start, stop)` (step 1): `start + _randbelow(stop - start)`.
    ///
    /// # Panics
    /// If `stop <= start` (Python raises `ValueError`).
    pub fn randrange2(&mut self, start: i64, stop: i64) -> i64 {
        let width = i128::from(stop) - i128::from(start);
        assert!(width > 0, "empty range for randrange() ({start}, {stop}, {width})");
        (i128::from(start) + i128::from(self.randbelow(width as u64))) as i64
    }

    /// `randint(a, b)` = `randrange(a, b + 1)`: uniform in `[a, b]`.
    ///
    /// # Panics
    /// If `b < a`, or `b == i64::MAX`.
    pub fn randint(&mut self, a: i64, b: i64) -> i64 {
        self.randrange2(a, b + 1)
    }

    /// `choice(seq)` = `seq[_randbelow(len(seq))]`; `None` (nothing consumed)
    /// for an empty slice, where Python raises `IndexError`.
    pub fn choice<'a, T>(&mut self, seq: &'a [T]) -> Option<&'a T> {
        if seq.is_empty() {
            return None;
        }
        let i = self.randbelow(seq.len() as u64) as usize;
        seq.get(i)
    }

    /// `choices(population, k=k)` without weights:
    /// `[population[floor(random() * n)] for _ in range(k)]`.
    ///
    /// # Panics
    /// If `population` is empty and `k > 0` (Python raises `IndexError`).
    pub fn choices<'a, T>(&mut self, population: &'a [T], k: usize) -> Vec<&'a T> {
        let n = population.len() as f64;
        (0..k).map(|_| &population[(self.random() * n).floor() as usize]).collect()
    }

    /// `randbytes(n)` = `getrandbits(n * 8).to_bytes(n, 'little')`: the raw
    /// 32-bit outputs in little-endian order; a final partial word (when
    /// `n % 4 != 0`) contributes the *top* `8 * (n % 4)` bits of its output.
    pub fn randbytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n);
        let full = n / 4;
        for _ in 0..full {
            out.extend_from_slice(&self.genrand_u32().to_le_bytes());
        }
        let rem = n % 4;
        if rem != 0 {
            let w = self.genrand_u32() >> (32 - 8 * rem as u32);
            out.extend_from_slice(&w.to_le_bytes()[..rem]);
        }
        out
    }
}

// ---------------------------------------------------------------------------
// Word lists (copied verbatim from workload.py and split like str.split())
// ---------------------------------------------------------------------------

/// `_FUNCTION_WORDS` of workload.py (frequent function words), whitespace-separated.
const FUNCTION_WORDS_SRC: &str = r#"
the the the the of of of and and and to to to a a a in in is is it that for
on with as was be by this are or from at not but have an they which one you
were all we can her has there been if more when will would who so no its
into than them only other new some could these then two may first any like
now my such make over our even most after also did many before must through
back years where much your way well down should because each just those
people how too little state good very make world still own see men work long
get here between both life being under never day same another know while last
might us great old year off come since against go came right used take three
"#;

/// `_CONTENT_WORDS` of workload.py (technical / content vocabulary), whitespace-separated.
const CONTENT_WORDS_SRC: &str = r#"
server client resource protocol message request response context model token
stream buffer latency throughput benchmark document section paragraph example
value field schema object array string number boolean null version session
transport handshake capability notification cursor page result error status
system network process thread memory cache queue channel socket pipe signal
configuration parameter argument option default setting environment variable
function method class module package library framework interface component
service endpoint handler callback event listener promise future task worker
database table column index query record transaction commit rollback snapshot
security token credential permission policy audit access control boundary
design pattern structure principle analysis measurement experiment evidence
history culture language music river mountain forest garden village harbor
winter summer morning evening journey letter window kitchen teacher student
question answer problem solution reason method purpose effect change growth
quickly slowly carefully rarely often usually simply clearly roughly exactly
important different possible available following previous internal external
large small early late recent common special general particular significant
interesting reliable efficient consistent deterministic concurrent sequential
understand consider include provide require describe represent establish
compare measure improve reduce increase support handle receive deliver gather
serialize deserialize tokenize encode decode validate negotiate paginate
approximately notwithstanding interoperability characteristically
implementation documentation specification infrastructure responsibilities
asynchronous multiplexing backpressure idempotent heuristics observability
"#;

/// `_PROPER` of workload.py (proper nouns), whitespace-separated.
const PROPER_SRC: &str = r#"
Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Oscar Peggy
Trent Victor Walter London Paris Berlin Tokyo Lisbon Oslo Nairobi Lima Quebec
Monday Tuesday Friday January March October Rust Python TypeScript Linux
"#;

/// `_END_PUNCT` of workload.py.
pub const END_PUNCT: [&str; 9] = [".", ".", ".", ".", ".", ".", "?", "!", ";"];

/// `_FUNCTION_WORDS` (in order, duplicates kept).
pub fn function_words() -> Vec<&'static str> {
    FUNCTION_WORDS_SRC.split_ascii_whitespace().collect()
}

/// `_CONTENT_WORDS` (in order, duplicates kept).
pub fn content_words() -> Vec<&'static str> {
    CONTENT_WORDS_SRC.split_ascii_whitespace().collect()
}

/// `_PROPER` (in order).
pub fn proper_words() -> Vec<&'static str> {
    PROPER_SRC.split_ascii_whitespace().collect()
}

/// `_WORDS = _FUNCTION_WORDS * 3 + _CONTENT_WORDS + _PROPER` (list repetition:
/// the function-word list appears three times in a row), built once.
pub fn words() -> &'static [&'static str] {
    static WORDS: OnceLock<Vec<&'static str>> = OnceLock::new();
    WORDS.get_or_init(|| {
        let f = function_words();
        let mut w = Vec::with_capacity(3 * f.len() + 512);
        for _ in 0..3 {
            w.extend_from_slice(&f);
        }
        w.extend(content_words());
        w.extend(proper_words());
        w
    })
}

// ---------------------------------------------------------------------------
// Pseudo-English text and blobs
// ---------------------------------------------------------------------------

/// `_sentence(rng)`: one pseudo-English sentence, consuming `rng` exactly like
/// Python.
///
/// Note Python's evaluation order in `words[rng.randrange(k)] = <rhs>`: the
/// right-hand side (its `randint` calls) is evaluated *before* the subscript's
/// `randrange(k)`.
pub fn sentence(rng: &mut Random) -> String {
    let pool = words();
    let k = rng.randint(5, 22);
    let mut ws: Vec<Cow<'static, str>> = rng.choices(pool, k as usize).into_iter().map(|s| Cow::Borrowed(*s)).collect();
    let r = rng.random();
    if r < 0.08 {
        let v = rng.randint(2, 99_999).to_string();
        let j = rng.randrange(k) as usize;
        ws[j] = Cow::Owned(v);
    } else if r < 0.12 {
        let a = rng.randint(0, 99);
        let b = rng.randint(0, 9);
        let j = rng.randrange(k) as usize;
        ws[j] = Cow::Owned(format!("{a}.{b}%"));
    } else if r < 0.15 {
        let j = rng.randrange(k) as usize;
        ws[j] = Cow::Owned(format!("\"{}\"", ws[j]));
    } else if r < 0.18 {
        let j = rng.randrange(k) as usize;
        ws[j] = Cow::Owned(format!("({})", ws[j]));
    }
    if k > 9 && rng.random() < 0.5 {
        let j = rng.randrange2(2, k - 2) as usize;
        ws[j].to_mut().push(',');
    }
    // words[0][:1].upper() + words[0][1:]  (all words are ASCII)
    let mut s = String::with_capacity(ws.iter().map(|w| w.len() + 1).sum::<usize>() + 1);
    for (idx, w) in ws.iter().enumerate() {
        if idx > 0 {
            s.push(' ');
        }
        s.push_str(w);
    }
    if let Some(first) = s.get_mut(..1) {
        first.make_ascii_uppercase();
    }
    s.push_str(rng.choice(&END_PUNCT).copied().unwrap_or("."));
    s
}

/// `make_text(seed, size)`: deterministic pseudo-English ASCII text of exactly
/// `size` bytes (paragraphs of 2..=7 sentences joined with `"\n\n"`, cut to
/// `size`).
pub fn make_text(seed: u128, size: usize) -> String {
    if size == 0 {
        return String::new();
    }
    let mut rng = Random::new(seed);
    let mut text = String::with_capacity(size + 4096);
    let mut n: i64 = -2; // length of "\n\n".join(chunks)
    while n < size as i64 {
        let count = rng.randint(2, 7);
        let mut para = String::new();
        for s in 0..count {
            if s > 0 {
                para.push(' ');
            }
            para.push_str(&sentence(&mut rng));
        }
        if n >= 0 {
            text.push_str("\n\n");
        }
        n += 2 + para.len() as i64;
        text.push_str(&para);
    }
    text.truncate(size); // ASCII, so a byte cut is a char cut
    text
}

/// `blob_bytes(seed, size)` = `Random(seed ^ 0x5EED_B10B).randbytes(size)`.
pub fn blob_bytes(seed: u128, size: usize) -> Vec<u8> {
    Random::new(seed ^ BLOB_SEED_XOR).randbytes(size)
}

// ---------------------------------------------------------------------------
// Resources
// ---------------------------------------------------------------------------

/// Whether resource `i` is a blob (every 10th: `i % 10 == 9`).
pub fn is_blob(i: usize) -> bool {
    i % BLOB_EVERY == BLOB_EVERY - 1
}

/// `bench://doc/{i}`.
pub fn resource_uri(i: usize) -> String {
    format!("bench://doc/{i}")
}

/// `base_seed * 1_000_003 + i`, exact (no overflow for any `u64` base seed).
pub fn resource_seed(base_seed: u64, i: usize) -> u128 {
    u128::from(base_seed) * RESOURCE_SEED_MUL + i as u128
}

/// `blob_placeholder(mime)`: `[Binary Data ({mime or 'application/octet-stream'})]`.
pub fn blob_placeholder(mime: Option<&str>) -> String {
    let m = match mime {
        Some(m) if !m.is_empty() => m,
        _ => "application/octet-stream",
    };
    format!("[Binary Data ({m})]")
}

/// `annotations.priority` of resource `i`: `round((i % 11) / 10, 1)`.
///
/// `(i % 11) as f64 / 10.0` is the correctly rounded quotient, which is
/// exactly the double Python's `round(..., 1)` returns (0.0, 0.1, ..., 1.0).
pub fn priority(i: usize) -> f64 {
    (i % 11) as f64 / 10.0
}

/// One benchmark resource: `resources/list` metadata plus its single content
/// item (`text` for text/plain, base64 `blob_b64` for image/png).
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceSpec {
    /// `bench://doc/{i}`.
    pub uri: String,
    /// `doc-{i}`.
    pub name: String,
    /// `Benchmark document {i}`.
    pub title: String,
    /// `Deterministic benchmark {image blob|text document} #{i} ({size} bytes, seed {rseed}).`
    pub description: String,
    /// `image/png` or `text/plain`.
    pub mime: &'static str,
    /// Content size in bytes (the `size` workload parameter).
    pub size: usize,
    /// `annotations.priority`; `annotations.audience` is always [`AUDIENCE`].
    pub priority: f64,
    /// Text content (text resources only).
    pub text: Option<String>,
    /// Standard base64 (with padding) of the blob bytes (blob resources only).
    pub blob_b64: Option<String>,
}

/// Builds resource `i` of a workload with content `size` and base `seed`.
pub fn build_one(i: usize, size: usize, seed: u64) -> ResourceSpec {
    let rseed = resource_seed(seed, i);
    let blob = is_blob(i);
    let mime = if blob { BLOB_MIME } else { TEXT_MIME };
    let kind = if blob { "image blob" } else { "text document" };
    let (text, blob_b64) = if blob {
        let b64 = base64::engine::general_purpose::STANDARD.encode(blob_bytes(rseed, size));
        (None, Some(b64))
    } else {
        (Some(make_text(rseed, size)), None)
    };
    ResourceSpec {
        uri: resource_uri(i),
        name: format!("doc-{i}"),
        title: format!("Benchmark document {i}"),
        description: format!("Deterministic benchmark {kind} #{i} ({size} bytes, seed {rseed})."),
        mime,
        size,
        priority: priority(i),
        text,
        blob_b64,
    }
}

/// All `n` resources in list order (`build_workload` of bench_server.py).
///
/// `page_size` does not influence the resources (see [`page_cursors`]); it is
/// accepted to mirror `build_workload(n, size, page_size, seed)`.
pub fn build(n: usize, size: usize, page_size: usize, seed: u64) -> Vec<ResourceSpec> {
    let _ = page_size;
    (0..n).map(|i| build_one(i, size, seed)).collect()
}

/// The `resources/list` pages: `(cursor, index range, nextCursor)`.
///
/// The first page has cursor `None`, page starting at `s` has `offset:{s}`;
/// `nextCursor` is `offset:{end}` or `None` on the last page. With `n == 0`
/// there is still one (empty) page with cursor `None`. A `page_size` of 0
/// (rejected by bench_server.py) is treated as 1.
pub fn page_cursors(n: usize, page_size: usize) -> Vec<(Option<String>, Range<usize>, Option<String>)> {
    let ps = page_size.max(1);
    let mut starts: Vec<usize> = (0..n).step_by(ps).collect();
    if starts.is_empty() {
        starts.push(0);
    }
    starts
        .into_iter()
        .map(|start| {
            let end = start + ps;
            let cursor = if start == 0 { None } else { Some(format!("offset:{start}")) };
            let next = if end < n { Some(format!("offset:{end}")) } else { None };
            (cursor, start..end.min(n), next)
        })
        .collect()
}

/// The canonical LLM-context string: for every resource in list order, its
/// text (text resources) or `[Binary Data ({mime})]` (blobs), joined with
/// `"\n\n"`. For the default workload this is 1 847 698 ASCII characters.
pub fn context_string(specs: &[ResourceSpec]) -> String {
    let mut out = String::new();
    for (k, s) in specs.iter().enumerate() {
        if k > 0 {
            out.push_str(CONTEXT_JOINER);
        }
        match &s.text {
            Some(t) => out.push_str(t),
            None => out.push_str(&blob_placeholder(Some(s.mime))),
        }
    }
    out
}
