//! A debugging aid, not a test: `EDGE_RUN_DUMP=1 DUMP_IDS=504,3575 cargo test --release -p edge-tests --test dump_trace -- --ignored --nocapture`
//! prints every op's output for one prompt, to compare with llama-eval-callback.
#[test]
#[ignore = "a debugging aid (prints a per-op trace): run with --ignored --nocapture"]
fn dump_prompt() {
    let ids: Vec<u32> = std::env::var("DUMP_IDS")
        .unwrap_or("504".into())
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let model =
        std::sync::Arc::new(edge_engine::model::Model::load(edge_tests::smollm2_path()).unwrap());
    let mut s = edge_engine::session::Session::new(
        model,
        &edge_engine::session::SessionConfig {
            ctx: Some(256),
            threads: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    s.prefill(&ids).unwrap();
}
