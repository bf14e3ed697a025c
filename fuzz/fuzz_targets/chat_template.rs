//! Chat templates: arbitrary template text rendered over arbitrary messages must render or
//! give an error, never panic or hang (fuel, recursion and output limits apply).
//!
//! Input: template text, then after a NUL byte the messages as `role\x1fcontent` records
//! separated by `\x1e`.
//!
//! Inputs using string concatenation or repetition (`~`, `+`, `*`) are skipped: minijinja
//! bounds loops (fuel), recursion and output, but not the memory one expression may build
//! (doubling a string 40 times in a loop takes 40 steps), so those would only find that
//! known limit (see the README).
#![no_main]

use edge_tokenizers::chat::{ChatMessage, ChatTemplate, ChatTemplateLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (source, msgs) = text.split_once('\0').unwrap_or((&text, "user\x1fhello"));
    if source.len() > 4096 || source.contains(['~', '+', '*']) {
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
