//! The secret store: real values read from the sources the policy names.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_policy::{CompiledPolicy, SecretLocations, SecretSource, normalize_name};
use zeroize::Zeroizing;

use crate::host::HostSubstituter;
use crate::matcher::{SecretBytes, Table, secret_bytes};
use crate::scan::{PlaceholderScanner, ScanSet, Seen};

/// The largest secret file read (64 KiB): credentials are small, and a
/// mistaken path such as `/dev/zero` must not exhaust memory.
pub const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// Why a secret's value could not be loaded. Messages name the secret and
/// its source, never the value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The environment variable is not set.
    #[error("secret `{secret}`: environment variable `{var}` is not set")]
    EnvMissing {
        /// The secret's name.
        secret: String,
        /// The variable's name.
        var: String,
    },
    /// The file could not be opened or read.
    #[error("secret `{secret}`: cannot read file {}: {error}", path.display())]
    File {
        /// The secret's name.
        secret: String,
        /// The file.
        path: PathBuf,
        /// The I/O error (it carries no file content).
        error: io::Error,
    },
    /// The file is larger than [`MAX_SECRET_FILE_BYTES`].
    #[error("secret `{secret}`: file {} is larger than {MAX_SECRET_FILE_BYTES} bytes", path.display())]
    FileTooLarge {
        /// The secret's name.
        secret: String,
        /// The file.
        path: PathBuf,
    },
    /// The value is empty (after removing one trailing newline from a file).
    #[error("secret `{secret}`: the value from {source_desc} is empty")]
    Empty {
        /// The secret's name.
        secret: String,
        /// `environment variable X` or `file /path`.
        source_desc: String,
    },
    /// The value may go into headers but contains a byte no HTTP header value
    /// may hold (a control character such as CR, LF or NUL, or DEL).
    #[error(
        "secret `{secret}`: the value from {source_desc} contains a control character that cannot go into an HTTP header; fix the value or remove `headers` from the secret's locations"
    )]
    NotHeaderSafe {
        /// The secret's name.
        secret: String,
        /// `environment variable X` or `file /path`.
        source_desc: String,
    },
}

/// One loaded secret.
pub(crate) struct Secret {
    pub(crate) name: Arc<str>,
    pub(crate) placeholder: SecretBytes,
    pub(crate) value: SecretBytes,
    pub(crate) locations: SecretLocations,
    /// The policy opted it in to WebSocket upgrades (`websocket: true`).
    pub(crate) websocket: bool,
}

/// The real values of every secret in a policy, read once at load.
///
/// Values live only in zeroising buffers (`zeroize::Zeroizing`), shared by
/// the substituters built from this store; they are wiped when the store and
/// every substituter and stream replacer made from it are dropped. `Debug`
/// prints the names only; no error or method returns a value.
///
/// Rotation: call [`SecretStore::load`] again (on policy reload, or when the
/// operator rotates a value) and swap the new store in; a request keeps
/// the substituter it started with.
pub struct SecretStore {
    secrets: Arc<[Secret]>,
    /// Every placeholder, pattern index = secret index, replaced by itself
    /// (used for detection only).
    placeholders: Arc<Table>,
    /// Every placeholder, for [`SecretStore::placeholder_scanner`].
    scan_all: Arc<ScanSet>,
    /// A ready substituter per bound host (normalised name).
    hosts: HashMap<String, HostSubstituter>,
    /// The substituter for every other host: substitutes nothing, detects.
    unbound: HostSubstituter,
}

impl SecretStore {
    /// Read every secret of `policy` from its source (environment variable
    /// or file) now.
    ///
    /// A file's content is taken without one trailing newline (`\n` or
    /// `\r\n`); an environment variable's as is.
    ///
    /// # Errors
    ///
    /// The first secret that cannot be read: variable unset, file
    /// unreadable or over [`MAX_SECRET_FILE_BYTES`], empty value, or a value
    /// allowed in headers that holds a control character.
    pub fn load(policy: &CompiledPolicy) -> Result<Self, SecretError> {
        Self::load_with(policy, |var| {
            std::env::var_os(var).map(|v| Zeroizing::new(v.as_bytes().to_vec()))
        })
    }

    /// [`SecretStore::load`] with environment lookups answered by `env`
    /// instead of the process environment (tests, and callers that keep
    /// their own environment).
    ///
    /// # Errors
    ///
    /// As [`SecretStore::load`].
    pub fn load_with(
        policy: &CompiledPolicy,
        mut env: impl FnMut(&str) -> Option<Zeroizing<Vec<u8>>>,
    ) -> Result<Self, SecretError> {
        let mut secrets = Vec::with_capacity(policy.secrets().len());
        let mut bound: HashMap<String, Vec<usize>> = HashMap::new();
        for (idx, spec) in policy.secrets().iter().enumerate() {
            let secret = spec.name.clone();
            let (value, source_desc) = match &spec.source {
                SecretSource::Env(var) => match env(var) {
                    Some(v) => (v, format!("environment variable `{var}`")),
                    None => {
                        return Err(SecretError::EnvMissing {
                            secret,
                            var: var.clone(),
                        });
                    }
                },
                SecretSource::File(path) => (
                    read_file(&secret, path)?,
                    format!("file {}", path.display()),
                ),
            };
            if value.is_empty() {
                return Err(SecretError::Empty {
                    secret,
                    source_desc,
                });
            }
            if spec.locations.headers && !header_safe(&value) {
                return Err(SecretError::NotHeaderSafe {
                    secret,
                    source_desc,
                });
            }
            for host in &spec.hosts {
                bound.entry(host.clone()).or_default().push(idx);
            }
            secrets.push(Secret {
                name: Arc::from(spec.name.as_str()),
                placeholder: secret_bytes(spec.placeholder.as_bytes()),
                value: Arc::new(value),
                locations: spec.locations,
                websocket: spec.websocket,
            });
        }
        let secrets: Arc<[Secret]> = secrets.into();
        let placeholders = Arc::new(Table::new(
            secrets
                .iter()
                .map(|s| {
                    (
                        Arc::clone(&s.placeholder),
                        Arc::clone(&s.placeholder),
                        Arc::clone(&s.name),
                    )
                })
                .collect(),
        ));
        let hosts = bound
            .into_iter()
            .map(|(host, ids)| {
                let sub = HostSubstituter::new(
                    host.clone(),
                    Arc::clone(&secrets),
                    Arc::clone(&placeholders),
                    &ids,
                );
                (host, sub)
            })
            .collect();
        let unbound = HostSubstituter::new(
            String::new(),
            Arc::clone(&secrets),
            Arc::clone(&placeholders),
            &[],
        );
        let scan_all = Arc::new(ScanSet::new(secrets.iter().map(|s| {
            (
                s.placeholder.as_slice(),
                Arc::clone(&s.name),
                Seen::Mismatched,
            )
        })));
        Ok(Self {
            secrets,
            placeholders,
            scan_all,
            hosts,
            unbound,
        })
    }

    /// The secrets' names, in policy order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.secrets.iter().map(|s| &*s.name)
    }

    /// The number of secrets.
    #[must_use]
    pub fn len(&self) -> usize {
        self.secrets.len()
    }

    /// Whether the policy declares no secret.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// The substituter for one inspected connection to `host`: the verified
    /// SNI (normalised here: case, trailing dot, IDN). A host with no secret
    /// bound gets a substituter that replaces nothing but still reports the
    /// placeholders it sees ([`crate::Substitutions::mismatched`]). Cheap: an
    /// `Arc` clone.
    #[must_use]
    pub fn for_host(&self, host: &str) -> HostSubstituter {
        let sub = normalize_name(host)
            .ok()
            .and_then(|n| self.hosts.get(n.as_str()));
        sub.unwrap_or(&self.unbound).clone()
    }

    /// Streaming detection of every placeholder (all reported as
    /// [`PlaceholderScanner::mismatched`]): for bodies that are never
    /// substituted, such as plain HTTP.
    #[must_use]
    pub fn placeholder_scanner(&self) -> PlaceholderScanner {
        PlaceholderScanner::new(Arc::clone(&self.scan_all))
    }

    /// The names of the secrets whose placeholder occurs in `bytes`, in
    /// policy order: for logging placeholders sent where they are never
    /// substituted (plain HTTP, hosts that are not inspected).
    #[must_use]
    pub fn placeholders_in(&self, bytes: &[u8]) -> Vec<&str> {
        self.placeholders
            .occurrences(bytes)
            .into_iter()
            .zip(self.secrets.iter())
            .filter_map(|(seen, s)| seen.then_some(&*s.name))
            .collect()
    }
}

impl fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut hosts: Vec<&str> = self.hosts.keys().map(String::as_str).collect();
        hosts.sort_unstable();
        f.debug_struct("SecretStore")
            .field("names", &self.names().collect::<Vec<_>>())
            .field("hosts", &hosts)
            .finish()
    }
}

/// Read a secret file (bounded), without one trailing `\n` or `\r\n`.
fn read_file(secret: &str, path: &Path) -> Result<Zeroizing<Vec<u8>>, SecretError> {
    let file_err = |error| SecretError::File {
        secret: secret.to_owned(),
        path: path.to_owned(),
        error,
    };
    let file = File::open(path).map_err(file_err)?;
    // Sized up front so the read never reallocates (a reallocation would
    // free an unzeroised copy); one spare byte detects an oversized file.
    let cap = usize::try_from(MAX_SECRET_FILE_BYTES + 1).unwrap_or(usize::MAX);
    let mut buf = Zeroizing::new(Vec::with_capacity(cap));
    file.take(MAX_SECRET_FILE_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(file_err)?;
    if buf.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(SecretError::FileTooLarge {
            secret: secret.to_owned(),
            path: path.to_owned(),
        });
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    // Shrink into an exact-size zeroising buffer; the large one is wiped.
    Ok(Zeroizing::new(buf.to_vec()))
}

/// Whether `value` may appear in an HTTP header value: visible ASCII,
/// space, tab and bytes >= 0x80 (what `http::HeaderValue` accepts).
fn header_safe(value: &[u8]) -> bool {
    value
        .iter()
        .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    /// A policy with three secrets: `hdr` (headers, api.example.com),
    /// `qry` (headers + query, api.example.com), `bdy` (body only,
    /// upload.example.com), and two plain allowed hosts.
    pub(crate) const POLICY: &str = "\
version: 1
id: t
allow:
  - domains: [api.example.com, upload.example.com, other.example.com]
secrets:
  - name: hdr
    placeholder: PH-header-secret
    env: SB_HDR
    hosts: [api.example.com]
  - name: qry
    placeholder: PH-query-secret
    env: SB_QRY
    hosts: [api.example.com]
    locations: [headers, query]
  - name: bdy
    placeholder: PH-body-secret
    env: SB_BDY
    hosts: [upload.example.com]
    locations: [body]
";

    pub(crate) fn policy(yaml: &str) -> CompiledPolicy {
        sluice_policy::from_yaml_str(yaml, "t.yaml", &Default::default()).unwrap()
    }

    pub(crate) fn env(var: &str) -> Option<Zeroizing<Vec<u8>>> {
        let v: &[u8] = match var {
            "SB_HDR" => b"real-header-value",
            "SB_QRY" => b"real/query+value=",
            "SB_BDY" => b"real-body-value",
            _ => return None,
        };
        Some(Zeroizing::new(v.to_vec()))
    }

    pub(crate) fn store() -> SecretStore {
        SecretStore::load_with(&policy(POLICY), env).unwrap()
    }

    fn one_secret(source: &str, locations: &str) -> CompiledPolicy {
        policy(&format!(
            "version: 1\nid: t\nallow:\n  - domain: api.example.com\nsecrets:\n  - name: s1\n    placeholder: PH-s1-placeholder\n    {source}\n    hosts: [api.example.com]\n{locations}"
        ))
    }

    #[test]
    fn loads_names_and_hosts() {
        let s = store();
        assert_eq!(s.names().collect::<Vec<_>>(), ["hdr", "qry", "bdy"]);
        assert_eq!(s.len(), 3);
        assert!(!s.is_empty());
        assert!(!s.for_host("api.example.com").is_empty());
        assert!(!s.for_host("API.Example.COM.").is_empty());
        assert!(s.for_host("other.example.com").is_empty());
        assert!(s.for_host("not a host name").is_empty());
        assert_eq!(
            s.for_host("upload.example.com")
                .bound_names()
                .collect::<Vec<_>>(),
            ["bdy"]
        );
    }

    #[test]
    fn websocket_is_refused_by_every_bound_secret_not_opted_in() {
        let refused = |s: &SecretStore, host: &str| -> Vec<String> {
            s.for_host(host)
                .websocket_refused_by()
                .map(str::to_owned)
                .collect()
        };
        let s = store();
        assert_eq!(refused(&s, "api.example.com"), ["hdr", "qry"]);
        assert_eq!(refused(&s, "upload.example.com"), ["bdy"]);
        assert!(refused(&s, "other.example.com").is_empty());

        let opted = POLICY.replace(
            "    env: SB_HDR\n",
            "    env: SB_HDR\n    websocket: true\n",
        );
        let s = SecretStore::load_with(&policy(&opted), env).unwrap();
        assert_eq!(refused(&s, "api.example.com"), ["qry"]);
        let both = opted.replace(
            "    env: SB_QRY\n",
            "    env: SB_QRY\n    websocket: true\n",
        );
        let s = SecretStore::load_with(&policy(&both), env).unwrap();
        assert!(refused(&s, "api.example.com").is_empty());
        assert_eq!(refused(&s, "upload.example.com"), ["bdy"]);
    }

    #[test]
    fn debug_prints_names_never_values_or_placeholders() {
        let s = store();
        let text = format!(
            "{s:?} {:?} {:?}",
            s.for_host("api.example.com"),
            s.for_host("x.org")
        );
        assert!(
            text.contains("hdr") && text.contains("qry") && text.contains("bdy"),
            "{text}"
        );
        assert!(!text.contains("real-"), "{text}");
        assert!(!text.contains("PH-"), "{text}");
    }

    #[test]
    fn missing_env_names_secret_and_variable() {
        let err = SecretStore::load_with(&one_secret("env: SB_NOPE", ""), env).unwrap_err();
        assert_eq!(
            err.to_string(),
            "secret `s1`: environment variable `SB_NOPE` is not set"
        );
    }

    #[test]
    fn load_reads_the_process_environment() {
        // A variable name only this test uses.
        let p = one_secret("env: SB_STORE_TEST_PROCESS_ENV", "");
        assert!(matches!(
            SecretStore::load(&p),
            Err(SecretError::EnvMissing { .. })
        ));
    }

    #[test]
    fn file_source_strips_one_trailing_newline() {
        let dir = std::env::temp_dir().join(format!("sb-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        let mut f = File::create(&path).unwrap();
        f.write_all(b"file-value\r\n").unwrap();
        drop(f);
        let p = one_secret(&format!("file: {}", path.display()), "");
        let s = SecretStore::load_with(&p, |_| None).unwrap();
        let sub = s.for_host("api.example.com");
        let (mut parts, ()) = http::Request::builder()
            .header("x-key", "PH-s1-placeholder")
            .body(())
            .unwrap()
            .into_parts();
        sub.request_head(&mut parts).unwrap();
        assert_eq!(parts.headers["x-key"], "file-value");

        // Only one newline goes.
        std::fs::write(&path, b"v\n\n").unwrap();
        let err = SecretStore::load_with(&p, |_| None).unwrap_err();
        assert!(matches!(err, SecretError::NotHeaderSafe { .. }), "{err}");

        std::fs::write(&path, b"\n").unwrap();
        let err = SecretStore::load_with(&p, |_| None).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "secret `s1`: the value from file {} is empty",
                path.display()
            )
        );

        std::fs::write(&path, vec![b'a'; 64 * 1024 + 1]).unwrap();
        let err = SecretStore::load_with(&p, |_| None).unwrap_err();
        assert!(matches!(err, SecretError::FileTooLarge { .. }), "{err}");
        std::fs::write(&path, vec![b'a'; 64 * 1024]).unwrap();
        assert!(SecretStore::load_with(&p, |_| None).is_ok());

        std::fs::remove_dir_all(&dir).unwrap();
        let err = SecretStore::load_with(&p, |_| None).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!(
                "secret `s1`: cannot read file {}: ",
                path.display()
            )),
            "{msg}"
        );
    }

    #[test]
    fn control_characters_only_rejected_when_headers_allowed() {
        let crlf = |_: &str| Some(Zeroizing::new(b"multi\r\nline".to_vec()));
        let err = SecretStore::load_with(&one_secret("env: SB_X", ""), crlf).unwrap_err();
        assert_eq!(
            err.to_string(),
            "secret `s1`: the value from environment variable `SB_X` contains a control character that cannot go into an HTTP header; fix the value or remove `headers` from the secret's locations"
        );
        let body_only = one_secret("env: SB_X", "    locations: [body]\n");
        assert!(SecretStore::load_with(&body_only, crlf).is_ok());
        let empty = |_: &str| Some(Zeroizing::new(Vec::new()));
        assert!(matches!(
            SecretStore::load_with(&body_only, empty),
            Err(SecretError::Empty { .. })
        ));
    }

    #[test]
    fn placeholders_in_reports_names_in_policy_order() {
        let s = store();
        assert_eq!(
            s.placeholders_in(b"GET /?k=PH-body-secret HTTP/1.1\r\nx: PH-header-secret\r\n"),
            ["hdr", "bdy"]
        );
        assert!(s.placeholders_in(b"PH-header-secre").is_empty());
        assert!(s.placeholders_in(b"").is_empty());
    }

    #[test]
    fn reload_picks_up_rotated_values() {
        let p = one_secret("env: SB_ROT", "");
        let load = |v: &'static [u8]| {
            SecretStore::load_with(&p, move |_| Some(Zeroizing::new(v.to_vec()))).unwrap()
        };
        let head = |s: &SecretStore| {
            let (mut parts, ()) = http::Request::builder()
                .header("x-key", "PH-s1-placeholder")
                .body(())
                .unwrap()
                .into_parts();
            s.for_host("api.example.com")
                .request_head(&mut parts)
                .unwrap();
            parts.headers["x-key"].clone()
        };
        let old = load(b"old-value");
        let old_sub = old.for_host("api.example.com");
        let new = load(b"new-value");
        assert_eq!(head(&old), "old-value");
        assert_eq!(head(&new), "new-value");
        // A connection keeps the substituter it started with.
        drop(old);
        assert_eq!(old_sub.bound_names().collect::<Vec<_>>(), ["s1"]);
    }
}
