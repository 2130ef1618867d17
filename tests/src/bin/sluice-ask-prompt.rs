//! `sluice-ask-prompt SOCKET`: the terminal approval backend on its own,
//! for the end-to-end test that drives it through a real pty (tmux):
//! listens on the unix socket `SOCKET` (the gateway's `--approval-socket`)
//! and prompts each question on this process's terminal (stdin / stdout),
//! exactly as `sluice run --ask` does on its controlling terminal
//! (`sluice_approval::backend::terminal::serve`).

use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use sluice_approval::backend::terminal::{Mode, Served, serve};

fn main() -> Result<()> {
    let socket = std::env::args_os()
        .nth(1)
        .context("usage: sluice-ask-prompt SOCKET")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::UnixListener::bind(&socket)
            .with_context(|| format!("listening on {}", socket.to_string_lossy()))?;
        println!("sluice-ask-prompt: waiting for questions");
        let mode = Mode::Prompt(
            tokio::io::BufReader::new(tokio::io::stdin()),
            tokio::io::stdout(),
        );
        serve(listener, mode, Arc::new(Mutex::new(Served::default()))).await;
        Ok(())
    })
}
