//! GGUF reader: arbitrary bytes must parse or give an error, never panic; a file that parses
//! must build a `Model` or give an error (and its tokenizer, if it has one, must build or
//! error), never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(gguf) = edge_engine::gguf::Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    // Tokenizer alone (vocabulary-only files are valid inputs of `edge-run tokenize`).
    if let Ok(tok) = edge_engine::model::vocab::tokenizer_from_gguf(&gguf) {
        let _ = tok.encode("Hello world <|endoftext|> ü", true, true);
    }
    let _ = edge_engine::model::Model::from_gguf(gguf);
});
