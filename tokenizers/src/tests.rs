use crate::config::VocabConfig;
use crate::error::TokenizerError;
use crate::tokenizer::Tokenizer;

fn cfg(model: &str, pre: Option<&str>) -> VocabConfig {
    VocabConfig {
        model: model.to_string(),
        pre: pre.map(str::to_string),
        tokens: vec!["a".into(), "b".into(), "ab".into()],
        merges: Some(vec!["a b".into()]),
        ..Default::default()
    }
}

#[test]
fn unknown_model_is_an_error() {
    let e = Tokenizer::from_config(cfg("rwkv", None))
        .err()
        .expect("error");
    let msg = e.to_string();
    assert!(
        msg.contains("rwkv")
            && msg.contains("gpt2")
            && msg.contains("llama")
            && msg.contains("bert"),
        "{msg}"
    );
}

#[test]
fn unknown_pre_is_an_error() {
    let e = Tokenizer::from_config(cfg("gpt2", Some("no-such-pre")))
        .err()
        .expect("error");
    let msg = e.to_string();
    assert!(
        msg.contains("no-such-pre") && msg.contains("llama-bpe"),
        "{msg}"
    );
}

#[test]
fn bpe_needs_merges() {
    let mut c = cfg("gpt2", Some("gpt-2"));
    c.merges = None;
    assert!(matches!(
        Tokenizer::from_config(c),
        Err(TokenizerError::MissingMerges)
    ));
}

#[test]
fn tiny_bpe_merges() {
    let t = Tokenizer::from_config(cfg("gpt2", Some("gpt-2"))).unwrap();
    assert_eq!(t.encode("ab", false, false).unwrap(), vec![2]);
    assert_eq!(t.decode(&[2, 0]), "aba");
}

#[test]
fn tokenizer_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
}
