//! The shared libraries a program loads (as `ldd` reports them), which a
//! jail must bind-mount for the program to start.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::JailError;

/// The shared libraries `program` loads, and its ELF interpreter, as `ldd`
/// reports them (absolute paths, symlinks as named). Empty for a static
/// binary.
///
/// # Errors
/// When `ldd` cannot be run or fails for a dynamic binary.
pub fn library_deps(program: &Path) -> Result<Vec<PathBuf>, JailError> {
    let out = Command::new("ldd")
        .arg(program)
        .env_clear()
        .output()
        .map_err(|e| JailError::Helper {
            path: PathBuf::from("ldd"),
            source: e,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        if text.contains("not a dynamic executable")
            || String::from_utf8_lossy(&out.stderr).contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        return Err(JailError::InvalidSpec(format!(
            "ldd {} failed: {}",
            program.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let mut deps = Vec::new();
    for line in text.lines() {
        // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; vdso lines have no path.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            let p = PathBuf::from(p);
            if !deps.contains(&p) {
                deps.push(p);
            }
        }
    }
    Ok(deps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_deps_of_a_dynamic_and_a_static_binary() {
        let deps = library_deps(Path::new("/bin/sh")).unwrap();
        assert!(
            deps.iter().any(|p| p.to_string_lossy().contains("libc.so")),
            "{deps:?}"
        );
        if Path::new("/bin/busybox").exists() {
            assert!(library_deps(Path::new("/bin/busybox")).unwrap().is_empty());
        }
    }
}
