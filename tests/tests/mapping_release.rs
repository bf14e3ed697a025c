//! A backend that copied the weights elsewhere (CUDA's upload or managed buffer) releases the
//! file mapping's resident pages, and the mapping still reads the same bytes afterwards. Its own
//! test binary, so no other test touches the mapping meanwhile.

use edge_engine::gguf::Gguf;
use edge_tests::{mapped_rss, smollm2_path};

#[test]
fn released_pages_leave_the_process_and_read_back_the_same() {
    if !std::path::Path::new("/proc/self/smaps").exists() {
        return edge_tests::missing("/proc/self/smaps", "the memory tests read Linux's /proc");
    }
    let path = smollm2_path();
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    let gguf = Gguf::open(&path).unwrap();
    let checksum = |g: &Gguf| -> u64 {
        g.tensors()
            .iter()
            .map(|t| g.tensor_data(t).iter().map(|&b| u64::from(b)).sum::<u64>())
            .sum()
    };
    let before = checksum(&gguf);
    let touched = mapped_rss(&name);
    assert!(
        touched > 80 << 20,
        "reading every tensor makes the file resident: {touched}"
    );
    gguf.release_resident_pages().unwrap();
    let released = mapped_rss(&name);
    eprintln!("file pages resident: {touched} bytes after reading, {released} after release");
    assert!(released < 1 << 20, "{released} bytes still resident");
    assert_eq!(
        checksum(&gguf),
        before,
        "the mapping reads the same bytes again"
    );
}
