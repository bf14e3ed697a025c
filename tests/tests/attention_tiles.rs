//! Batched attention with several tokens per job (the default for a prompt of one sequence)
//! against one token per job (`EDGE_RUN_ATTENTION_TILES=0`, the path the reference tests pinned
//! to llama.cpp's batched order before the tiles): the same logits, bit for bit, after a
//! 700-token prompt in one ubatch (the cache read in chunks of 256 rows, each tile's later
//! tokens adding their last rows apart) and after a second prompt appended to a cached first
//! (positions not starting at 0). One test in this binary: it sets the variable, which every
//! session created afterwards in the process reads.

use std::sync::Arc;

use edge_engine::model::Model;
use edge_engine::session::{Session, SessionConfig};
use edge_tests::smollm2_path;

fn logits_after(model: &Arc<Model>, parts: &[&[u32]]) -> Vec<Vec<f32>> {
    let cfg = SessionConfig {
        ctx: Some(1024),
        ubatch: Some(700),
        threads: Some(2),
        ..Default::default()
    };
    let mut session = Session::new(model.clone(), &cfg).unwrap();
    parts
        .iter()
        .map(|p| session.prefill(p).unwrap().to_vec())
        .collect()
}

#[test]
fn tokens_together_give_the_bits_of_one_token_per_job() {
    let model = Arc::new(Model::load(smollm2_path()).expect("loading SmolLM2"));
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("reference/perplexity/gpl-3-excerpt.txt"),
    )
    .unwrap();
    let tokens = model.tokenize(&text, true, false).unwrap();
    assert!(tokens.len() >= 1000, "{} tokens", tokens.len());
    let long = &tokens[..700];
    let (first, second) = (&tokens[..301], &tokens[301..650]);
    let tiled = [
        logits_after(&model, &[long]),
        logits_after(&model, &[first, second]),
    ];
    // SAFETY (set_var): this binary's only test, and no other thread of it reads the
    // environment meanwhile (the sessions above are dropped with their threads).
    std::env::set_var("EDGE_RUN_ATTENTION_TILES", "0");
    let alone = [
        logits_after(&model, &[long]),
        logits_after(&model, &[first, second]),
    ];
    std::env::remove_var("EDGE_RUN_ATTENTION_TILES");
    for (case, (t, a)) in ["700 tokens", "301 + 349 tokens"]
        .iter()
        .zip(tiled.iter().zip(&alone))
    {
        for (part, (x, y)) in t.iter().zip(a).enumerate() {
            let differ = x
                .iter()
                .zip(y)
                .filter(|(p, q)| p.to_bits() != q.to_bits())
                .count();
            assert_eq!(differ, 0, "{case}, part {part}: {differ} logits differ");
        }
    }
}
