//! Writes one of the synthetic random-weight models of `edge_tests::synth` to a file, so that
//! llama.cpp (`shared/peer/llama-ref.py`) can make reference outputs from the very same bytes.
//!
//!   make-arch-model ARCH OUT.gguf [DONOR.gguf]
//!
//! ARCH: qwen2, qwen3, llama3, phi3, gemma2, gemma3. DONOR (default: the SmolLM2 model of the
//! tests) provides the tokenizer metadata. Prints the SHA-256 of the file.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!(
            "usage: make-arch-model ARCH OUT.gguf [DONOR.gguf]   (ARCH: {})",
            edge_tests::synth::ARCH_MODELS.join(", ")
        );
        std::process::exit(2);
    }
    let donor_path = args
        .get(3)
        .map_or_else(edge_tests::smollm2_path, std::path::PathBuf::from);
    let donor = match edge_engine::gguf::Gguf::open(&donor_path) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: donor {}: {e}", donor_path.display());
            std::process::exit(1);
        }
    };
    let bytes = match edge_tests::synth::make_arch_model(&args[1], &donor) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = std::fs::write(&args[2], &bytes) {
        eprintln!("error: writing {}: {e}", args[2]);
        std::process::exit(1);
    }
    println!("{}", edge_tests::synth::sha256_hex(&bytes));
}
