//! Reading an audit file as it grows: complete lines only, with their line
//! numbers, across rotation.
//!
//! A line is handed out once its newline is there; the bytes after the last
//! newline are kept until the rest arrives (a writer is mid-line), and at the
//! end of a one-shot read they are offered by [`Source::finish`]. Rotation:
//! when the path names another file (renamed away and recreated, as
//! logrotate does) the old file is read to its end first, then the new one
//! from its start; when the file shrank (truncated in place,
//! `copytruncate`) it is read again from its start. Line numbers restart
//! with each new file.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A read chunk; a line longer than this is simply assembled over several.
const CHUNK: usize = 64 * 1024;

/// One audit file being read.
#[derive(Debug)]
pub struct Source {
    path: PathBuf,
    file: Option<File>,
    /// (device, inode) of the open file.
    id: (u64, u64),
    offset: u64,
    partial: Vec<u8>,
    line_no: u64,
}

impl Source {
    /// A source for `path`; the file need not exist yet (it is opened on the
    /// first [`Source::poll`] that finds it).
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            file: None,
            id: (0, 0),
            offset: 0,
            partial: Vec::new(),
            line_no: 0,
        }
    }

    /// The path being read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the file if it is not open. `Ok(false)`: it does not exist.
    pub fn open(&mut self) -> io::Result<bool> {
        if self.file.is_some() {
            return Ok(true);
        }
        match File::open(&self.path) {
            Ok(f) => {
                let m = f.metadata()?;
                self.id = (m.dev(), m.ino());
                self.file = Some(f);
                self.offset = 0;
                self.partial.clear();
                self.line_no = 0;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Reads what was appended since the last call and calls `line(n, text)`
    /// for every complete line (`n` counts from 1; the newline is not in
    /// `text`).
    pub fn poll(&mut self, line: &mut impl FnMut(&Path, u64, &str)) -> io::Result<()> {
        if !self.open()? {
            return Ok(());
        }
        let Some(f) = self.file.as_mut() else {
            return Ok(());
        };
        let len = f.metadata()?.len();
        if len < self.offset {
            // Truncated in place: what is there now is new.
            f.seek(SeekFrom::Start(0))?;
            self.offset = 0;
            self.partial.clear();
            self.line_no = 0;
        }
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            self.offset += n as u64;
            let mut rest = &buf[..n];
            while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
                self.partial.extend_from_slice(&rest[..nl]);
                self.line_no += 1;
                line(
                    &self.path,
                    self.line_no,
                    &String::from_utf8_lossy(&self.partial),
                );
                self.partial.clear();
                rest = &rest[nl + 1..];
            }
            self.partial.extend_from_slice(rest);
        }
        Ok(())
    }

    /// For `--follow`: when the path now names another file, reads the old
    /// one to its end (its partial last line, if any, is then complete as
    /// far as it will ever be: offered as a line) and switches to the new
    /// one from its start. Returns whether it switched.
    pub fn check_rotation(&mut self, line: &mut impl FnMut(&Path, u64, &str)) -> io::Result<bool> {
        let now = match std::fs::metadata(&self.path) {
            Ok(m) => (m.dev(), m.ino()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        if self.file.is_none() || now == self.id {
            return Ok(false);
        }
        self.poll(line)?;
        if let Some((n, text)) = self.finish() {
            line(&self.path, n, &text);
        }
        self.file = None;
        self.poll(line)?;
        Ok(true)
    }

    /// The bytes after the last newline, if any (a partial last line), with
    /// the line number it would have; clears them.
    pub fn finish(&mut self) -> Option<(u64, String)> {
        if self.partial.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(&self.partial).into_owned();
        self.partial.clear();
        self.line_no += 1;
        Some((self.line_no, text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn collect(s: &mut Source) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        s.poll(&mut |_, n, t| out.push((n, t.to_owned()))).unwrap();
        out
    }

    #[test]
    fn complete_lines_only_then_the_rest_when_it_arrives() {
        let dir = std::env::temp_dir().join(format!("sluice-follow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.jsonl");
        std::fs::write(&p, "one\ntwo\nthr").unwrap();
        let mut s = Source::new(&p);
        assert_eq!(collect(&mut s), [(1, "one".into()), (2, "two".into())]);
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"ee\nfou").unwrap();
        assert_eq!(collect(&mut s), [(3, "three".into())]);
        assert_eq!(s.finish(), Some((4, "fou".into())));
        assert_eq!(s.finish(), None);

        // Rotation: renamed away (with a last line written late), recreated.
        let mut s = Source::new(&p);
        collect(&mut s);
        f.write_all(b"r\n").unwrap();
        std::fs::rename(&p, dir.join("a.jsonl.1")).unwrap();
        std::fs::write(&p, "new1\n").unwrap();
        let mut seen = Vec::new();
        assert!(
            s.check_rotation(&mut |_, n, t| seen.push((n, t.to_owned())))
                .unwrap()
        );
        assert_eq!(seen, [(4, "four".into()), (1, "new1".into())]);

        // Truncation in place: read again from the start.
        std::fs::write(&p, "").unwrap();
        assert!(collect(&mut s).is_empty());
        std::fs::write(&p, "x\n").unwrap();
        assert_eq!(collect(&mut s), [(1, "x".into())]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
