//! llama.cpp's base-logits file (`llama-perplexity --kl-divergence-base`), byte for byte:
//!
//! | bytes | what |
//! | --- | --- |
//! | 8 | the magic `_logits_` |
//! | 4 | `u32` n_ctx, the chunk length |
//! | 4 | `i32` n_vocab |
//! | 4 | `i32` n_chunks |
//! | 4 · n_ctx · n_chunks | the tokens evaluated, `i32` (the text's, no BOS substituted) |
//! | per chunk, n_ctx - 1 - n_ctx/2 rows | a row of [`row_len`] `u16`: `f32` scale, `f32` smallest log-probability, the vocabulary's quantized log-probabilities (see [`super::numerics::quantize_row`]) |
//!
//! All little-endian, as llama.cpp writes them on the machines it runs on. The rows are those
//! of the scored positions: from n_ctx/2 to n_ctx - 2 of each chunk.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::numerics::row_len;
use crate::error::{EngineError, Result};

/// The first eight bytes of a base-logits file.
pub const MAGIC: &[u8; 8] = b"_logits_";

/// Bytes before the tokens.
const HEADER_BYTES: u64 = 20;

/// What a base-logits file describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseHeader {
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// The base model's vocabulary size (the width of each row).
    pub n_vocab: usize,
    /// Chunks.
    pub n_chunks: usize,
}

impl BaseHeader {
    /// Scored positions (rows) per chunk.
    pub fn rows_per_chunk(&self) -> usize {
        self.n_ctx - 1 - self.n_ctx / 2
    }

    /// `u16` values per row.
    pub fn row_len(&self) -> usize {
        row_len(self.n_vocab)
    }

    /// The size a file with this header has, in bytes (`None` if it overflows).
    pub fn file_size(&self) -> Option<u64> {
        let tokens = (self.n_ctx as u64)
            .checked_mul(self.n_chunks as u64)?
            .checked_mul(4)?;
        let rows = (self.rows_per_chunk() as u64)
            .checked_mul(self.n_chunks as u64)?
            .checked_mul(self.row_len() as u64)?
            .checked_mul(2)?;
        HEADER_BYTES.checked_add(tokens)?.checked_add(rows)
    }
}

fn io_error(path: &Path, source: std::io::Error) -> EngineError {
    EngineError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn bad_file(path: &Path, problem: String) -> EngineError {
    EngineError::InvalidArgument(format!(
        "{}: {problem}; write a base file with `--kl-divergence-base FILE` (without --kl-divergence) from the base model, or llama.cpp's llama-perplexity",
        path.display()
    ))
}

/// Writes a base-logits file: the header and tokens at [`BaseWriter::create`], then the rows
/// in order.
#[derive(Debug)]
pub struct BaseWriter {
    path: PathBuf,
    out: BufWriter<File>,
    row_bytes: Vec<u8>,
}

impl BaseWriter {
    /// Creates (or truncates) `path` and writes the header and the `n_chunks · n_ctx` tokens.
    pub fn create(path: &Path, header: &BaseHeader, tokens: &[u32]) -> Result<BaseWriter> {
        let file = File::create(path).map_err(|e| io_error(path, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let mut head = Vec::with_capacity(HEADER_BYTES as usize + 4 * tokens.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&(header.n_ctx as u32).to_le_bytes());
        head.extend_from_slice(&(header.n_vocab as i32).to_le_bytes());
        head.extend_from_slice(&(header.n_chunks as i32).to_le_bytes());
        for &t in &tokens[..header.n_ctx * header.n_chunks] {
            head.extend_from_slice(&(t as i32).to_le_bytes());
        }
        out.write_all(&head).map_err(|e| io_error(path, e))?;
        Ok(BaseWriter {
            path: path.to_path_buf(),
            out,
            row_bytes: Vec::with_capacity(2 * row_len(header.n_vocab)),
        })
    }

    /// Appends one row.
    pub fn write_row(&mut self, row: &[u16]) -> Result<()> {
        self.row_bytes.clear();
        for &v in row {
            self.row_bytes.extend_from_slice(&v.to_le_bytes());
        }
        self.out
            .write_all(&self.row_bytes)
            .map_err(|e| io_error(&self.path, e))
    }

    /// Flushes the file; the error of a full disk shows here.
    pub fn finish(mut self) -> Result<()> {
        self.out.flush().map_err(|e| io_error(&self.path, e))?;
        self.out
            .get_ref()
            .sync_all()
            .map_err(|e| io_error(&self.path, e))
    }
}

/// Reads a base-logits file: the header and tokens at [`BaseReader::open`] (validated against
/// the file's size and the model's vocabulary), then the rows chunk by chunk.
#[derive(Debug)]
pub struct BaseReader {
    path: PathBuf,
    input: BufReader<File>,
    /// What the file describes.
    pub header: BaseHeader,
    /// The tokens of all chunks.
    pub tokens: Vec<u32>,
    row_bytes: Vec<u8>,
}

impl BaseReader {
    /// Opens `path`, checks that it is a base-logits file whose size matches its header and
    /// whose vocabulary is `n_vocab` tokens, and reads its tokens.
    pub fn open(path: &Path, n_vocab: usize) -> Result<BaseReader> {
        let file = File::open(path).map_err(|e| io_error(path, e))?;
        let size = file.metadata().map_err(|e| io_error(path, e))?.len();
        let mut input = BufReader::with_capacity(1 << 20, file);
        let mut head = [0u8; HEADER_BYTES as usize];
        if size < HEADER_BYTES || input.read_exact(&mut head).is_err() {
            return Err(bad_file(
                path,
                format!("{size} bytes is too short for a base-logits file (its header alone is {HEADER_BYTES})"),
            ));
        }
        if &head[..8] != MAGIC {
            return Err(bad_file(
                path,
                "this is not a base-logits file (it does not start with `_logits_`)".into(),
            ));
        }
        let word = |i: usize| [head[i], head[i + 1], head[i + 2], head[i + 3]];
        let n_ctx = u32::from_le_bytes(word(8));
        let file_vocab = i32::from_le_bytes(word(12));
        let n_chunks = i32::from_le_bytes(word(16));
        if n_ctx < 4 || file_vocab < 1 || n_chunks < 1 {
            return Err(bad_file(
                path,
                format!("its header is invalid (n_ctx {n_ctx}, n_vocab {file_vocab}, {n_chunks} chunks; need n_ctx >= 4 and at least one token and chunk)"),
            ));
        }
        let header = BaseHeader {
            n_ctx: n_ctx as usize,
            n_vocab: file_vocab as usize,
            n_chunks: n_chunks as usize,
        };
        match header.file_size() {
            Some(want) if want == size => {}
            want => {
                return Err(bad_file(
                    path,
                    format!(
                        "the file has {size} bytes but its header (n_ctx {n_ctx}, n_vocab {file_vocab}, {n_chunks} chunks) implies {}: it is truncated or not a base-logits file",
                        want.map_or("more than 2^64".to_string(), |w| w.to_string())
                    ),
                ))
            }
        }
        if header.n_vocab != n_vocab {
            return Err(EngineError::InvalidArgument(format!(
                "{}: the base model has a vocabulary of {} tokens but this model has {n_vocab}: KL divergence compares two models with the same vocabulary (quantizations of one model)",
                path.display(),
                header.n_vocab
            )));
        }
        let mut raw = vec![0u8; 4 * header.n_ctx * header.n_chunks];
        input.read_exact(&mut raw).map_err(|e| io_error(path, e))?;
        let mut tokens = Vec::with_capacity(raw.len() / 4);
        for (i, b) in raw.chunks_exact(4).enumerate() {
            let t = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if t < 0 || t as usize >= n_vocab {
                return Err(bad_file(
                    path,
                    format!(
                        "token {i} of the file is {t}, outside the vocabulary of {n_vocab} tokens"
                    ),
                ));
            }
            tokens.push(t as u32);
        }
        Ok(BaseReader {
            path: path.to_path_buf(),
            input,
            row_bytes: vec![0; 2 * header.row_len()],
            header,
            tokens,
        })
    }

    /// Reads the next row into `row` (of [`BaseHeader::row_len`] values).
    pub fn read_row(&mut self, row: &mut [u16]) -> Result<()> {
        self.input
            .read_exact(&mut self.row_bytes)
            .map_err(|e| io_error(&self.path, e))?;
        for (v, b) in row.iter_mut().zip(self.row_bytes.chunks_exact(2)) {
            *v = u16::from_le_bytes([b[0], b[1]]);
        }
        Ok(())
    }
}
