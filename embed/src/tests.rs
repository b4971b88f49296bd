//! The encoder against the reference that scripts/minilm_weights.py prints: the token ids of the
//! model's own tokenizer (the `tokenizers` library on its tokenizer.json) and the embeddings that
//! numpy computes from the same 4-bit weights.

use super::*;

const PROBE: &str = "How do I make a Python script executable on Unix? Ünïcödé, naïve café 東京 don't-stop x=1;";

fn cos(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn token_ids_are_the_model_tokenizers() {
    let ids = Encoder::get().ids(PROBE);
    let expected = [
        101, 2129, 2079, 1045, 2191, 1037, 18750, 5896, 4654, 8586, 23056, 2006, 19998, 1029, 27260, 1010, 15743, 7668,
        1879, 1755, 2123, 1005, 1056, 1011, 2644, 1060, 1027, 1015, 1025, 102,
    ];
    assert_eq!(ids, expected);
    // A word longer than 100 characters is one [UNK]; the cut keeps the first pieces.
    assert_eq!(Encoder::get().ids(&"a".repeat(101)), [101, 100, 102]);
    assert_eq!(Encoder::get().ids(&"word ".repeat(1000)).len(), MAX_PIECES + 2);
}

#[test]
fn embeddings_match_the_reference_arithmetic() {
    let e = Encoder::get();
    // 30 tokens: the SGEMM path.
    let v = e.embed(PROBE);
    let expected = [0.012116, 0.020523, -0.036973, -0.031477, -0.036841, -0.080151, 0.040157, 0.004296];
    for (got, want) in v.iter().zip(expected) {
        assert!((got - want).abs() < 2e-4, "{:?} against {expected:?}", &v[..8]);
    }
    assert!((cos(&v, &v) - 1.0).abs() < 1e-5);
    // Short sentences: the dot-product path. numpy on the 4-bit weights gives 0.6929, 0.1574, 0.1968
    // (full precision: 0.6660, 0.1046, 0.1411, the sentence-transformers quickstart's figures).
    let s = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."].map(|s| e.embed(s));
    let got = [cos(&s[0], &s[1]), cos(&s[0], &s[2]), cos(&s[1], &s[2])];
    for (g, w) in got.iter().zip([0.6929, 0.1574, 0.1968]) {
        assert!((g - w).abs() < 2e-3, "similarities {got:?}");
    }
}

#[test]
fn the_same_text_gives_the_same_bits() {
    let e = Encoder::get();
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(30);
    for text in ["a short question?", long.as_str()] {
        let a = e.embed(text);
        let b = std::thread::spawn({
            let text = text.to_owned();
            move || Encoder::get().embed(&text)
        })
        .join()
        .unwrap();
        assert_eq!(
            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}
