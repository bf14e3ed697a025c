//! `edge-run`: run a GGUF language model on this machine.
//!
//! `edge-run MODEL.gguf -p PROMPT` generates text (streamed to stdout; logs go to stderr);
//! `edge-run tokenize`, `edge-run inspect` work on any GGUF; `edge-run plan` prints the memory a
//! session would hold (without allocating it) and `edge-run bench` measures prompt processing and
//! generation speed; `edge-run embed` prints sentence embeddings from an encoder (BERT) model; `edge-run perplexity`
//! scores a model on a text as llama.cpp's llama-perplexity does.
//! Every error is one line on stderr and a non-zero exit status (2 for a bad command line, 3
//! for a model file that changed while in use, 130 after Ctrl-C, 1 for anything else).
//!
//! This crate is a client of the engine's library API, like the C API: it parses the command
//! line (`args`), installs the logger and the Ctrl-C handler (`signals`), and turns the
//! engine's typed errors into the one-line hints users see, naming flags (`errors`).

mod args;
mod bench;
mod chat;
mod constrain;
mod embed;
mod errors;
mod generate;
mod inspect;
mod output;
mod perplexity;
mod plan;
mod prompt_cache;
mod serve;
mod session;
mod signals;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};
use errors::clap_error_line;

fn install_panic_hook() {
    // A panic is a bug; still, report it as one line rather than a multi-line trace.
    std::panic::set_hook(Box::new(|info| {
        let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = info.payload().downcast_ref::<String>() {
            s.clone()
        } else {
            "panic".to_string()
        };
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "error: internal error{at}: {}: this is a bug in edge-run, please report it",
            msg.replace('\n', " ")
        );
    }));
}

fn main() -> ExitCode {
    install_panic_hook();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", clap_error_line(&e));
            return ExitCode::from(errors::EXIT_USAGE);
        }
    };
    let level = match cli.generate.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_timestamp(None)
        .init();
    let result = std::panic::catch_unwind(move || match cli.command {
        Some(Command::Tokenize(a)) => inspect::tokenize(a).map(|()| 0),
        Some(Command::Inspect(a)) => inspect::inspect(a).map(|()| 0),
        Some(Command::Plan(a)) => plan::plan(a).map(|()| 0),
        Some(Command::Bench(a)) => bench::bench(a).map(|()| 0),
        Some(Command::Embed(a)) => embed::embed(a).map(|()| 0),
        Some(Command::Chat(a)) => chat::chat(a),
        Some(Command::Serve(a)) => serve::serve(a),
        Some(Command::Perplexity(a)) => perplexity::perplexity(a),
        None => generate::generate(cli.generate),
    });
    match result {
        Ok(Ok(code)) => ExitCode::from(code),
        Ok(Err(e)) => {
            eprintln!("error: {}", e.msg.replace('\n', " "));
            ExitCode::from(e.code)
        }
        // the panic hook has printed the line
        Err(_) => ExitCode::from(101),
    }
}
