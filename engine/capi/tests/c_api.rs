//! The C API: the committed header against cbindgen's output, the C example built with the
//! system `cc` against the static and the shared library and run on the real model (its text
//! compared with llama.cpp's greedy reference, and under valgrind when it is installed), and the
//! entry points' handling of bad arguments.

use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::Command;

use edge_tests::{ids, read_jsonl, shared_dir, smollm2_path};
use edgerun::*;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn header_is_up_to_date() {
    let dir = manifest_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen")
        .write(&mut generated);
    let path = dir.join("include/edgerun.h");
    if std::env::var_os("EDGERUN_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale: regenerate it with `EDGERUN_BLESS=1 cargo test -p edge-run-capi --test c_api header`",
        path.display()
    );
}

/// The directory with libedgerun.a and libedgerun.so as built for this test run: cargo builds
/// the library, every crate type, into the directory of this test binary
/// (`target/<profile>/deps`); only `cargo build` copies them up to `target/<profile>`, so
/// the copies there may be stale.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    assert!(
        deps.join("libedgerun.a").exists() && deps.join("libedgerun.so").exists(),
        "libedgerun.a or libedgerun.so is not in {} (cargo builds them with the tests of edge-run-capi)",
        deps.display()
    );
    deps
}

/// Compiles examples/generate.c with the system C compiler; `link` are the library arguments.
fn build_example(name: &str, link: &[String]) -> PathBuf {
    let dir = manifest_dir();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-g",
            "-O1",
            "-I",
        ])
        .arg(dir.join("include"))
        .arg(dir.join("examples/generate.c"))
        .args(link)
        .arg("-o")
        .arg(&out)
        .status()
        .expect("running cc: a C compiler is needed for this test");
    assert!(status.success(), "compiling examples/generate.c failed");
    out
}

/// Runs the example on the first reference prompt with `threads` threads and returns (stdout,
/// expected text for `n` tokens).
fn run_example(cmd: &mut Command, n: usize, threads: usize) -> (String, String) {
    let case = &read_jsonl(&shared_dir().join("reference/smollm2/greedy.jsonl"))[0];
    let want_ids = ids(&case["ids"]);
    assert!(n <= want_ids.len());
    let model = edge_engine::model::Model::load(smollm2_path()).unwrap();
    let want = model.detokenize(&want_ids[..n], false);
    if n == want_ids.len() {
        assert_eq!(want, case["text"].as_str().unwrap());
    }
    let out = cmd
        .arg(smollm2_path())
        .arg(case["prompt"].as_str().unwrap())
        .arg(n.to_string())
        .arg(threads.to_string())
        .output()
        .expect("running the example");
    assert!(
        out.status.success(),
        "the example failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (String::from_utf8(out.stdout).unwrap(), want)
}

#[test]
fn c_example_generates_llama_cpp_text_static_shared_and_under_valgrind() {
    let lib = lib_dir();
    // What a Rust static library needs from the C runtime on Linux.
    let system_libs = ["-lpthread", "-ldl", "-lm", "-lrt"].map(String::from);
    let mut static_link = vec![lib.join("libedgerun.a").display().to_string()];
    static_link.extend(system_libs.iter().cloned());
    let exe = build_example("generate-static", &static_link);
    let (got, want) = run_example(&mut Command::new(&exe), 32, 1);
    assert_eq!(got, want, "static build");

    let shared_link = vec![
        format!("-L{}", lib.display()),
        "-ledgerun".into(),
        format!("-Wl,-rpath,{}", lib.display()),
    ];
    let shared = build_example("generate-shared", &shared_link);
    let (got, want) = run_example(&mut Command::new(&shared), 8, 2);
    assert_eq!(got, want, "shared build");

    // Few tokens: valgrind runs the kernels some 50 times slower. Two threads, so that the
    // session's worker thread is started and must be joined when the session is freed (an
    // unjoined thread shows as "possibly lost"). What stays "still reachable" at exit are
    // process-wide tables built once (the tokenizer's Unicode table, its hash seeds), not
    // per-model or per-session memory.
    if Command::new("valgrind").arg("--version").output().is_err() {
        return edge_tests::missing("valgrind", "install it (Debian: apt-get install valgrind)");
    }
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--leak-check=full",
        "--errors-for-leak-kinds=definite,possible",
        "--error-exitcode=1",
        "--quiet",
    ])
    .arg(&exe);
    let (got, want) = run_example(&mut cmd, 3, 2);
    assert_eq!(got, want, "under valgrind");
}

// ---- the entry points, called from Rust as C would ----

fn last_error() -> String {
    // SAFETY: the library returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(edgerun_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn c_path(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.to_str().unwrap()).unwrap()
}

#[test]
fn bad_arguments_are_errors_not_crashes() {
    use edgerun_status::*;
    let mut model: *mut edgerun_model = std::ptr::dangling_mut();
    // SAFETY (all calls below): every pointer is NULL, a live local, or a live handle.
    unsafe {
        assert_eq!(
            edgerun_model_load(std::ptr::null(), &mut model),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        assert!(model.is_null(), "the output is NULL after a failure");
        assert!(last_error().contains("path is NULL"), "{}", last_error());
        let bad_utf8 = c"/tmp/\xff.gguf";
        assert_eq!(
            edgerun_model_load(bad_utf8.as_ptr(), &mut model),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("not UTF-8"), "{}", last_error());
        assert_eq!(
            edgerun_model_load(c"/nonexistent/model.gguf".as_ptr(), &mut model),
            EDGERUN_ERR_IO
        );
        let not_gguf = c_path(&manifest_dir().join("Cargo.toml"));
        assert_eq!(
            edgerun_model_load(not_gguf.as_ptr(), &mut model),
            EDGERUN_ERR_MODEL
        );
        assert!(last_error().contains("GGUF"), "{}", last_error());
        assert_eq!(
            edgerun_model_load(not_gguf.as_ptr(), std::ptr::null_mut()),
            EDGERUN_ERR_INVALID_ARGUMENT
        );

        // NULL handles everywhere.
        let mut n = 0usize;
        let mut session: *mut edgerun_session = std::ptr::null_mut();
        assert_eq!(
            edgerun_tokenize(
                std::ptr::null(),
                c"hi".as_ptr(),
                true,
                true,
                std::ptr::null_mut(),
                0,
                &mut n
            ),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            edgerun_session_new(std::ptr::null(), std::ptr::null(), &mut session),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            edgerun_prefill(std::ptr::null_mut(), [1u32].as_ptr(), 1),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            edgerun_step(std::ptr::null_mut(), 1),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            edgerun_session_reset(std::ptr::null_mut()),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            edgerun_generate(
                std::ptr::null_mut(),
                std::ptr::null(),
                0,
                std::ptr::null(),
                None,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        assert_eq!(edgerun_model_n_vocab(std::ptr::null()), 0);
        edgerun_model_free(std::ptr::null_mut());
        edgerun_session_free(std::ptr::null_mut());
    }
}

/// Collects tokens and text; stops after `stop_after` tokens.
struct Collect {
    tokens: Vec<u32>,
    text: String,
    stop_after: usize,
}

unsafe extern "C" fn collect(
    user: *mut c_void,
    token: u32,
    text: *const c_char,
    len: usize,
) -> bool {
    // SAFETY: `user` is the `Collect` passed to edgerun_generate below, alive and not aliased
    // during the call; `text` holds `len` bytes plus a NUL.
    let (c, bytes) = unsafe {
        (
            &mut *user.cast::<Collect>(),
            std::slice::from_raw_parts(text.cast::<u8>(), len + 1),
        )
    };
    assert_eq!(bytes[len], 0, "text is NUL-terminated");
    c.text.push_str(std::str::from_utf8(&bytes[..len]).unwrap());
    if token != EDGERUN_TOKEN_NONE {
        c.tokens.push(token);
    }
    c.tokens.len() < c.stop_after
}

#[test]
fn model_session_tokenize_generate_through_the_c_functions() {
    use edgerun_status::*;
    let case = &read_jsonl(&shared_dir().join("reference/smollm2/greedy.jsonl"))[1];
    let prompt = std::ffi::CString::new(case["prompt"].as_str().unwrap()).unwrap();
    let (prompt_ids, want) = (ids(&case["prompt_ids"]), ids(&case["ids"]));
    let path = c_path(&smollm2_path());
    // SAFETY (all calls below): every pointer is NULL, a live local or buffer of the size
    // passed, or a live handle; handles are freed once, at the end.
    unsafe {
        let mut model = std::ptr::null_mut();
        assert_eq!(edgerun_model_load(path.as_ptr(), &mut model), EDGERUN_OK);
        let n_vocab = edgerun_model_n_vocab(model);
        assert_eq!(n_vocab, 49152);

        // Tokenize: ask for the size, a buffer too small, then the right one.
        let mut n = 0usize;
        let mut small = [0u32; 2];
        assert_eq!(
            edgerun_tokenize(
                model,
                prompt.as_ptr(),
                true,
                true,
                small.as_mut_ptr(),
                2,
                &mut n
            ),
            EDGERUN_ERR_BUFFER_TOO_SMALL
        );
        assert_eq!(n, prompt_ids.len());
        let mut tokens = vec![0u32; n];
        assert_eq!(
            edgerun_tokenize(
                model,
                prompt.as_ptr(),
                true,
                true,
                tokens.as_mut_ptr(),
                n,
                &mut n
            ),
            EDGERUN_OK
        );
        assert_eq!(tokens, prompt_ids);

        // Detokenize: the prompt back, NUL-terminated; too small a buffer reports the length.
        let mut buf = vec![0 as c_char; 256];
        let mut len = 0usize;
        assert_eq!(
            edgerun_detokenize(
                model,
                tokens.as_ptr(),
                n,
                false,
                buf.as_mut_ptr(),
                4,
                &mut len
            ),
            EDGERUN_ERR_BUFFER_TOO_SMALL
        );
        assert_eq!(len, prompt.as_bytes().len());
        assert_eq!(
            edgerun_detokenize(
                model,
                tokens.as_ptr(),
                n,
                false,
                buf.as_mut_ptr(),
                buf.len(),
                &mut len
            ),
            EDGERUN_OK
        );
        assert_eq!(CStr::from_ptr(buf.as_ptr()), prompt.as_c_str());
        assert_eq!(
            edgerun_token_to_piece(model, n_vocab, false, buf.as_mut_ptr(), buf.len(), &mut len),
            EDGERUN_ERR_INVALID_ARGUMENT
        );

        // A session outlives the model handle.
        let mut params = edgerun_session_params_default();
        params.n_ctx = 128;
        params.n_threads = 1;
        let mut session = std::ptr::null_mut();
        assert_eq!(
            edgerun_session_new(model, &params, &mut session),
            EDGERUN_OK
        );
        edgerun_model_free(model);

        // Generate greedily, stopping from the callback after 5 tokens.
        let mut gp = edgerun_generate_params_default();
        gp.max_tokens = 20;
        gp.sampling.temperature = 0.0;
        let mut c = Collect {
            tokens: Vec::new(),
            text: String::new(),
            stop_after: 5,
        };
        let mut result = std::mem::zeroed::<edgerun_generate_result>();
        assert_eq!(
            edgerun_generate(
                session,
                tokens.as_ptr(),
                n,
                &gp,
                Some(collect),
                (&mut c as *mut Collect).cast(),
                &mut result
            ),
            EDGERUN_OK
        );
        assert_eq!(
            result.stop_reason,
            edgerun_stop_reason::EDGERUN_STOP_STOPPED
        );
        assert_eq!((result.n_tokens, result.pending_token), (5, want[4]));
        assert_eq!(c.tokens, want[..5]);
        assert_eq!(edgerun_session_n_past(session) as usize, n + 4);

        // Step by hand: the pending token gives the logits of the next reference token.
        assert_eq!(edgerun_step(session, result.pending_token), EDGERUN_OK);
        let (mut logits, mut n_logits) = (std::ptr::null(), 0usize);
        assert_eq!(
            edgerun_logits(session, &mut logits, &mut n_logits),
            EDGERUN_OK
        );
        let logits = std::slice::from_raw_parts(logits, n_logits);
        assert_eq!(edge_engine::sampling::argmax(logits), want[5]);

        // Errors leave the session usable: an out-of-vocabulary token, a prompt too long.
        assert_eq!(edgerun_step(session, n_vocab), EDGERUN_ERR_INVALID_ARGUMENT);
        let long = vec![1u32; 200];
        assert_eq!(
            edgerun_prefill(session, long.as_ptr(), long.len()),
            EDGERUN_ERR_CONTEXT_FULL
        );
        assert!(last_error().contains("context"), "{}", last_error());
        let mut bad = gp;
        bad.sampling.top_p = 0.0;
        assert_eq!(
            edgerun_generate(
                session,
                tokens.as_ptr(),
                n,
                &bad,
                None,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            EDGERUN_ERR_INVALID_ARGUMENT
        );

        // Reset and generate the whole reference continuation, without a callback.
        assert_eq!(edgerun_session_reset(session), EDGERUN_OK);
        gp.max_tokens = want.len() as u32;
        assert_eq!(
            edgerun_generate(
                session,
                tokens.as_ptr(),
                n,
                &gp,
                None,
                std::ptr::null_mut(),
                &mut result
            ),
            EDGERUN_OK
        );
        assert_eq!(result.n_tokens as usize, want.len());
        edgerun_session_free(session);
    }
}
