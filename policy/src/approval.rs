//! `unlisted:` and `approval:`: whether a name no rule lists is denied (the
//! default) or asked about at run time, and how.
//!
//! Only a plain allowlist miss may ask ([`CompiledPolicy::would_ask`]): a
//! name under `deny:`, a name that is itself a public suffix or a single
//! label (approving it would be approving a wildcard), an IP literal, and a
//! name that does not normalise never reach a backend. Addresses are checked
//! after any approval exactly as for listed names, so an approval can never
//! open a platform, metadata or private destination.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use serde_saphyr::Spanned;

use crate::compile::{CompiledPolicy, Compiler, TLS_PORT};
use crate::model::{RawApproval, RawApprovalBackend};
use crate::reason::Reason;

/// The default `approval.timeout`.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(30);
/// The default `approval.max_pending`.
pub const DEFAULT_MAX_PENDING: usize = 8;
/// The default `approval.per_minute`.
pub const DEFAULT_PER_MINUTE: usize = 20;

/// What happens to a name no rule lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unlisted {
    /// Denied (`not_allowlisted`), as a static allowlist does.
    #[default]
    Deny,
    /// Asked about through the `approval:` backend.
    Ask,
}

impl Unlisted {
    /// Whether this is the default, [`Unlisted::Deny`].
    #[must_use]
    pub fn is_deny(&self) -> bool {
        *self == Self::Deny
    }
}

/// Who answers approval questions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalBackend {
    /// The terminal of `sluice run --ask` (the launcher hands the gateway a
    /// socket; a gateway started otherwise refuses to start).
    Terminal,
    /// One JSON line each way over the unix socket at this path.
    Unix(PathBuf),
    /// A POST of the question to this URL.
    Webhook {
        /// `http://` or `https://` URL.
        url: String,
        /// A file holding a bearer token.
        bearer_token_file: Option<PathBuf>,
        /// PEM client certificate chain (mutual TLS).
        client_cert: Option<PathBuf>,
        /// PEM client key (mutual TLS).
        client_key: Option<PathBuf>,
        /// PEM CA certificates for the server, instead of the web roots.
        ca: Option<PathBuf>,
    },
}

/// The compiled `approval:` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApprovalSpec {
    /// Who answers.
    pub backend: ApprovalBackend,
    /// How long an answer may take before it is deny (1..=600 s).
    pub timeout: Duration,
    /// Whether an `allow_always` answer is honoured (it writes the overlay
    /// file); otherwise it counts as allow for this sandbox.
    pub always: bool,
    /// TCP ports an approval opens (default `[443]`).
    pub tcp_ports: Vec<u16>,
    /// UDP ports an approval opens (default none).
    pub udp_ports: Vec<u16>,
    /// Questions pending at once (1..=256).
    pub max_pending: usize,
    /// New questions per sliding minute (1..=600).
    pub per_minute: usize,
}

impl Compiler<'_> {
    /// Compiles `unlisted:` and `approval:` (either may be absent).
    pub(crate) fn approval(
        &mut self,
        unlisted: Option<&Spanned<String>>,
        approval: Option<&Spanned<RawApproval>>,
    ) -> (Unlisted, Option<ApprovalSpec>) {
        let mode = match unlisted.map(|u| (u.value.as_str(), u.referenced)) {
            None | Some(("deny", _)) => Unlisted::Deny,
            Some(("ask", _)) => Unlisted::Ask,
            Some((other, at)) => {
                self.err(
                    at,
                    format!(
                        "`unlisted: {other}` is not known; write `deny` (the default) or `ask`"
                    ),
                );
                Unlisted::Deny
            }
        };
        let Some(raw) = approval else {
            if mode == Unlisted::Ask
                && let Some(u) = unlisted
            {
                self.err(
                    u.referenced,
                    "`unlisted: ask` needs an `approval:` section naming a backend (`terminal`, `unix: PATH` or `webhook: {url: ...}`)",
                );
            }
            return (mode, None);
        };
        let a = &raw.value;
        let backend = match &a.backend.value {
            RawApprovalBackend::Terminal => ApprovalBackend::Terminal,
            RawApprovalBackend::Unix(path) => {
                if !path.starts_with('/') {
                    self.err(
                        a.backend.referenced,
                        format!("approval unix socket `{path}` must be an absolute path"),
                    );
                }
                ApprovalBackend::Unix(PathBuf::from(path))
            }
            RawApprovalBackend::Webhook(w) => {
                let scheme_ok = w.url.starts_with("https://") || w.url.starts_with("http://");
                if !scheme_ok {
                    self.err(
                        a.backend.referenced,
                        format!(
                            "approval webhook url `{}` must start with https:// or http://",
                            w.url
                        ),
                    );
                }
                let tls_only = w.client_cert.is_some() || w.client_key.is_some() || w.ca.is_some();
                if tls_only && !w.url.starts_with("https://") {
                    self.err(a.backend.referenced, "approval webhook `client_cert`, `client_key` and `ca` need an https:// url");
                }
                if w.client_cert.is_some() != w.client_key.is_some() {
                    self.err(
                        a.backend.referenced,
                        "approval webhook `client_cert` and `client_key` go together",
                    );
                }
                for (key, file) in [
                    ("bearer_token_file", &w.bearer_token_file),
                    ("client_cert", &w.client_cert),
                    ("client_key", &w.client_key),
                    ("ca", &w.ca),
                ] {
                    if let Some(f) = file
                        && !f.starts_with('/')
                    {
                        self.err(
                            a.backend.referenced,
                            format!("approval webhook `{key}` `{f}` must be an absolute path"),
                        );
                    }
                }
                ApprovalBackend::Webhook {
                    url: w.url.clone(),
                    bearer_token_file: w.bearer_token_file.as_ref().map(PathBuf::from),
                    client_cert: w.client_cert.as_ref().map(PathBuf::from),
                    client_key: w.client_key.as_ref().map(PathBuf::from),
                    ca: w.ca.as_ref().map(PathBuf::from),
                }
            }
        };
        let timeout = match &a.timeout {
            Some(t) => Duration::from_secs(self.bounded(t, 1, 600, "approval timeout (seconds)")),
            None => DEFAULT_APPROVAL_TIMEOUT,
        };
        let max_pending = match &a.max_pending {
            Some(n) => {
                usize::try_from(self.bounded(n, 1, 256, "approval max_pending")).unwrap_or(1)
            }
            None => DEFAULT_MAX_PENDING,
        };
        let per_minute = match &a.per_minute {
            Some(n) => usize::try_from(self.bounded(n, 1, 600, "approval per_minute")).unwrap_or(1),
            None => DEFAULT_PER_MINUTE,
        };
        let tcp_ports = match &a.ports {
            Some(p) => self.ports(p),
            None => vec![TLS_PORT],
        };
        let udp_ports = a
            .udp_ports
            .as_ref()
            .map(|p| self.ports(p))
            .unwrap_or_default();
        if tcp_ports.is_empty() && udp_ports.is_empty() {
            self.err(
                raw.referenced,
                "an approval that opens no port would open nothing; name `ports` or `udp_ports`",
            );
        }
        (
            mode,
            Some(ApprovalSpec {
                backend,
                timeout,
                always: a.always.unwrap_or(false),
                tcp_ports,
                udp_ports,
                max_pending,
                per_minute,
            }),
        )
    }

    fn bounded(&mut self, v: &Spanned<i64>, lo: i64, hi: i64, what: &str) -> u64 {
        if v.value < lo || v.value > hi {
            self.err(
                v.referenced,
                format!("{what} {} is out of range; use {lo}..={hi}", v.value),
            );
        }
        u64::try_from(v.value.clamp(lo, hi)).unwrap_or(1)
    }
}

impl CompiledPolicy {
    /// Whether a DNS query for `name` would be asked about (`unlisted: ask`
    /// and a plain allowlist miss on an exact, registrable name) rather
    /// than denied or allowed by a rule.
    #[must_use]
    pub fn would_ask(&self, name: &str) -> bool {
        if self.unlisted() != Unlisted::Ask || self.approval().is_none() {
            return false;
        }
        if name.parse::<std::net::IpAddr>().is_ok() {
            return false;
        }
        let Ok(normal) = crate::name::normalize_name(name) else {
            return false;
        };
        let normal = normal.as_str();
        // A single label, or a name that is itself a public suffix, would
        // open a whole namespace: never asked.
        if !normal.contains('.') || psl::domain(normal.as_bytes()).is_none() {
            return false;
        }
        self.check_name(normal).reason == Reason::NotAllowlisted
    }
}

#[cfg(test)]
mod tests {
    use crate::{CompileOptions, from_yaml_str};

    use super::*;

    fn compile(yaml: &str) -> Result<CompiledPolicy, String> {
        from_yaml_str(yaml, "t.yaml", &CompileOptions::default()).map_err(|e| e.to_string())
    }

    const ASK: &str = "version: 1\nid: t\nunlisted: ask\napproval:\n  backend: terminal\nallow:\n  - domain: listed.example.com\ndeny:\n  - blocked.example.com\n";

    #[test]
    fn defaults_and_would_ask() {
        let p = compile(ASK).unwrap();
        assert_eq!(p.unlisted(), Unlisted::Ask);
        let spec = p.approval().unwrap();
        assert_eq!(spec.backend, ApprovalBackend::Terminal);
        assert_eq!(spec.timeout, DEFAULT_APPROVAL_TIMEOUT);
        assert_eq!(spec.tcp_ports, vec![443]);
        assert!(spec.udp_ports.is_empty());
        assert!(!spec.always);
        assert!(p.would_ask("new.example.org"));
        assert!(p.would_ask("New.Example.ORG."));
        for never in [
            "listed.example.com",  // allowed by a rule
            "blocked.example.com", // denied by a rule
            "com",                 // a public suffix
            "co.uk",
            "github.io",
            "localhost", // a single label
            "203.0.113.7",
            "bad..name",
        ] {
            assert!(!p.would_ask(never), "{never}");
        }
    }

    #[test]
    fn deny_is_the_default_and_never_asks() {
        let p = compile("version: 1\nid: t\n").unwrap();
        assert_eq!(p.unlisted(), Unlisted::Deny);
        assert!(p.approval().is_none());
        assert!(!p.would_ask("new.example.org"));
        // A backend without `unlisted: ask` asks nothing either.
        let p = compile("version: 1\nid: t\napproval:\n  backend: terminal\n").unwrap();
        assert!(!p.would_ask("new.example.org"));
    }

    #[test]
    fn every_backend_and_key_compiles() {
        let p = compile(
            "version: 1\nid: t\nunlisted: ask\napproval:\n  backend:\n    webhook:\n      url: https://approve.example:8443/q\n      bearer_token_file: /etc/sluice/token\n      client_cert: /etc/sluice/c.pem\n      client_key: /etc/sluice/c.key\n      ca: /etc/sluice/ca.pem\n  timeout: 5\n  always: true\n  ports: [443, 8443]\n  udp_ports: [443]\n  max_pending: 3\n  per_minute: 9\n",
        )
        .unwrap();
        let s = p.approval().unwrap();
        assert!(
            matches!(&s.backend, ApprovalBackend::Webhook { url, .. } if url == "https://approve.example:8443/q")
        );
        assert_eq!((s.timeout, s.always), (Duration::from_secs(5), true));
        assert_eq!(
            (s.tcp_ports.clone(), s.udp_ports.clone()),
            (vec![443, 8443], vec![443])
        );
        assert_eq!((s.max_pending, s.per_minute), (3, 9));
        let p = compile(
            "version: 1\nid: t\nunlisted: ask\napproval:\n  backend:\n    unix: /run/ask.sock\n",
        )
        .unwrap();
        assert_eq!(
            p.approval().unwrap().backend,
            ApprovalBackend::Unix("/run/ask.sock".into())
        );
    }

    #[test]
    fn mistakes_are_errors_with_a_position() {
        for (yaml, needle) in [
            ("unlisted: maybe\n", "`unlisted: maybe` is not known"),
            ("unlisted: ask\n", "needs an `approval:` section"),
            ("approval:\n  backend: phone\n", "t.yaml:"),
            (
                "approval:\n  backend:\n    unix: relative.sock\n",
                "absolute path",
            ),
            (
                "approval:\n  backend:\n    webhook:\n      url: ftp://x\n",
                "https://",
            ),
            (
                "approval:\n  backend:\n    webhook:\n      url: http://x\n      ca: /ca.pem\n",
                "need an https://",
            ),
            (
                "approval:\n  backend:\n    webhook:\n      url: https://x\n      client_cert: /c.pem\n",
                "go together",
            ),
            (
                "approval:\n  backend: terminal\n  timeout: 0\n",
                "out of range",
            ),
            (
                "approval:\n  backend: terminal\n  max_pending: 1000\n",
                "out of range",
            ),
            (
                "approval:\n  backend: terminal\n  ports: []\n",
                "opens no port",
            ),
            (
                "approval:\n  backend: terminal\n  colour: blue\n",
                "t.yaml:",
            ),
        ] {
            let err = compile(&format!("version: 1\nid: t\n{yaml}")).unwrap_err();
            assert!(err.contains(needle), "{yaml:?}: {err}");
        }
    }

    #[test]
    fn a_policy_without_approval_keeps_its_hash() {
        // `unlisted: deny` is the default: it must not change the hash
        // (gateway `audit::tests::flow_close_lines_are_unchanged` pins one).
        let p = compile("version: 1\nid: t\nallow:\n  - domain: a.example.com\n").unwrap();
        let q = compile("version: 1\nid: t\nunlisted: deny\nallow:\n  - domain: a.example.com\n")
            .unwrap();
        assert_eq!(p.version_hash(), q.version_hash());
    }

    #[test]
    fn approval_settings_change_the_version_hash() {
        let a = compile(ASK).unwrap();
        let b =
            compile(&ASK.replace("backend: terminal", "backend: terminal\n  timeout: 9")).unwrap();
        let c = compile(&ASK.replace("unlisted: ask\n", "unlisted: deny\n")).unwrap();
        assert_ne!(a.version_hash(), b.version_hash());
        assert_ne!(a.version_hash(), c.version_hash());
    }
}
