//! The guest image: an uncompressed `vmlinux` and a cpio initramfs, built
//! from the host's Debian packages and cached by the content hash of their
//! inputs.
//!
//! Inputs: the newest `/boot/vmlinuz-*` (linux-image-amd64), the virtio
//! modules of that kernel, `/bin/busybox` (busybox-static), the static guest
//! agent, and unless a root filesystem is given, curl and openssl with the
//! shared libraries `ldd` lists and the system CA bundle.
//!
//! Layout inside the guest (also with `--rootfs`, where it is added on top
//! of the user's tree): `/init` (a busybox script), `/sluice/bin/busybox`,
//! `/sluice/bin/sluice-agent`, `/sluice/modules/*.ko`,
//! `/sluice/udhcpc.script`.
//!
//! Finding an entry reads and packs every input; an index beside the
//! entries (`fingerprint`) lets the next run find it by the inputs' file
//! stamps alone.
//!
//! The initramfs is stored uncompressed: the guest kernel would spend longer
//! decompressing gzip under TCG than it spends copying the larger archive.

mod cpio;
mod elf;
mod fingerprint;

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cpio::{Archive, Node};
use fingerprint::Inputs;

/// Bumped whenever the layout below changes, so old cache entries are not
/// reused.
const LAYOUT_VERSION: &str = "sluice-image-1";

/// The modules copied into the image and loaded by the agent, in order.
const MODULES: [&str; 7] = sluice_agent_proto::GUEST_MODULES;

/// The real clients the default image carries.
const CLIENTS: [&str; 2] = ["/usr/bin/curl", "/usr/bin/openssl"];

const INIT: &str = r#"#!/sluice/bin/busybox sh
# sluice guest init: run the agent (it mounts /proc, /sys, /dev, /tmp and
# sets the host name itself: no process per step), power off when it exits.
B=/sluice/bin/busybox
/sluice/bin/sluice-agent
echo "sluice-init: agent exited with status $?"
$B sync
# QEMU runs with -no-reboot: a reboot ends the VM.
$B reboot -f
"#;

const UDHCPC_SCRIPT: &str = r#"#!/sluice/bin/busybox sh
# udhcpc event script: address, default route, MTU and resolv.conf.
# The guest's command waits for it: each busybox command is a process,
# which costs tens of milliseconds under TCG, so as few as possible.
B=/sluice/bin/busybox
case "$1" in
  deconfig)
    # The link's only address is the one the lease gives: up, nothing else.
    $B ip link set "$interface" up
    ;;
  bound|renew)
    # One ifconfig replaces the primary address and sets mask, MTU, up.
    $B ifconfig "$interface" "$ip" netmask "${subnet:-255.255.255.0}" ${mtu:+mtu "$mtu"} up
    for r in $router; do $B route add default gw "$r" dev "$interface"; break; done
    : > /etc/resolv.conf
    for d in $dns; do echo "nameserver $d" >> /etc/resolv.conf; done
    ;;
esac
exit 0
"#;

/// Why the image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// An input file could not be read or an output written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// An input is missing or unusable.
    #[error("{0}")]
    Input(String),
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ImageError + 'a {
    move |source| ImageError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// What to build the image from.
#[derive(Debug, Clone)]
pub struct ImageOptions {
    /// The static guest agent binary.
    pub agent: PathBuf,
    /// The compressed kernel; the newest `/boot/vmlinuz-*` when absent.
    pub kernel: Option<PathBuf>,
    /// A root filesystem directory to pack instead of the default userland.
    pub rootfs: Option<PathBuf>,
    /// The cache directory ([`default_cache_dir`]): read, and written on a
    /// miss.
    pub cache_dir: PathBuf,
    /// A cache only read, before `cache_dir` ([`shared_cache_dir`]).
    pub shared_cache: Option<PathBuf>,
}

/// A built image, ready to boot.
#[derive(Debug, Clone)]
pub struct Image {
    /// The uncompressed kernel (ELF with a PVH note).
    pub kernel: PathBuf,
    /// The initramfs (newc cpio).
    pub initrd: PathBuf,
    /// The cache entry holding both.
    pub dir: PathBuf,
    /// Whether this call built it (false: found in the cache).
    pub built: bool,
}

/// The cache root builds go into: `/var/cache/sluice/images`.
pub const SYSTEM_CACHE: &str = "/var/cache/sluice/images";

/// The default cache directory: `$SLUICE_CACHE` if set; as root
/// [`SYSTEM_CACHE`]; rootless `$XDG_CACHE_HOME/sluice/images`, else
/// `$HOME/.cache/sluice/images`, else `images` in the caller's private
/// runtime dir (`jail::default_runtime_dir`).
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SLUICE_CACHE") {
        return PathBuf::from(dir);
    }
    if !crate::jail::is_rootless() {
        return PathBuf::from(SYSTEM_CACHE);
    }
    let absolute = |v: &str| {
        std::env::var_os(v)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(xdg) = absolute("XDG_CACHE_HOME") {
        return xdg.join("sluice/images");
    }
    if let Some(home) = absolute("HOME") {
        return home.join(".cache/sluice/images");
    }
    crate::jail::default_runtime_dir().join("images")
}

/// A cache that is only read: root's [`SYSTEM_CACHE`] for a rootless run
/// that uses its own cache (`None` as root or with `$SLUICE_CACHE`). An
/// entry found there is used when both files can be opened; the user never
/// writes there.
pub fn shared_cache_dir() -> Option<PathBuf> {
    (crate::jail::is_rootless() && std::env::var_os("SLUICE_CACHE").is_none())
        .then(|| PathBuf::from(SYSTEM_CACHE))
}

/// Finds the static guest agent: `explicit` (from `--agent` or
/// `SLUICE_AGENT`), else `<target>/x86_64-unknown-linux-gnu/release/sluice-agent`
/// relative to this executable's `<target>/release/`, else `sluice-agent`
/// next to this executable. The file must be a statically linked ELF.
pub fn find_agent(explicit: Option<&Path>) -> Result<PathBuf, ImageError> {
    let mut candidates = Vec::new();
    if let Some(p) = explicit {
        candidates.push(p.to_owned());
    } else if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_owned))
    {
        if let Some(target) = dir.parent() {
            candidates.push(target.join("x86_64-unknown-linux-gnu/release/sluice-agent"));
        }
        candidates.push(dir.join("sluice-agent"));
    }
    for c in &candidates {
        if c.is_file() {
            let head = read_head(c)?;
            return match elf::is_static_executable(&head) {
                Some(true) => Ok(c.clone()),
                Some(false) => Err(ImageError::Input(format!(
                    "{} is dynamically linked; build it with RUSTFLAGS=\"-C target-feature=+crt-static\" \
                     cargo build --release -p sluice-guest-agent --target x86_64-unknown-linux-gnu",
                    c.display()
                ))),
                None => Err(ImageError::Input(format!(
                    "{} is not an ELF executable",
                    c.display()
                ))),
            };
        }
    }
    Err(ImageError::Input(format!(
        "no guest agent found (looked at {candidates:?}); pass --agent PATH or set SLUICE_AGENT"
    )))
}

fn read_head(p: &Path) -> Result<Vec<u8>, ImageError> {
    let mut f = fs::File::open(p).map_err(io_err("opening", p))?;
    let mut head = vec![0u8; 4096];
    let n = f.read(&mut head).map_err(io_err("reading", p))?;
    head.truncate(n);
    Ok(head)
}

/// The newest `/boot/vmlinuz-*` and its version string.
pub fn default_kernel() -> Result<(PathBuf, String), ImageError> {
    let mut found: Vec<(PathBuf, String)> = fs::read_dir("/boot")
        .map_err(io_err("listing", Path::new("/boot")))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let ver = name.strip_prefix("vmlinuz-")?.to_owned();
            Some((e.path(), ver))
        })
        .collect();
    found.sort_by(|a, b| a.1.cmp(&b.1));
    found
        .pop()
        .ok_or_else(|| ImageError::Input("no /boot/vmlinuz-*: install linux-image-amd64".into()))
}

/// Returns the cached image for these inputs, building it on a miss.
/// `progress` receives one line per step of a build.
pub fn prepare(opts: &ImageOptions, progress: &mut dyn FnMut(&str)) -> Result<Image, ImageError> {
    let (vmlinuz, version) = match &opts.kernel {
        Some(k) => {
            let ver = k
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("vmlinuz-"))
                .map(str::to_owned)
                .ok_or_else(|| {
                    ImageError::Input(format!("{}: expected a vmlinuz-VERSION file", k.display()))
                })?;
            (k.clone(), ver)
        }
        None => default_kernel()?,
    };
    // What selects the inputs before any is read; `ldd` follows the
    // loader's environment.
    let env = |v: &str| std::env::var(v).unwrap_or_default();
    // The launcher's own binary is an input too: it holds `/init`, the
    // DHCP script and the `/etc` files, so a rebuilt launcher never reuses
    // an older one's index. No index without it, nor with `--rootfs`.
    let exe = std::env::current_exe().ok();
    let index_keys = [
        exe.as_deref()
            .map(|e| e.to_string_lossy().into_owned())
            .unwrap_or_default(),
        LAYOUT_VERSION.to_owned(),
        vmlinuz.to_string_lossy().into_owned(),
        version.clone(),
        opts.agent.to_string_lossy().into_owned(),
        env("LD_LIBRARY_PATH"),
        env("LD_PRELOAD"),
    ];
    let index_keys: Vec<&str> = index_keys.iter().map(String::as_str).collect();
    let use_index = opts.rootfs.is_none() && exe.is_some();
    if use_index && let Some(image) = indexed(opts, &index_keys) {
        return Ok(image);
    }
    let mut inputs = Inputs::default();
    if let Some(exe) = &exe {
        inputs.record(exe);
    }
    let archive = assemble(opts, &version, &mut inputs)?;
    let initrd_bytes = archive.to_bytes();
    inputs.record(&vmlinuz);
    let vmlinuz_bytes = fs::read(&vmlinuz).map_err(io_err("reading", &vmlinuz))?;
    // Index the entry once it is found or built (below).
    let remember = |hash: &str| {
        if use_index {
            fingerprint::store(&opts.cache_dir, &index_keys, &inputs, hash);
        }
    };

    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(LAYOUT_VERSION.as_bytes());
    ctx.update(&(vmlinuz_bytes.len() as u64).to_be_bytes());
    ctx.update(&vmlinuz_bytes);
    ctx.update(&initrd_bytes);
    let hash: String = ctx.finish().as_ref()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if let Some(shared) = &opts.shared_cache {
        let dir = shared.join(&hash);
        let (kernel, initrd) = (dir.join("vmlinux"), dir.join("initramfs.cpio"));
        if fs::File::open(&kernel).is_ok() && fs::File::open(&initrd).is_ok() {
            remember(&hash);
            return Ok(Image {
                kernel,
                initrd,
                dir,
                built: false,
            });
        }
    }
    let dir = opts.cache_dir.join(&hash);
    let image = Image {
        kernel: dir.join("vmlinux"),
        initrd: dir.join("initramfs.cpio"),
        dir: dir.clone(),
        built: false,
    };
    if image.kernel.is_file() && image.initrd.is_file() {
        remember(&hash);
        return Ok(image);
    }

    progress(&format!("building the guest image into {}", dir.display()));
    fs::create_dir_all(&opts.cache_dir).map_err(io_err("creating", &opts.cache_dir))?;
    // Build into a temporary sibling and rename, so a crash never leaves a
    // half-written entry that looks complete.
    let tmp = opts
        .cache_dir
        .join(format!(".{hash}.{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(io_err("creating", &tmp))?;
    let result = (|| {
        progress(&format!("extracting vmlinux from {}", vmlinuz.display()));
        let vmlinux = extract_vmlinux(&vmlinuz_bytes)?;
        write_file(&tmp.join("vmlinux"), &vmlinux)?;
        progress(&format!(
            "writing the initramfs ({} KiB)",
            initrd_bytes.len() / 1024
        ));
        write_file(&tmp.join("initramfs.cpio"), &initrd_bytes)?;
        match fs::rename(&tmp, &dir) {
            Ok(()) => Ok(()),
            // Another launcher won the race with identical content.
            Err(_) if image.kernel.is_file() && image.initrd.is_file() => Ok(()),
            Err(e) => Err(io_err("renaming into", &dir)(e)),
        }
    })();
    let _ = fs::remove_dir_all(&tmp);
    result?;
    remember(&hash);
    Ok(Image {
        built: true,
        ..image
    })
}

/// The entry an index names for these keys, when every input it records
/// is unchanged and the entry's files open: the shared cache's index and
/// entries first, as the slow path looks.
fn indexed(opts: &ImageOptions, keys: &[&str]) -> Option<Image> {
    let caches: Vec<&Path> = opts
        .shared_cache
        .iter()
        .map(PathBuf::as_path)
        .chain([opts.cache_dir.as_path()])
        .collect();
    let hash = caches.iter().find_map(|c| fingerprint::lookup(c, keys))?;
    caches.iter().find_map(|c| {
        let dir = c.join(&hash);
        let (kernel, initrd) = (dir.join("vmlinux"), dir.join("initramfs.cpio"));
        (fs::File::open(&kernel).is_ok() && fs::File::open(&initrd).is_ok()).then_some(Image {
            kernel,
            initrd,
            dir,
            built: false,
        })
    })
}

fn write_file(p: &Path, data: &[u8]) -> Result<(), ImageError> {
    let mut f = fs::File::create(p).map_err(io_err("creating", p))?;
    f.write_all(data).map_err(io_err("writing", p))
}

/// Finds the xz stream inside a bzImage and decompresses it with `xz`, as
/// the kernel's `scripts/extract-vmlinux` does.
fn extract_vmlinux(vmlinuz: &[u8]) -> Result<Vec<u8>, ImageError> {
    const XZ_MAGIC: [u8; 6] = [0xfd, b'7', b'z', b'X', b'Z', 0];
    let start = vmlinuz
        .windows(XZ_MAGIC.len())
        .position(|w| w == XZ_MAGIC)
        .ok_or_else(|| ImageError::Input("no xz payload in the kernel image".into()))?;
    let mut child = Command::new("xz")
        .args(["-dc", "--single-stream"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(io_err("running", Path::new("xz")))?;
    let payload = vmlinuz[start..].to_vec();
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| ImageError::Input("xz has no stdin".into()))?;
    let feeder = std::thread::spawn(move || {
        // xz stops reading at the end of the stream: a broken pipe is fine.
        let _ = stdin.write_all(&payload);
    });
    let out = child
        .wait_with_output()
        .map_err(io_err("running", Path::new("xz")))?;
    let _ = feeder.join();
    if !out.stdout.starts_with(b"\x7fELF") {
        return Err(ImageError::Input(
            "the kernel's xz payload did not decompress to an ELF vmlinux".into(),
        ));
    }
    Ok(out.stdout)
}

/// Lays out the initramfs tree; every input file read (but a `--rootfs`
/// tree's) is recorded in `inputs`.
fn assemble(
    opts: &ImageOptions,
    version: &str,
    inputs: &mut Inputs,
) -> Result<Archive, ImageError> {
    let mut a = Archive::default();
    if let Some(root) = &opts.rootfs {
        add_tree(&mut a, root, root)?;
    } else {
        add_default_userland(&mut a, inputs)?;
    }
    let busybox = Path::new("/bin/busybox");
    inputs.record(busybox);
    a.insert("sluice/bin/busybox", Node::File(0o755, read(busybox)?));
    inputs.record(&opts.agent);
    a.insert(
        "sluice/bin/sluice-agent",
        Node::File(0o755, read(&opts.agent)?),
    );
    let moddir = PathBuf::from(format!("/lib/modules/{version}/kernel"));
    for m in MODULES {
        if let Some(ko) = find_module(&moddir, m, inputs)? {
            a.insert(&format!("sluice/modules/{m}.ko"), Node::File(0o644, ko));
        }
    }
    a.insert(
        "sluice/udhcpc.script",
        Node::File(0o755, UDHCPC_SCRIPT.into()),
    );
    a.insert("init", Node::File(0o755, INIT.into()));
    for d in ["proc", "sys", "dev", "tmp", "run", "root"] {
        if !a.contains(d) {
            a.insert(d, Node::Dir(if d == "tmp" { 0o1777 } else { 0o755 }));
        }
    }
    Ok(a)
}

fn read(p: &Path) -> Result<Vec<u8>, ImageError> {
    fs::read(p).map_err(io_err("reading", p))
}

/// busybox applets, curl, openssl, their libraries, CA bundle, /etc basics.
fn add_default_userland(a: &mut Archive, inputs: &mut Inputs) -> Result<(), ImageError> {
    // What `ldd` reads besides the binaries and libraries themselves.
    inputs.record(Path::new("/etc/ld.so.cache"));
    inputs.record(Path::new("/etc/ld.so.preload"));
    let out = Command::new("/bin/busybox")
        .arg("--list-full")
        .output()
        .map_err(io_err("running", Path::new("/bin/busybox")))?;
    for applet in String::from_utf8_lossy(&out.stdout).lines() {
        let applet = applet.trim();
        if !applet.is_empty() {
            a.insert(applet, Node::Symlink("/sluice/bin/busybox".into()));
        }
    }
    for client in CLIENTS {
        let p = Path::new(client);
        inputs.record(p);
        a.insert(client, Node::File(0o755, read(p)?));
        for lib in shared_libraries(p)? {
            inputs.record(&lib);
            let data = read(&lib)?;
            a.insert(&lib.to_string_lossy(), Node::File(0o755, data));
        }
    }
    let bundle = Path::new("/etc/ssl/certs/ca-certificates.crt");
    inputs.record(bundle);
    a.insert(
        "etc/ssl/certs/ca-certificates.crt",
        Node::File(0o644, read(bundle)?),
    );
    let cnf = Path::new("/usr/lib/ssl/openssl.cnf");
    inputs.record(cnf);
    if let Ok(data) = fs::read(cnf) {
        a.insert("usr/lib/ssl/openssl.cnf", Node::File(0o644, data));
    }
    a.insert("usr/lib/ssl/certs", Node::Symlink("/etc/ssl/certs".into()));
    a.insert(
        "etc/passwd",
        Node::File(0o644, b"root:x:0:0:root:/root:/bin/sh\n".to_vec()),
    );
    a.insert("etc/group", Node::File(0o644, b"root:x:0:\n".to_vec()));
    a.insert(
        "etc/hosts",
        Node::File(0o644, b"127.0.0.1 localhost sluice\n".to_vec()),
    );
    a.insert(
        "etc/nsswitch.conf",
        Node::File(
            0o644,
            b"passwd: files\ngroup: files\nhosts: files dns\n".to_vec(),
        ),
    );
    a.insert("etc/resolv.conf", Node::File(0o644, Vec::new()));
    Ok(())
}

/// The shared libraries (and the dynamic loader) `ldd` reports for `bin`.
fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .map_err(io_err("running ldd on", bin))?;
    if !out.status.success() {
        return Err(ImageError::Input(format!("ldd {} failed", bin.display())));
    }
    let mut libs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; "linux-vdso.so.1 (0x...)" has no file.
        let path = match line.split_once("=>") {
            Some((_, rhs)) => rhs.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

/// `<name>.ko` under the kernel's module tree (uncompressing `.ko.xz`).
fn find_module(dir: &Path, name: &str, inputs: &mut Inputs) -> Result<Option<Vec<u8>>, ImageError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("listing", dir)(e)),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(ft) = entry.file_type() else { continue };
        if ft.is_dir() {
            if let Some(found) = find_module(&path, name, inputs)? {
                return Ok(Some(found));
            }
            continue;
        }
        let file = entry.file_name();
        let file = file.to_string_lossy();
        if file == format!("{name}.ko") {
            inputs.record(&path);
            return read(&path).map(Some);
        }
        if file == format!("{name}.ko.xz") {
            inputs.record(&path);
            let out = Command::new("xz")
                .arg("-dc")
                .arg(&path)
                .output()
                .map_err(io_err("decompressing", &path))?;
            return Ok(Some(out.stdout));
        }
    }
    Ok(None)
}

/// Adds a user's root filesystem tree: directories, regular files and
/// symlinks; device nodes, sockets and FIFOs are skipped (`/dev` is a
/// devtmpfs in the guest).
fn add_tree(a: &mut Archive, root: &Path, dir: &Path) -> Result<(), ImageError> {
    use std::os::unix::fs::PermissionsExt;
    for entry in fs::read_dir(dir).map_err(io_err("listing", dir))?.flatten() {
        let path = entry.path();
        let Ok(rel) = path.strip_prefix(root) else {
            continue;
        };
        let rel = rel.to_string_lossy().into_owned();
        let meta = fs::symlink_metadata(&path).map_err(io_err("reading", &path))?;
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_dir() {
            a.insert(&rel, Node::Dir(mode));
            add_tree(a, root, &path)?;
        } else if meta.is_file() {
            if meta.len() > u64::from(u32::MAX) {
                return Err(ImageError::Input(format!(
                    "{} is too large for cpio",
                    path.display()
                )));
            }
            a.insert(&rel, Node::File(mode, read(&path)?));
        } else if meta.file_type().is_symlink() {
            let target = fs::read_link(&path).map_err(io_err("reading link", &path))?;
            a.insert(&rel, Node::Symlink(target.to_string_lossy().into_owned()));
        }
    }
    Ok(())
}
