//! Chat templates: arbitrary template text rendered over arbitrary messages must render or
//! give an error, never panic or hang (fuel, recursion and output limits apply).
//!
//! Input: template text, then after a NUL byte the messages as `role\x1fcontent` records
//! separated by `\x1e`.
//!
//! Inputs using `+` are skipped: minijinja 3.1's fuel pays for the strings that `~`, `*`,
//! filters and methods build, but not for materializing a list concatenated with itself 33
//! times (`l = l + l`: 2^33 items), a known limit (see the README); `+` on strings is
//! covered by the CLI's and the tokenizer crate's tests.
#![no_main]

use edge_tokenizers::chat::{ChatMessage, ChatTemplate, ChatTemplateLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (source, msgs) = text.split_once('\0').unwrap_or((&text, "user\x1fhello"));
    if source.len() > 4096 || source.contains('+') {
        return;
    }
    let messages: Vec<ChatMessage> = msgs
        .split('\x1e')
        .take(16)
        .map(|m| {
            let (role, content) = m.split_once('\x1f').unwrap_or(("user", m));
            ChatMessage::new(role, content)
        })
        .collect();
    // Small limits keep each run fast; the defaults are what the CLI uses.
    let limits = ChatTemplateLimits {
        fuel: 100_000,
        recursion: 64,
        max_output_bytes: 1 << 20,
    };
    if let Ok(t) = ChatTemplate::with_limits(source, "<s>", "</s>", limits) {
        for gen in [false, true] {
            if let Ok(out) = t.render(&messages, gen) {
                assert!(out.len() <= 1 << 20);
            }
        }
    }
});
