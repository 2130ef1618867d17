//! Running a tool (`nft`, `ip`, `tc`) with a deadline: a hung one is
//! killed rather than waited for, so the floor's keeper never stops
//! checking and the gateway's end never waits forever on it.

use std::io::Write as _;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

/// How long a tool may run before it is killed: a run of `nft`, `ip` or
/// `tc` on one interface takes milliseconds; ten seconds is a hung one.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Runs `cmd` with `input` on its standard input (empty: nothing) and
/// collects what it prints, as [`Command::output`] does, but kills it
/// (and reaps it) when it has not ended within `limit`.
///
/// `input` is written whole before anything is read: it must fit in a
/// pipe's buffer (64 KiB on Linux) for a tool that prints before it has
/// read it all; the floor's rulesets are a few KiB.
///
/// # Errors
/// The tool could not be started or fed, or (kind
/// [`std::io::ErrorKind::TimedOut`]) did not end within `limit`.
pub fn output_within(cmd: &mut Command, input: &[u8], limit: Duration) -> std::io::Result<Output> {
    let end = Instant::now() + limit;
    let mut child = cmd
        .stdin(if input.is_empty() {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let collected = collect(&mut child, input, end);
    match collected {
        Ok(output) => Ok(output),
        Err(e) => {
            // Killed and reaped: no zombie, and no tool left running
            // after its caller gave up on it.
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

fn timed_out() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "did not end in time, killed")
}

fn collect(child: &mut Child, input: &[u8], end: Instant) -> std::io::Result<Output> {
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input)?;
    }
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut buf = [0u8; 16 * 1024];
    while out.is_some() || err.is_some() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        let timeout = Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        });
        let (out_ready, err_ready) = {
            let mut fds = Vec::with_capacity(2);
            if let Some(o) = &out {
                fds.push(PollFd::new(o, PollFlags::IN));
            }
            if let Some(e) = &err {
                fds.push(PollFd::new(e, PollFlags::IN));
            }
            match poll(&mut fds, Some(&timeout)) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let ready = |fd: Option<&PollFd<'_>>| fd.is_some_and(|p| !p.revents().is_empty());
            let mut it = fds.iter();
            let o = out.is_some() && ready(it.next());
            let e = err.is_some() && ready(it.next());
            (o, e)
        };
        if out_ready {
            read_some(&mut out, &mut stdout, &mut buf)?;
        }
        if err_ready {
            read_some(&mut err, &mut stderr, &mut buf)?;
        }
    }
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Output {
                status,
                stdout,
                stderr,
            });
        }
        if Instant::now() >= end {
            return Err(timed_out());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads what is ready on `pipe` (poll said so: this does not block)
/// into `into`; end of file closes it.
fn read_some<R: std::io::Read>(
    pipe: &mut Option<R>,
    into: &mut Vec<u8>,
    buf: &mut [u8],
) -> std::io::Result<()> {
    let Some(p) = pipe else {
        return Ok(());
    };
    match p.read(buf) {
        Ok(0) => *pipe = None,
        Ok(n) => into.extend_from_slice(&buf[..n]),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
        Err(e) => return Err(e),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tool that never ends is killed at the deadline; one that ends
    /// gives its output and status as `Command::output` would.
    #[test]
    fn a_hung_tool_is_killed_and_a_quick_one_answers() {
        let e = output_within(
            Command::new("/bin/sleep").arg("600"),
            b"",
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        let out = output_within(
            Command::new("/bin/sh").args(["-c", "cat; echo oops >&2; exit 3"]),
            b"hello",
            DEADLINE,
        )
        .unwrap();
        assert_eq!(out.stdout, b"hello");
        assert_eq!(out.stderr, b"oops\n");
        assert_eq!(out.status.code(), Some(3));
    }
}
