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

/// What a re-entering callback saw: the status of each call it made on its own session.
struct Reenter {
    session: *mut edgerun_session,
    statuses: Vec<edgerun_status>,
    messages: Vec<String>,
    n_past_inside: u32,
}

unsafe extern "C" fn reenter(
    user: *mut c_void,
    _token: u32,
    _text: *const c_char,
    _len: usize,
) -> bool {
    // SAFETY: `user` is the `Reenter` passed to edgerun_generate below, alive and not aliased
    // during the call; its session is the one generating (the point of the test).
    let r = unsafe { &mut *user.cast::<Reenter>() };
    unsafe {
        r.statuses.push(edgerun_session_reset(r.session));
        r.messages.push(last_error());
        r.statuses.push(edgerun_step(r.session, 1));
        r.statuses.push(edgerun_generate(
            r.session,
            [1u32].as_ptr(),
            1,
            std::ptr::null(),
            None,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ));
        edgerun_session_free(r.session);
        r.messages.push(last_error());
        r.n_past_inside = edgerun_session_n_past(r.session);
    }
    false
}

/// The C API enforces what the CLI does: a context above the trained one is refused, and a
/// callback that calls back into its own session (reset, step, generate, free) gets an error
/// for each call, leaving the session as it was (before: `n_past` silently wrong). A file
/// whose hyper-parameters cannot be backed is a model error, not an abort.
#[test]
fn the_c_api_refuses_what_the_cli_refuses_and_detects_reentry() {
    use edgerun_status::*;
    let path = c_path(&smollm2_path());
    // SAFETY (all calls below): every pointer is NULL, a live local, or a live handle; the
    // re-entrant calls are made on a live session from the callback, which is what is tested.
    unsafe {
        let mut model = std::ptr::null_mut();
        assert_eq!(edgerun_model_load(path.as_ptr(), &mut model), EDGERUN_OK);
        let trained = edgerun_model_n_ctx_train(model);
        let mut params = edgerun_session_params_default();
        params.n_ctx = trained + 1;
        params.n_threads = 1;
        let mut session = std::ptr::null_mut();
        assert_eq!(
            edgerun_session_new(model, &params, &mut session),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        let e = last_error();
        assert!(
            e.contains(&format!("n_ctx {}", trained + 1))
                && e.contains(&format!("n_ctx {trained} or less")),
            "{e}"
        );
        assert!(session.is_null());

        params.n_ctx = 64;
        assert_eq!(
            edgerun_session_new(model, &params, &mut session),
            EDGERUN_OK
        );
        let prompt = [504u32, 3575, 282, 4649, 314];
        let mut gp = edgerun_generate_params_default();
        gp.sampling.temperature = 0.0;
        gp.max_tokens = 4;
        let mut r = Reenter {
            session,
            statuses: Vec::new(),
            messages: Vec::new(),
            n_past_inside: 99,
        };
        let mut result = std::mem::zeroed::<edgerun_generate_result>();
        assert_eq!(
            edgerun_generate(
                session,
                prompt.as_ptr(),
                prompt.len(),
                &gp,
                Some(reenter),
                (&mut r as *mut Reenter).cast(),
                &mut result
            ),
            EDGERUN_OK
        );
        assert_eq!(r.statuses, [EDGERUN_ERR_INVALID_ARGUMENT; 3]);
        for m in &r.messages {
            assert!(m.contains("in use by another call"), "{m}");
        }
        assert_eq!(
            r.n_past_inside, 0,
            "n_past fails (0) while the session is busy"
        );
        // The session is intact: the prompt and the one generated token were processed
        // (llama.cpp's first greedy token, " Paris"), and it goes on normally.
        assert_eq!(result.n_tokens, 1);
        assert_eq!(edgerun_session_n_past(session), prompt.len() as u32);
        let mut logits = std::ptr::null();
        let mut n = 0usize;
        assert_eq!(edgerun_logits(session, &mut logits, &mut n), EDGERUN_OK);
        assert_eq!(n, 49152);
        assert_eq!(edgerun_session_reset(session), EDGERUN_OK);
        assert_eq!(edgerun_session_n_past(session), 0);
        edgerun_session_free(session);
        edgerun_model_free(model);

        // A layer count the file cannot back: a model error naming the key.
        let dir = edge_tests::tiny::TempDir::new("capi-hostile");
        let mut parts = edge_tests::tiny::Parts::llama(edge_tests::tiny::DIMS);
        parts.set(
            "llama.block_count",
            edge_engine::gguf::MetaValue::U64(1 << 31),
        );
        let bad = c_path(&dir.write("layers.gguf", &parts.bytes()));
        let mut model = std::ptr::null_mut();
        assert_eq!(
            edgerun_model_load(bad.as_ptr(), &mut model),
            EDGERUN_ERR_MODEL
        );
        assert!(
            last_error().contains("llama.block_count"),
            "{}",
            last_error()
        );
        assert!(model.is_null());
    }
}

/// Through the C API too: logits that are not finite are `EDGERUN_ERR_MODEL` (not an end of
/// generation), and a model file truncated under a session is `EDGERUN_ERR_IO` naming the file
/// and the fix, before the run that would fault.
#[test]
fn the_c_api_reports_broken_weights_and_changed_files() {
    use edge_tests::tiny::{Parts, TempDir, DIMS};
    use edgerun_status::*;
    let dir = TempDir::new("capi-faults");
    let mut nan = Parts::llama(DIMS);
    nan.tensor("output_norm.weight").data[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    let nan = c_path(&dir.write("nan.gguf", &nan.bytes()));
    let good_path = dir.write("good.gguf", &Parts::llama(DIMS).bytes());
    let good = c_path(&good_path);
    // SAFETY (all calls below): every pointer is NULL, a live local, or a live handle; handles
    // are freed once.
    unsafe {
        let mut params = edgerun_session_params_default();
        params.n_ctx = 32;
        params.n_threads = 1;
        let mut gp = edgerun_generate_params_default();
        gp.max_tokens = 4;

        let (mut model, mut session) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(edgerun_model_load(nan.as_ptr(), &mut model), EDGERUN_OK);
        assert_eq!(
            edgerun_session_new(model, &params, &mut session),
            EDGERUN_OK
        );
        let status = edgerun_generate(
            session,
            [1u32, 2].as_ptr(),
            2,
            &gp,
            None,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        assert_eq!(status, EDGERUN_ERR_MODEL, "{}", last_error());
        assert!(last_error().contains("not finite"), "{}", last_error());
        edgerun_session_free(session);
        edgerun_model_free(model);

        assert_eq!(edgerun_model_load(good.as_ptr(), &mut model), EDGERUN_OK);
        assert_eq!(
            edgerun_session_new(model, &params, &mut session),
            EDGERUN_OK
        );
        assert_eq!(edgerun_prefill(session, [1u32, 2].as_ptr(), 2), EDGERUN_OK);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&good_path)
            .unwrap()
            .set_len(100)
            .unwrap();
        assert_eq!(edgerun_step(session, 3), EDGERUN_ERR_IO);
        let e = last_error();
        assert!(
            e.contains("good.gguf was truncated or rewritten while in use")
                && e.contains("renaming it over the old one"),
            "{e}"
        );
        assert_eq!(edgerun_session_n_past(session), 2, "nothing ran");
        edgerun_session_free(session);
        edgerun_model_free(model);
    }
}

#[test]
fn a_session_constraint_shapes_every_generation_and_bad_ones_are_refused() {
    use edgerun_status::*;
    let path = c_path(&smollm2_path());
    let schema = std::ffi::CString::new(
        r#"{"type": "object", "properties": {"action": {"enum": ["move", "stop"]}, "speed": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["action", "speed"], "additionalProperties": false}"#,
    )
    .unwrap();
    let bad_schema = std::ffi::CString::new(r#"{"not": {"type": "string"}}"#).unwrap();
    let bad_grammar = std::ffi::CString::new("root ::= undefined-rule").unwrap();
    let prompt =
        std::ffi::CString::new("<|im_start|>user\nMove slowly.<|im_end|>\n<|im_start|>assistant\n")
            .unwrap();
    // SAFETY (all calls below): every pointer is NULL, a live local or buffer of the size
    // passed, or a live handle; handles are freed once, at the end.
    unsafe {
        let mut model = std::ptr::null_mut();
        assert_eq!(edgerun_model_load(path.as_ptr(), &mut model), EDGERUN_OK);
        let mut params = edgerun_session_params_default();
        params.n_ctx = 256;
        params.n_threads = 1;
        let mut session = std::ptr::null_mut();
        assert_eq!(
            edgerun_session_new(model, &params, &mut session),
            EDGERUN_OK
        );
        let mut tokens = [0u32; 64];
        let mut n = 0usize;
        assert_eq!(
            edgerun_tokenize(
                model,
                prompt.as_ptr(),
                true,
                true,
                tokens.as_mut_ptr(),
                64,
                &mut n
            ),
            EDGERUN_OK
        );
        // Refused, with the problem named; the session keeps no constraint.
        assert_eq!(
            edgerun_session_set_constraint(
                session,
                EDGERUN_CONSTRAINT_JSON_SCHEMA,
                bad_schema.as_ptr()
            ),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("not"), "{}", last_error());
        assert_eq!(
            edgerun_session_set_constraint(session, EDGERUN_CONSTRAINT_GBNF, bad_grammar.as_ptr()),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("undefined-rule"), "{}", last_error());
        assert_eq!(
            edgerun_session_set_constraint(session, 9, schema.as_ptr()),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            edgerun_session_set_constraint(
                session,
                EDGERUN_CONSTRAINT_JSON_SCHEMA,
                schema.as_ptr()
            ),
            EDGERUN_OK
        );
        let mut gp = edgerun_generate_params_default();
        gp.max_tokens = 64;
        for (temperature, seed) in [(0.0, 42), (0.8, 1), (1.5, 2)] {
            gp.sampling.temperature = temperature;
            gp.sampling.seed = seed;
            let mut c = Collect {
                tokens: Vec::new(),
                text: String::new(),
                stop_after: usize::MAX,
            };
            let mut result = std::mem::zeroed::<edgerun_generate_result>();
            assert_eq!(edgerun_session_reset(session), EDGERUN_OK);
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
                edgerun_stop_reason::EDGERUN_STOP_END_OF_GENERATION,
                "{:?}",
                c.text
            );
            // Checked by hand against the schema, not by the library that made it.
            let v: serde_json::Value = serde_json::from_str(&c.text).expect(&c.text);
            let obj = v.as_object().expect("an object");
            assert_eq!(obj.len(), 2, "{v}");
            assert!(
                ["move", "stop"].contains(&obj["action"].as_str().unwrap()),
                "{v}"
            );
            assert!((1..=9).contains(&obj["speed"].as_i64().unwrap()), "{v}");
        }
        // Cleared.
        assert_eq!(
            edgerun_session_set_constraint(session, EDGERUN_CONSTRAINT_NONE, std::ptr::null()),
            EDGERUN_OK
        );
        edgerun_session_free(session);
        edgerun_model_free(model);
    }
}
