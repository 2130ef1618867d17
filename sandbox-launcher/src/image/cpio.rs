//! A writer for the `newc` cpio format the kernel unpacks as an initramfs.
//!
//! Entries are kept sorted by path, parents are added as directories when
//! missing (the kernel does not create them), and every timestamp, owner and
//! inode number is fixed, so that the same inputs give the same bytes (the
//! image cache is keyed by their hash).

use std::collections::BTreeMap;

/// One file system object in the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    /// A directory with these permission bits.
    Dir(u32),
    /// A regular file with these permission bits and content.
    File(u32, Vec<u8>),
    /// A symbolic link to this target.
    Symlink(String),
}

/// An archive under construction; paths are relative, without a leading `/`.
#[derive(Debug, Default)]
pub(crate) struct Archive {
    nodes: BTreeMap<String, Node>,
}

impl Archive {
    /// Adds (or replaces) `path`, adding missing parent directories (0755).
    pub(crate) fn insert(&mut self, path: &str, node: Node) {
        let path = path.trim_start_matches('/').trim_end_matches('/');
        if path.is_empty() {
            return;
        }
        let mut parent = String::new();
        for part in path
            .split('/')
            .collect::<Vec<_>>()
            .split_last()
            .map_or(&[][..], |(_, p)| p)
        {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            self.nodes.entry(parent.clone()).or_insert(Node::Dir(0o755));
        }
        self.nodes.insert(path.to_owned(), node);
    }

    /// Whether `path` is already in the archive.
    pub(crate) fn contains(&self, path: &str) -> bool {
        self.nodes.contains_key(path.trim_start_matches('/'))
    }

    /// Serializes the archive, ending with the `TRAILER!!!` record.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (ino, (path, node)) in (1u32..).zip(&self.nodes) {
            let (mode, data): (u32, &[u8]) = match node {
                Node::Dir(m) => (0o040_000 | (m & 0o7777), &[]),
                Node::File(m, d) => (0o100_000 | (m & 0o7777), d),
                Node::Symlink(t) => (0o120_777, t.as_bytes()),
            };
            let nlink = if matches!(node, Node::Dir(_)) { 2 } else { 1 };
            record(&mut out, ino, mode, nlink, path, data);
        }
        record(&mut out, 0, 0, 1, "TRAILER!!!", &[]);
        out
    }
}

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

fn record(out: &mut Vec<u8>, ino: u32, mode: u32, nlink: u32, name: &str, data: &[u8]) {
    // newc stores sizes in 32 bits; the image builder refuses larger files.
    let size = u32::try_from(data.len()).unwrap_or(u32::MAX);
    let namesize = u32::try_from(name.len() + 1).unwrap_or(u32::MAX);
    let fields = [ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, namesize, 0];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08X}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn parents_are_added_and_output_is_deterministic() {
        let mut a = Archive::default();
        a.insert("/usr/bin/tool", Node::File(0o755, b"#!x".to_vec()));
        a.insert("bin/sh", Node::Symlink("/usr/bin/tool".into()));
        assert!(a.contains("usr") && a.contains("/usr/bin"));
        let mut b = Archive::default();
        b.insert("bin/sh", Node::Symlink("/usr/bin/tool".into()));
        b.insert("usr/bin/tool", Node::File(0o755, b"#!x".to_vec()));
        assert_eq!(a.to_bytes(), b.to_bytes());
        assert_eq!(a.to_bytes().len() % 4, 0);
    }

    /// The archive is read back by a real cpio implementation.
    #[test]
    fn system_cpio_lists_what_was_written() {
        let mut a = Archive::default();
        a.insert("etc/hello.txt", Node::File(0o644, b"hello\n".to_vec()));
        a.insert("link", Node::Symlink("etc/hello.txt".into()));
        let Ok(mut child) = Command::new("cpio")
            .args(["-it", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
        else {
            sluice_test_skip::may_skip("cpio", "no cpio binary (scripts/install-deps)");
            return;
        };
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&a.to_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let listing = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            listing.lines().collect::<Vec<_>>(),
            ["etc", "etc/hello.txt", "link"]
        );
    }
}
