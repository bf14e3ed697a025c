//! Tokenizers built from llama.cpp's reference vocabularies (BPE, SentencePiece, WordPiece;
//! `../shared/reference/tokenizer/`, or `EDGE_RUN_SHARED`): arbitrary text is tokenized with
//! and without special-token parsing and BOS/EOS, and arbitrary id lists are detokenized
//! (whole and streamed), never panicking.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use edge_tokenizers::{StreamDecoder, Tokenizer};
use libfuzzer_sys::fuzz_target;

const VOCABS: &[&str] = &[
    "ggml-vocab-gpt-2.gguf",
    "ggml-vocab-llama-bpe.gguf",
    "ggml-vocab-llama-spm.gguf",
    "ggml-vocab-bert-bge.gguf",
    "ggml-vocab-qwen2.gguf",
    "ggml-vocab-phi-3.gguf",
];

fn tokenizers() -> &'static Vec<Tokenizer> {
    static T: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = match std::env::var_os("EDGE_RUN_SHARED") {
            Some(p) => PathBuf::from(p),
            None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
        }
        .join("reference/tokenizer");
        VOCABS
            .iter()
            .map(|name| {
                let path = dir.join(name);
                let g = edge_engine::gguf::Gguf::open(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                edge_engine::model::vocab::tokenizer_from_gguf(&g)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let toks = tokenizers();
    let tok = &toks[sel as usize % toks.len()];
    let text = String::from_utf8_lossy(rest);
    let add_special = sel & 0x40 != 0;
    let parse_special = sel & 0x80 != 0;
    if let Ok(ids) = tok.encode(&text, add_special, parse_special) {
        assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
        let _ = tok.decode(&ids);
    }
    // The same bytes as token ids (any value, in range or not).
    let ids: Vec<u32> = rest
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .map(|id| {
            if sel & 1 == 0 {
                id % tok.n_vocab() as u32
            } else {
                id
            }
        })
        .collect();
    let _ = tok.decode(&ids);
    let mut stream = StreamDecoder::new();
    for &id in &ids {
        let _ = tok.token_to_piece(id);
        let _ = tok.is_eog(id);
        let _ = stream.push(id, tok);
    }
    let _ = stream.flush();
});
