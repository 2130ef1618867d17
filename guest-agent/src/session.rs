//! One host session over the virtio-serial port.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use sluice_agent_proto::{
    CHUNK, ExecRequest, ExitStatus, Message, PORT_NAME, ProtoError, VERSION, read_frame,
    write_frame,
};

use crate::setup;

/// How long the agent waits for the virtio-serial port to appear.
const PORT_WAIT: Duration = Duration::from_secs(30);

/// The environment every command starts from.
const BASE_ENV: [(&str, &str); 4] = [
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("HOME", "/root"),
    ("TERM", "dumb"),
    ("LANG", "C.UTF-8"),
];

/// The host end of the session, shared by the threads that send output.
type Sender = Arc<Mutex<File>>;

fn send(tx: &Sender, msg: &Message) -> Result<(), ProtoError> {
    let mut port = tx
        .lock()
        .map_err(|_| io::Error::other("sender lock poisoned"))?;
    write_frame(&mut *port, msg)
}

/// Finds `/dev/vportNpM` whose sysfs name is [`PORT_NAME`].
fn find_port() -> io::Result<PathBuf> {
    let deadline = Instant::now() + PORT_WAIT;
    loop {
        if let Ok(entries) = fs::read_dir("/sys/class/virtio-ports") {
            for entry in entries.flatten() {
                let name = fs::read_to_string(entry.path().join("name")).unwrap_or_default();
                if name.trim() == PORT_NAME {
                    return Ok(Path::new("/dev").join(entry.file_name()));
                }
            }
        }
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no virtio-serial port named {PORT_NAME}"),
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// State of the command being run, if any.
struct Running {
    stdin: Option<mpsc::Sender<Option<Vec<u8>>>>,
    done: JoinHandle<()>,
}

/// Serves the host until it sends `Shutdown`, closes the port, or sends a
/// malformed frame (answered with `Error`, then the session ends).
pub(crate) fn serve(network: JoinHandle<()>) -> Result<(), ProtoError> {
    let path = find_port()?;
    let port = OpenOptions::new().read(true).write(true).open(&path)?;
    let mut rx = port.try_clone()?;
    let tx: Sender = Arc::new(Mutex::new(port));
    send(&tx, &Message::Hello { version: VERSION })?;
    match read_frame(&mut rx)? {
        Some(Message::Hello { version }) if version == VERSION => {}
        Some(Message::Hello { version }) => {
            let message = format!("agent speaks version {VERSION}, host {version}");
            let _ = send(
                &tx,
                &Message::Error {
                    message: message.clone(),
                },
            );
            return Err(io::Error::other(message).into());
        }
        other => {
            let message = format!("expected Hello, got {other:?}");
            let _ = send(
                &tx,
                &Message::Error {
                    message: message.clone(),
                },
            );
            return Err(io::Error::other(message).into());
        }
    }

    let mut network = Some(network);
    let mut extra_env: Vec<(String, String)> = Vec::new();
    let mut running: Option<Running> = None;
    loop {
        let msg = match read_frame(&mut rx) {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(e) => {
                let _ = send(
                    &tx,
                    &Message::Error {
                        message: format!("agent: malformed frame: {e}"),
                    },
                );
                return Err(e);
            }
        };
        if running.as_ref().is_some_and(|r| r.done.is_finished()) {
            running = None;
        }
        match msg {
            Message::Exec(req) => {
                if running.is_some() {
                    send(&tx, &error("a command is already running"))?;
                    continue;
                }
                // Commands see the network as DHCP left it (bounded wait).
                if let Some(n) = network.take() {
                    let _ = n.join();
                }
                running = Some(exec(&tx, req, &extra_env)?);
            }
            Message::Stdin(data) => {
                if let Some(s) = running.as_ref().and_then(|r| r.stdin.as_ref()) {
                    // The command may have closed its stdin: not an error.
                    let _ = s.send(Some(data));
                }
            }
            Message::StdinEof => {
                if let Some(s) = running.as_mut().and_then(|r| r.stdin.take()) {
                    let _ = s.send(None);
                }
            }
            Message::InstallCa { pem } => match setup::install_ca(&pem) {
                Ok(env) => {
                    extra_env = env;
                    send(&tx, &Message::Ack)?;
                }
                Err(e) => send(&tx, &error(&e))?,
            },
            Message::CopyIn { path, mode } => copy_in(&tx, &mut rx, &path, mode)?,
            Message::CopyOut { path } => copy_out(&tx, &path)?,
            Message::Shutdown => {
                if let Some(r) = running.take() {
                    let _ = r.done.join();
                }
                send(&tx, &Message::Ack)?;
                return Ok(());
            }
            other => {
                let message = format!("agent: unexpected message {other:?}");
                let _ = send(&tx, &error(&message));
                return Err(io::Error::other(message).into());
            }
        }
    }
}

fn error(message: &str) -> Message {
    Message::Error {
        message: message.to_owned(),
    }
}

/// Starts a command; its output and exit are sent by its own threads.
fn exec(
    tx: &Sender,
    req: ExecRequest,
    extra_env: &[(String, String)],
) -> Result<Running, ProtoError> {
    let Some((prog, args)) = req.argv.split_first() else {
        send(tx, &error("empty argv"))?;
        send(tx, &Message::Exit(ExitStatus::Code(127)))?;
        return Ok(finished());
    };
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .env_clear()
        .envs(BASE_ENV)
        .envs(extra_env.iter().map(|(k, v)| (k, v)))
        .envs(req.env.iter().map(|(k, v)| (k, v)))
        .current_dir(req.cwd.as_deref().unwrap_or("/"))
        .stdin(if req.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let text = format!("sluice-agent: cannot run {prog}: {e}\n");
            send(tx, &Message::Stderr(text.into_bytes()))?;
            let code = if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            send(tx, &Message::Exit(ExitStatus::Code(code)))?;
            return Ok(finished());
        }
    };
    let stdin = child.stdin.take().map(|mut pipe| {
        let (s, r) = mpsc::channel::<Option<Vec<u8>>>();
        thread::spawn(move || {
            while let Ok(Some(data)) = r.recv() {
                if pipe.write_all(&data).is_err() {
                    break;
                }
            }
            // Dropping the pipe closes the command's stdin.
        });
        s
    });
    let out = child
        .stdout
        .take()
        .map(|p| pump(tx.clone(), p, Message::Stdout));
    let err = child
        .stderr
        .take()
        .map(|p| pump(tx.clone(), p, Message::Stderr));
    let tx = tx.clone();
    let done = thread::spawn(move || {
        for h in [out, err].into_iter().flatten() {
            let _ = h.join();
        }
        let status = wait(&mut child);
        if let Err(e) = send(&tx, &Message::Exit(status)) {
            eprintln!("sluice-agent: cannot report the exit: {e}");
        }
    });
    Ok(Running { stdin, done })
}

fn finished() -> Running {
    Running {
        stdin: None,
        done: thread::spawn(|| {}),
    }
}

fn wait(child: &mut Child) -> ExitStatus {
    match child.wait() {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => ExitStatus::Code(c),
            (None, Some(sig)) => ExitStatus::Signal(sig),
            (None, None) => ExitStatus::Code(255),
        },
        Err(e) => {
            eprintln!("sluice-agent: wait failed: {e}");
            ExitStatus::Code(255)
        }
    }
}

/// Forwards one output pipe as chunks until it closes.
fn pump<R: Read + Send + 'static>(
    tx: Sender,
    mut pipe: R,
    wrap: fn(Vec<u8>) -> Message,
) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if send(&tx, &wrap(buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    })
}

/// Receives a file: chunks are consumed up to `FileEnd` even when the file
/// cannot be written, so the session stays in step; the answer is `Ack` or
/// `Error`.
fn copy_in(tx: &Sender, rx: &mut File, path: &str, mode: u32) -> Result<(), ProtoError> {
    let mut failure: Option<String> = None;
    let mut file = match open_for_copy_in(path, mode) {
        Ok(f) => Some(f),
        Err(e) => {
            failure = Some(format!("cannot write {path}: {e}"));
            None
        }
    };
    loop {
        match read_frame(rx)? {
            Some(Message::FileChunk(data)) => {
                if let Some(Err(e)) = file.as_mut().map(|f| f.write_all(&data)) {
                    failure = Some(format!("writing {path}: {e}"));
                    file = None;
                }
            }
            Some(Message::FileEnd) => break,
            other => {
                let message = format!("agent: expected FileChunk or FileEnd, got {other:?}");
                let _ = send(tx, &error(&message));
                return Err(io::Error::other(message).into());
            }
        }
    }
    match failure {
        None => send(tx, &Message::Ack),
        Some(f) => send(tx, &error(&f)),
    }
}

fn open_for_copy_in(path: &str, mode: u32) -> io::Result<File> {
    let path = Path::new(path);
    if !path.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path is not absolute",
        ));
    }
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode & 0o7777)
        .open(path)?;
    f.set_permissions(fs::Permissions::from_mode(mode & 0o7777))?;
    Ok(f)
}

/// Sends a file as `FileStart`, chunks, `FileEnd`; or `Error`.
fn copy_out(tx: &Sender, path: &str) -> Result<(), ProtoError> {
    let opened = File::open(path).and_then(|f| {
        let meta = f.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        Ok((f, meta.permissions().mode() & 0o7777))
    });
    let (mut f, mode) = match opened {
        Ok(x) => x,
        Err(e) => return send(tx, &error(&format!("cannot read {path}: {e}"))),
    };
    send(tx, &Message::FileStart { mode })?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => send(tx, &Message::FileChunk(buf[..n].to_vec()))?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // The host has seen FileStart: an Error ends the transfer.
                return send(tx, &error(&format!("reading {path}: {e}")));
            }
        }
    }
    send(tx, &Message::FileEnd)
}
