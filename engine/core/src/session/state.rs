//! Saved session state: the tokens a session holds and their KV cache rows in one file, so that
//! a process can stop and a later one continue the conversation without processing it again.
//!
//! The file (little-endian): [`STATE_MAGIC`], the format version, the model file's identity
//! (its size and a 64-bit FNV-1a hash of its header: metadata and tensor table), the session's
//! shape (context, KV type, layers, KV heads, head size, rows of each layer), the tokens, the
//! caller's data (e.g. a chat's messages; at most [`MAX_STATE_DATA`] bytes), the raw KV rows in
//! use of every layer (keys, then values), and a FNV-1a hash of everything before it. A file from another model, another session shape, a truncated or damaged file is
//! refused with a [`StateError`] before the session changes.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use super::Session;
use crate::error::{EngineError, Result, StateError};
use crate::kv::KvType;

/// The first 8 bytes of a state file.
pub const STATE_MAGIC: [u8; 8] = *b"EDGERUNS";

/// The format version this build writes and reads.
pub const STATE_FORMAT_VERSION: u32 = 1;

/// The most bytes of caller data a state file holds ([`Session::save_state_with_data`]).
pub const MAX_STATE_DATA: usize = 16 << 20;

/// FNV-1a, 64 bits: a checksum that catches flipped and shifted bytes, no cryptography.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    const START: Fnv = Fnv(0xcbf2_9ce4_8422_2325);

    fn update(mut self, bytes: &[u8]) -> Fnv {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self
    }
}

/// The session's shape as the file records it.
#[derive(Debug, PartialEq, Eq)]
struct Shape {
    ctx: u32,
    kv_type: u32,
    row_bytes: u32,
    n_layer: u32,
    n_head_kv: u32,
    head_dim: u32,
    layer_rows: Vec<u32>,
}

/// Bytes of the fixed header: magic, version, model size and hash, the shape's six numbers,
/// the token counts (n_tokens, n_exact, last_run) and the length of the caller's data.
const FIXED_HEADER: usize = 8 + 4 + 8 + 8 + 6 * 4 + 4 * 4;

fn kv_type_code(t: KvType) -> u32 {
    match t {
        KvType::F16 => 0,
        KvType::Q8_0 => 1,
    }
}

fn kv_type_name(code: u32) -> String {
    match code {
        0 => "f16".into(),
        1 => "q8_0".into(),
        n => format!("#{n}"),
    }
}

/// A cursor over the file's bytes; reading past the end is `None`.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    }
}

impl Session {
    /// The model file's identity as a state file records it: its size and the hash of its
    /// header (metadata and tensor table, not the weights).
    fn model_identity(&self) -> (u64, u64) {
        let g = self.model.gguf();
        (g.file_size(), Fnv::START.update(g.header_bytes()).0)
    }

    fn state_shape(&self) -> Shape {
        let p = &self.model.params;
        Shape {
            ctx: self.ctx as u32,
            kv_type: kv_type_code(self.kv_type),
            row_bytes: self.kv_row_bytes().unwrap_or(0) as u32,
            n_layer: p.n_layer as u32,
            n_head_kv: p.n_head_kv as u32,
            head_dim: p.head_dim as u32,
            layer_rows: p
                .kv_layer_rows(self.ctx, self.ubatch)
                .iter()
                .map(|&r| r as u32)
                .collect(),
        }
    }

    /// Bytes of one KV row (keys or values of one position of one layer).
    fn kv_row_bytes(&self) -> Result<usize> {
        self.kv_type
            .row_bytes(self.model.params.kv_dim())
            .ok_or_else(|| EngineError::Plan("KV row is not whole blocks".into()))
    }

    /// For each layer, with `n` positions in use: (byte offset of its key rows, of its value
    /// rows, bytes of its rows in use). Rows are the layer's ring slots, so a sliding-window
    /// layer that wrapped has all its rows in use.
    fn kv_spans(&self, rows: &[u32], n: usize) -> Result<Vec<(usize, usize, usize)>> {
        let rb = self.kv_row_bytes()?;
        let mut base = 0;
        Ok(rows
            .iter()
            .map(|&r| {
                let r = r as usize;
                let span = (base, base + r * rb, r.min(n) * rb);
                base += 2 * r * rb;
                span
            })
            .collect())
    }

    /// Saves the session's state to `path`: the tokens it holds and their KV rows, with the
    /// model's identity and the session's shape (see the module's documentation for the
    /// format). Written to a temporary file next to `path` and renamed over it, so that a crash
    /// leaves the old file or the new one, never half of one. The logits are not saved:
    /// [`Session::load_state`] recomputes them.
    pub fn save_state(&mut self, path: impl AsRef<Path>) -> Result<()> {
        self.save_state_with_data(path, &[])
    }

    /// [`Session::save_state`] with `data` of the caller's stored in the file too (at most
    /// [`MAX_STATE_DATA`] bytes, covered by its checksum), e.g. the messages of the chat the
    /// tokens render; [`Session::load_state_with_data`] returns it.
    pub fn save_state_with_data(&mut self, path: impl AsRef<Path>, data: &[u8]) -> Result<()> {
        let path = path.as_ref();
        if data.len() > MAX_STATE_DATA {
            return Err(EngineError::InvalidArgument(format!(
                "{} bytes of data do not fit in a state file (at most {MAX_STATE_DATA})",
                data.len()
            )));
        }
        let io = |source| EngineError::Io {
            path: path.display().to_string(),
            source,
        };
        let file_name = path.file_name().ok_or_else(|| {
            EngineError::InvalidArgument(format!("{}: not a file path", path.display()))
        })?;
        let mut tmp_name = file_name.to_os_string();
        tmp_name.push(format!(".tmp{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let result = self.write_state(&tmp, data).and_then(|()| {
            std::fs::rename(&tmp, path).map_err(|source| EngineError::Io {
                path: path.display().to_string(),
                source,
            })
        });
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map_err(|e| match e {
            EngineError::Io { source, .. } => io(source),
            e => e,
        })
    }

    fn write_state(&mut self, tmp: &Path, data: &[u8]) -> Result<()> {
        let io = |source| EngineError::Io {
            path: tmp.display().to_string(),
            source,
        };
        let (size, hash) = self.model_identity();
        let shape = self.state_shape();
        let n = self.tokens.len();
        let mut head =
            Vec::with_capacity(FIXED_HEADER + 4 * (shape.layer_rows.len() + n) + data.len());
        head.extend_from_slice(&STATE_MAGIC);
        head.extend_from_slice(&STATE_FORMAT_VERSION.to_le_bytes());
        head.extend_from_slice(&size.to_le_bytes());
        head.extend_from_slice(&hash.to_le_bytes());
        let last_run = if self.has_logits { self.last_run } else { 0 };
        for v in [
            shape.ctx,
            shape.kv_type,
            shape.row_bytes,
            shape.n_layer,
            shape.n_head_kv,
            shape.head_dim,
            n as u32,
            self.n_reusable() as u32,
            last_run.min(n) as u32,
            data.len() as u32,
        ] {
            head.extend_from_slice(&v.to_le_bytes());
        }
        for r in &shape.layer_rows {
            head.extend_from_slice(&r.to_le_bytes());
        }
        for t in &self.tokens {
            head.extend_from_slice(&t.to_le_bytes());
        }
        head.extend_from_slice(data);
        let mut out = BufWriter::new(File::create(tmp).map_err(io)?);
        out.write_all(&head).map_err(io)?;
        let mut sum = Fnv::START.update(&head);
        let spans = self.kv_spans(&shape.layer_rows, n)?;
        let mut buf = vec![0u8; spans.iter().map(|s| s.2).max().unwrap_or(0)];
        for &(k, v, len) in &spans {
            for off in [k, v] {
                self.backend.read_kv(off, &mut buf[..len])?;
                out.write_all(&buf[..len]).map_err(io)?;
                sum = sum.update(&buf[..len]);
            }
        }
        out.write_all(&sum.0.to_le_bytes()).map_err(io)?;
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)
    }

    /// Loads a state saved by [`Session::save_state`]: afterwards the session holds the saved
    /// tokens, exactly as if it had processed them (its last token is run again for the
    /// logits), so generation continues as it would have. Everything is checked before the
    /// session changes: a file from another model, a session of another shape, or a truncated
    /// or damaged file is an [`EngineError::State`] naming the problem, and the session is as
    /// it was. An error while restoring (a device failure) leaves it reset.
    pub fn load_state(&mut self, path: impl AsRef<Path>) -> Result<()> {
        self.load_state_with_data(path).map(|_| ())
    }

    /// [`Session::load_state`], returning the data saved with [`Session::save_state_with_data`]
    /// (empty if none).
    pub fn load_state_with_data(&mut self, path: impl AsRef<Path>) -> Result<Vec<u8>> {
        let path = path.as_ref();
        let err = |error| EngineError::State {
            path: path.display().to_string(),
            error,
        };
        let io = |source| EngineError::Io {
            path: path.display().to_string(),
            source,
        };
        let shape = self.state_shape();
        let rb = self.kv_row_bytes()?;
        let kv_max: u64 = shape
            .layer_rows
            .iter()
            .map(|&r| 2 * u64::from(r) * rb as u64)
            .sum();
        // The largest file this session can have written: refuse anything longer unread.
        let max_len = (FIXED_HEADER + 4 * (shape.layer_rows.len() + self.ctx) + MAX_STATE_DATA + 8)
            as u64
            + kv_max;
        let mut file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut bytes = Vec::new();
        std::io::Read::by_ref(&mut file)
            .take(max_len.min(len) + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        let parsed = self.parse_state(&bytes, &shape).map_err(err)?;
        let data = bytes[parsed.data.clone()].to_vec();
        self.restore(&bytes, &parsed, &shape)?;
        Ok(data)
    }

    /// Checks a state file's bytes against this session; returns where the KV rows start, the
    /// token count and the exact prefix, and where the caller's data lies.
    fn parse_state(&self, bytes: &[u8], shape: &Shape) -> std::result::Result<Parsed, StateError> {
        let found = bytes.len() as u64;
        let mut r = Reader(bytes);
        if r.take(8) != Some(&STATE_MAGIC[..]) {
            return Err(StateError::NotAState);
        }
        let truncated = |expected: u64| StateError::Truncated { expected, found };
        let version = r.u32().ok_or(truncated(FIXED_HEADER as u64))?;
        if version != STATE_FORMAT_VERSION {
            return Err(StateError::Version {
                found: version,
                supported: STATE_FORMAT_VERSION,
            });
        }
        let mut head = || -> Option<_> {
            let (size, hash) = (r.u64()?, r.u64()?);
            let nums = [r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?];
            let counts = [r.u32()?, r.u32()?, r.u32()?, r.u32()?];
            Some((size, hash, nums, counts))
        };
        let (
            size,
            hash,
            [ctx, kv_type, row_bytes, n_layer, n_head_kv, head_dim],
            [n, n_exact, last_run, n_data],
        ) = head().ok_or(truncated(FIXED_HEADER as u64))?;
        // Bounds before sizes are computed from the fields: a damaged count must not overflow.
        if n_layer > 1 << 16
            || n > ctx
            || n_exact > n
            || last_run > n
            || n_data as usize > MAX_STATE_DATA
        {
            return check_sum(bytes).and(Err(StateError::Damaged(format!(
                "{n_layer} layers, {n} tokens of which {n_exact} exact in a context of {ctx}, {n_data} bytes of data"
            ))));
        }
        let rows_at = FIXED_HEADER;
        let tokens_at = rows_at + 4 * n_layer as usize;
        let Some(rows) = bytes.get(rows_at..tokens_at) else {
            return Err(truncated(tokens_at as u64 + 8));
        };
        let layer_rows: Vec<u32> = rows
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let data_at = tokens_at + 4 * n as usize;
        let kv_at = data_at + n_data as usize;
        let kv_len: u64 = layer_rows
            .iter()
            .map(|&rows| (2 * u64::from(rows.min(n))).saturating_mul(u64::from(row_bytes)))
            .fold(0u64, u64::saturating_add);
        let expected = (kv_at as u64).saturating_add(kv_len).saturating_add(8);
        if found < expected {
            return Err(truncated(expected));
        }
        if found > expected {
            return Err(StateError::Damaged(format!(
                "{} bytes after its end",
                found - expected
            )));
        }
        check_sum(bytes)?;
        let (model_size, model_hash) = self.model_identity();
        if (size, hash) != (model_size, model_hash) {
            return Err(StateError::OtherModel {
                saved_size: size,
                model_size,
                same_size: size == model_size,
            });
        }
        let saved = Shape {
            ctx,
            kv_type,
            row_bytes,
            n_layer,
            n_head_kv,
            head_dim,
            layer_rows,
        };
        shape_matches(&saved, shape)?;
        let n_vocab = self.model.params.n_vocab;
        let tokens = &bytes[tokens_at..data_at];
        if let Some(bad) = tokens
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .find(|&t| t as usize >= n_vocab)
        {
            return Err(StateError::Damaged(format!(
                "token id {bad} is outside the vocabulary of {n_vocab}"
            )));
        }
        Ok(Parsed {
            kv_at,
            n: n as usize,
            n_exact: n_exact as usize,
            last_run: last_run as usize,
            data: data_at..kv_at,
        })
    }

    /// Writes a checked state into the session.
    fn restore(&mut self, bytes: &[u8], parsed: &Parsed, shape: &Shape) -> Result<()> {
        let Parsed {
            kv_at,
            n,
            n_exact,
            last_run,
            ..
        } = *parsed;
        let tokens_at = FIXED_HEADER + 4 * shape.layer_rows.len();
        self.reset();
        let spans = self.kv_spans(&shape.layer_rows, n)?;
        let mut at = kv_at;
        for &(k, v, len) in &spans {
            for off in [k, v] {
                if let Err(e) = self.backend.write_kv(off, &bytes[at..at + len]) {
                    self.reset();
                    return Err(e);
                }
                at += len;
            }
        }
        self.tokens.extend(
            bytes[tokens_at..tokens_at + 4 * n]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
        self.n_exact = n_exact;
        if last_run > 0 {
            // The logits were not saved: the last run goes again, as one chunk of its size
            // (the rows before it are the saved ones), which gives its logits bit for bit.
            let again: Vec<u32> = bytes[tokens_at + 4 * (n - last_run)..tokens_at + 4 * n]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let result = self
                .truncate(n - last_run)
                .and_then(|()| self.advance_chunked(&again, "prompt", Some(last_run == 1)));
            match result {
                Ok(()) => self.n_exact = n_exact,
                Err(e) => {
                    self.reset();
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

/// Where a checked state file's parts are.
struct Parsed {
    /// Byte offset of the KV rows.
    kv_at: usize,
    /// Tokens.
    n: usize,
    /// Tokens whose rows are exact ([`Session::n_reusable`]).
    n_exact: usize,
    /// Tokens of the last run, to run again for the logits (0: none).
    last_run: usize,
    /// The caller's data.
    data: std::ops::Range<usize>,
}

/// Checks the trailing checksum of a state file's bytes.
fn check_sum(bytes: &[u8]) -> std::result::Result<(), StateError> {
    let Some(body_len) = bytes.len().checked_sub(8) else {
        return Err(StateError::Damaged("no checksum".into()));
    };
    let (body, tail) = bytes.split_at(body_len);
    let saved = u64::from_le_bytes(tail.try_into().unwrap_or_default());
    if Fnv::START.update(body).0 != saved {
        return Err(StateError::Damaged("its checksum does not match".into()));
    }
    Ok(())
}

/// The first difference between a file's session shape and this session's, as an error.
fn shape_matches(saved: &Shape, session: &Shape) -> std::result::Result<(), StateError> {
    let diff = |what, a: String, b: String| {
        if a == b {
            Ok(())
        } else {
            Err(StateError::Shape {
                what,
                saved: a,
                session: b,
            })
        }
    };
    diff(
        "layers",
        saved.n_layer.to_string(),
        session.n_layer.to_string(),
    )?;
    diff(
        "KV heads",
        saved.n_head_kv.to_string(),
        session.n_head_kv.to_string(),
    )?;
    diff(
        "head size",
        saved.head_dim.to_string(),
        session.head_dim.to_string(),
    )?;
    diff("context", saved.ctx.to_string(), session.ctx.to_string())?;
    diff(
        "KV type",
        kv_type_name(saved.kv_type),
        kv_type_name(session.kv_type),
    )?;
    diff(
        "KV row bytes",
        saved.row_bytes.to_string(),
        session.row_bytes.to_string(),
    )?;
    diff(
        "layer rows (ubatch)",
        format!("{:?}", saved.layer_rows),
        format!("{:?}", session.layer_rows),
    )
}
