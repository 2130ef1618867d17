//! Finding a cached image without rebuilding its archive.
//!
//! A cache entry is named by the hash of the complete initramfs and kernel
//! bytes, so finding it the slow way means reading and packing every input
//! (about 35 MB, two `ldd` runs, a walk of the kernel's module tree) on
//! every `sluice run`. Instead, once an entry is found or built, an index
//! file beside it records every input file the archive was made from (the
//! launcher's own binary among them: it holds `/init` and the DHCP script)
//! with its stamp (device, inode, size, modification and change times).
//! The next run with the same kernel, agent and launcher paths stats those
//! files; when
//! every stamp matches and the entry's files are there, the entry is used
//! as is. Any change to an input (a package upgrade, a rebuilt agent, an
//! edited CA bundle) changes its change time or inode, misses the index and
//! takes the slow path, which rewrites the index. A custom `--rootfs` never
//! uses an index: its tree can change anywhere.
//!
//! The index is a cache of the slow path's answer, never trusted further
//! than the entry itself: whoever can write the cache directory can already
//! replace the image.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Bumped when the index format or what it records changes.
const INDEX_VERSION: &str = "sluice-image-index-2";

/// The index files' directory inside a cache directory.
const INDEX_DIR: &str = ".index";

/// What the file at a path looked like: `None` when it did not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp(Option<[i64; 6]>);

impl Stamp {
    fn of(path: &Path) -> Self {
        Self(fs::metadata(path).ok().map(|m| {
            // Device and inode numbers fit i64 on Linux in practice; a
            // wrapped value only makes a match less likely.
            #[allow(clippy::cast_possible_wrap)]
            let (dev, ino, size) = (m.dev() as i64, m.ino() as i64, m.size() as i64);
            [
                dev,
                ino,
                size,
                m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                m.ctime() * 1_000_000_000 + m.ctime_nsec(),
                i64::from(m.mode()),
            ]
        }))
    }

    fn encode(&self) -> String {
        match self.0 {
            Some(v) => v.map(|x| x.to_string()).join(","),
            None => "absent".to_owned(),
        }
    }

    fn decode(s: &str) -> Option<Self> {
        if s == "absent" {
            return Some(Self(None));
        }
        let parts: Vec<i64> = s
            .split(',')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        Some(Self(Some(parts.try_into().ok()?)))
    }
}

/// The input files of one archive, each stamped before it was read.
#[derive(Debug, Default)]
pub(super) struct Inputs(Vec<(PathBuf, Stamp)>);

impl Inputs {
    /// Records `path` as read now (call before reading it, so a change made
    /// while it is read shows at the next run). An absent file is recorded
    /// as absent: its appearance later misses the index.
    pub(super) fn record(&mut self, path: &Path) {
        if !self.0.iter().any(|(p, _)| p == path) {
            self.0.push((path.to_owned(), Stamp::of(path)));
        }
    }
}

/// The index file for these lookup keys (what selects the inputs before
/// any is read: the kernel and agent paths, the kernel version, and the
/// environment `ldd` depends on).
fn index_path(cache_dir: &Path, keys: &[&str]) -> PathBuf {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(INDEX_VERSION.as_bytes());
    for k in keys {
        ctx.update(&(k.len() as u64).to_be_bytes());
        ctx.update(k.as_bytes());
    }
    let name: String = ctx.finish().as_ref()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    cache_dir.join(INDEX_DIR).join(name)
}

/// The cache entry (its hash) the index for `keys` names, if every input
/// it records still has its stamp.
pub(super) fn lookup(cache_dir: &Path, keys: &[&str]) -> Option<String> {
    let text = fs::read_to_string(index_path(cache_dir, keys)).ok()?;
    let mut lines = text.lines();
    let entry = lines.next()?.strip_prefix("entry ")?;
    if entry.is_empty() || !entry.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut any = false;
    for line in lines {
        let (stamp, path) = line.split_once(' ')?;
        if Stamp::decode(stamp)? != Stamp::of(Path::new(path)) {
            return None;
        }
        any = true;
    }
    any.then(|| entry.to_owned())
}

/// Records that `inputs` make the entry `hash` (best effort: an index that
/// cannot be written only means the next run takes the slow path).
pub(super) fn store(cache_dir: &Path, keys: &[&str], inputs: &Inputs, hash: &str) {
    let path = index_path(cache_dir, keys);
    let Some(dir) = path.parent() else { return };
    if fs::create_dir_all(dir).is_err() {
        return;
    }
    let mut text = format!("entry {hash}\n");
    for (p, stamp) in &inputs.0 {
        // A path with a newline cannot be written unambiguously: no index.
        let Some(p) = p.to_str().filter(|p| !p.contains('\n')) else {
            return;
        };
        text.push_str(&format!("{} {p}\n", stamp.encode()));
    }
    let tmp = dir.join(format!(".tmp.{}", std::process::id()));
    let written = fs::File::create(&tmp).and_then(|mut f| f.write_all(text.as_bytes()));
    if written.is_err() || fs::rename(&tmp, &path).is_err() {
        let _ = fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("sluice-fingerprint-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn an_index_hits_until_an_input_changes() {
        let d = scratch("hit");
        let (a, b) = (d.join("a"), d.join("b"));
        fs::write(&a, b"one").unwrap();
        fs::write(&b, b"two").unwrap();
        let mut inputs = Inputs::default();
        inputs.record(&a);
        inputs.record(&b);
        inputs.record(&d.join("absent"));
        let keys = ["kernel", "agent"];
        store(&d, &keys, &inputs, "00ff");
        assert_eq!(lookup(&d, &keys).as_deref(), Some("00ff"));
        assert_eq!(lookup(&d, &["kernel", "other agent"]), None);

        // Same size, rewritten: the change time moves.
        std::thread::sleep(std::time::Duration::from_millis(10));
        fs::write(&b, b"TWO").unwrap();
        assert_eq!(lookup(&d, &keys), None);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_that_appears_or_a_broken_index_misses() {
        let d = scratch("appear");
        let mut inputs = Inputs::default();
        inputs.record(&d.join("later"));
        store(&d, &["k"], &inputs, "abcd");
        assert_eq!(lookup(&d, &["k"]).as_deref(), Some("abcd"));
        fs::write(d.join("later"), b"x").unwrap();
        assert_eq!(lookup(&d, &["k"]), None);

        fs::write(index_path(&d, &["k"]), "entry ../x\nabsent /nowhere\n").unwrap();
        assert_eq!(lookup(&d, &["k"]), None);
        fs::write(index_path(&d, &["k"]), "entry abcd\n").unwrap();
        assert_eq!(
            lookup(&d, &["k"]),
            None,
            "an index with no inputs is no proof"
        );
        fs::remove_dir_all(&d).unwrap();
    }
}
