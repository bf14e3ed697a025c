//! The prompt cache and saved state through the C functions, on the real model: a cached
//! generation continues llama.cpp's greedy reference, the held tokens and truncation are what
//! the KV cache holds, and a saved state loads into a session of the same shape (continuing
//! exactly as the uninterrupted run) and is refused with `EDGERUN_ERR_STATE` by another.

use std::ffi::{c_char, c_void, CStr, CString};

use edge_tests::{ids, read_jsonl, shared_dir, smollm2_path};
use edgerun::edgerun_status::*;
use edgerun::*;

/// Appends each generated token to the `Vec<u32>` behind `user_data`.
unsafe extern "C" fn collect(
    user_data: *mut c_void,
    token: u32,
    _: *const c_char,
    _: usize,
) -> bool {
    if token != EDGERUN_TOKEN_NONE {
        // SAFETY: `user_data` is the `&mut Vec<u32>` each call below passes.
        unsafe { (*user_data.cast::<Vec<u32>>()).push(token) };
    }
    true
}

fn last_error() -> String {
    // SAFETY: the API returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(edgerun_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// Greedy tokens of `prompt` (cached or appended), the end-of-generation token included.
///
/// # Safety
/// `session` is a live session handle.
unsafe fn greedy(session: *mut edgerun_session, prompt: &[u32], n: u32, cached: bool) -> Vec<u32> {
    let mut gp = edgerun_generate_params_default();
    gp.max_tokens = n;
    gp.sampling.temperature = 0.0;
    let mut out: Vec<u32> = Vec::new();
    let mut result = edgerun_generate_result {
        stop_reason: edgerun_stop_reason::EDGERUN_STOP_MAX_TOKENS,
        n_tokens: 0,
        pending_token: EDGERUN_TOKEN_NONE,
    };
    let f = if cached {
        edgerun_generate_cached
    } else {
        edgerun_generate
    };
    // SAFETY: live handle, prompt slice, params and result locals; `collect` gets `out`.
    let status = unsafe {
        f(
            session,
            prompt.as_ptr(),
            prompt.len(),
            &gp,
            Some(collect),
            (&mut out as *mut Vec<u32>).cast(),
            &mut result,
        )
    };
    assert_eq!(status, EDGERUN_OK, "{}", last_error());
    if result.stop_reason == edgerun_stop_reason::EDGERUN_STOP_END_OF_GENERATION {
        out.push(result.pending_token);
    }
    out
}

/// The tokens the session holds, through `edgerun_session_tokens`.
///
/// # Safety
/// `session` is a live session handle.
unsafe fn held(session: *mut edgerun_session) -> Vec<u32> {
    let mut n = 0usize;
    // SAFETY: a NULL buffer of capacity 0 asks for the count.
    let status = unsafe { edgerun_session_tokens(session, std::ptr::null_mut(), 0, &mut n) };
    assert!(status == EDGERUN_OK || status == EDGERUN_ERR_BUFFER_TOO_SMALL);
    let mut out = vec![0u32; n];
    // SAFETY: `out` has room for `n` ids.
    let status = unsafe { edgerun_session_tokens(session, out.as_mut_ptr(), n, &mut n) };
    assert_eq!(status, EDGERUN_OK, "{}", last_error());
    out
}

#[test]
fn cached_generation_and_saved_state_through_the_c_functions() {
    let cases = read_jsonl(&shared_dir().join("reference/smollm2/greedy.jsonl"));
    let (prompt, want) = (ids(&cases[0]["prompt_ids"]), ids(&cases[0]["ids"]));
    let path = CString::new(smollm2_path().to_str().unwrap()).unwrap();
    let dir = std::env::temp_dir().join(format!("edgerun-c-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = CString::new(dir.join("s.state").to_str().unwrap()).unwrap();
    // SAFETY (all calls below): every pointer is NULL, a live local or buffer of the size
    // passed, or a live handle; handles are freed once, at the end.
    unsafe {
        let mut model = std::ptr::null_mut();
        assert_eq!(edgerun_model_load(path.as_ptr(), &mut model), EDGERUN_OK);
        let mut params = edgerun_session_params_default();
        params.n_ctx = 128;
        params.n_ubatch = 16;
        params.n_threads = 1;
        let mut s = std::ptr::null_mut();
        assert_eq!(edgerun_session_new(model, &params, &mut s), EDGERUN_OK);

        // A cached generation, then the prompt extended by half the reference.
        assert_eq!(greedy(s, &prompt, 16, true), want[..16]);
        assert_eq!(held(s), [&prompt[..], &want[..15]].concat());
        let mut longer = prompt.clone();
        longer.extend(&want[..8]);
        assert_eq!(greedy(s, &longer, 8, true), want[8..16]);
        assert_eq!(
            edgerun_generate_cached(
                s,
                longer.as_ptr(),
                0,
                std::ptr::null(),
                None,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            EDGERUN_ERR_INVALID_ARGUMENT
        );

        // Truncation.
        let n_past = edgerun_session_n_past(s);
        assert_eq!(
            edgerun_session_truncate(s, n_past + 1),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        assert_eq!(edgerun_session_truncate(s, prompt.len() as u32), EDGERUN_OK);
        assert_eq!(held(s), prompt);
        let mut small = [0u32; 1];
        let mut n = 0usize;
        assert_eq!(
            edgerun_session_tokens(s, small.as_mut_ptr(), 1, &mut n),
            EDGERUN_ERR_BUFFER_TOO_SMALL
        );
        assert_eq!(n, prompt.len());

        // Saved state: the uninterrupted run against save, load into another session, go on.
        edgerun_session_reset(s);
        let first = greedy(s, &prompt, 10, false);
        assert_eq!(
            edgerun_session_save_state(s, state.as_ptr()),
            EDGERUN_OK,
            "{}",
            last_error()
        );
        let mut s2 = std::ptr::null_mut();
        assert_eq!(edgerun_session_new(model, &params, &mut s2), EDGERUN_OK);
        assert_eq!(
            edgerun_session_load_state(s2, state.as_ptr()),
            EDGERUN_OK,
            "{}",
            last_error()
        );
        assert_eq!(held(s2), held(s));
        let mut go_on = prompt.clone();
        go_on.extend(&first);
        assert_eq!(greedy(s2, &go_on, 16, true), want[10..26]);

        // Another context: refused, naming it; the session keeps what it held.
        let mut other = params;
        other.n_ctx = 64;
        let mut s3 = std::ptr::null_mut();
        assert_eq!(edgerun_session_new(model, &other, &mut s3), EDGERUN_OK);
        let before = held(s3);
        assert_eq!(
            edgerun_session_load_state(s3, state.as_ptr()),
            EDGERUN_ERR_STATE
        );
        assert!(last_error().contains("context 128"), "{}", last_error());
        assert_eq!(held(s3), before);
        // A damaged file.
        let mut bytes = std::fs::read(dir.join("s.state")).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        std::fs::write(dir.join("bad.state"), &bytes).unwrap();
        let bad = CString::new(dir.join("bad.state").to_str().unwrap()).unwrap();
        assert_eq!(
            edgerun_session_load_state(s2, bad.as_ptr()),
            EDGERUN_ERR_STATE
        );
        assert!(last_error().contains("damaged"), "{}", last_error());
        assert_eq!(
            edgerun_session_load_state(s2, std::ptr::null()),
            EDGERUN_ERR_INVALID_ARGUMENT
        );
        let missing = CString::new(dir.join("none.state").to_str().unwrap()).unwrap();
        assert_eq!(
            edgerun_session_load_state(s2, missing.as_ptr()),
            EDGERUN_ERR_IO
        );

        edgerun_session_free(s3);
        edgerun_session_free(s2);
        edgerun_session_free(s);
        edgerun_model_free(model);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
