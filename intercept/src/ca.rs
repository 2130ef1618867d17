//! The sandbox CA: one per gateway process, generated at start, never
//! written anywhere but its certificate.
//!
//! - ECDSA P-256, `CA:TRUE, pathLenConstraint 0`, key usage `keyCertSign`
//!   (critical) and `cRLSign`; valid from one hour before generation for
//!   [`CaOptions::validity`] (default [`DEFAULT_CA_VALIDITY`], 7 days: a
//!   sandbox that lives longer needs a gateway restart for a new CA).
//! - X.509 name constraints: permitted DNS subtrees are exactly the names the
//!   policy inspects ([`permitted_subtrees`]). A stolen CA key can therefore
//!   only sign for those names: any verifier that enforces name constraints
//!   (rustls-webpki, OpenSSL, BoringSSL, Go, NSS) refuses a leaf for anything
//!   else. A DNS subtree `x` also covers every name below `x` (RFC 5280
//!   4.2.1.10), so an exact policy name `api.x` permits `a.api.x` too;
//!   interception itself is still only done for names the policy inspects.
//! - The private key lives only in this process's memory.
//! - Leaves are minted per SNI on demand ([`SandboxCa::leaf`]): SAN = the SNI
//!   only, `serverAuth`, valid from one hour before minting (guest clock
//!   skew) for [`CaOptions::leaf_validity`] (default 24 h, never past the
//!   CA's own end), each with a fresh P-256 key. They are cached per SNI and
//!   re-minted once less than [`CaOptions::renew_before`] of their validity
//!   is left. The cache holds at most [`MAX_CACHED_LEAVES`] names; when full,
//!   expired entries are dropped, then the whole cache (leaves are cheap to
//!   mint again).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
    PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use sluice_policy::{DomainPattern, PatternKind};
use thiserror::Error;
use time::OffsetDateTime;

/// Default lifetime of the sandbox CA certificate.
pub const DEFAULT_CA_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default lifetime of a leaf certificate.
pub const DEFAULT_LEAF_VALIDITY: Duration = Duration::from_secs(24 * 3600);
/// Default: a cached leaf is re-minted when less than this is left.
pub const DEFAULT_RENEW_BEFORE: Duration = Duration::from_secs(3600);
/// Backdating of `notBefore` (CA and leaves) to tolerate guest clock skew.
pub const BACKDATE: Duration = Duration::from_secs(3600);
/// Leaves cached at once.
pub const MAX_CACHED_LEAVES: usize = 4096;

/// Why the CA or a leaf could not be made.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CaError {
    /// The policy inspects nothing: a CA without name constraints would be
    /// valid for every name, so none is made.
    #[error(
        "the policy inspects no host: no sandbox CA is needed (and none unconstrained is made)"
    )]
    NothingInspected,
    /// A leaf was asked for a name outside the CA's name constraints.
    #[error("{0}: outside the sandbox CA's name constraints")]
    OutsideConstraints(String),
    /// Certificate generation failed.
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    /// The generated key was refused by rustls.
    #[error("leaf key: {0}")]
    Key(rustls::Error),
    /// The CA certificate could not be written.
    #[error("writing the CA certificate to {path}: {source}")]
    Write {
        /// The path given with `--ca-out`.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// Lifetimes of the CA and its leaves.
#[derive(Debug, Clone, Copy)]
pub struct CaOptions {
    /// How long the CA certificate is valid (from generation).
    pub validity: Duration,
    /// How long each leaf is valid (from minting, capped by the CA's end).
    pub leaf_validity: Duration,
    /// A cached leaf with less validity left than this is re-minted.
    pub renew_before: Duration,
}

impl Default for CaOptions {
    fn default() -> Self {
        Self {
            validity: DEFAULT_CA_VALIDITY,
            leaf_validity: DEFAULT_LEAF_VALIDITY,
            renew_before: DEFAULT_RENEW_BEFORE,
        }
    }
}

/// The permitted DNS subtrees for a set of inspected patterns: `*.x` and
/// `**.x` give `x`, an exact name gives itself. Sorted; a name already covered
/// by another subtree (`a.x` under `x`) is left out.
pub fn permitted_subtrees(patterns: &[DomainPattern]) -> Vec<String> {
    let mut names: Vec<String> = patterns
        .iter()
        .map(|p| match p.kind {
            PatternKind::Exact | PatternKind::Subdomains | PatternKind::ApexAndSubdomains => {
                p.base.clone()
            }
        })
        .collect();
    names.sort();
    names.dedup();
    let covered =
        |n: &str, by: &str| n != by && n.ends_with(by) && n[..n.len() - by.len()].ends_with('.');
    let all = names.clone();
    names.retain(|n| !all.iter().any(|by| covered(n, by)));
    names
}

/// Whether `name` (lower case, no trailing dot) falls in one of `subtrees`.
fn within(subtrees: &[String], name: &str) -> bool {
    subtrees.iter().any(|s| {
        name == s
            || (name.len() > s.len()
                && name.ends_with(s.as_str())
                && name.as_bytes().get(name.len() - s.len() - 1) == Some(&b'.'))
    })
}

struct CachedLeaf {
    key: Arc<CertifiedKey>,
    renew_at: Instant,
}

/// The per-sandbox CA and its leaf cache.
pub struct SandboxCa {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    not_after: OffsetDateTime,
    subtrees: Vec<String>,
    options: CaOptions,
    leaves: Mutex<HashMap<String, CachedLeaf>>,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCa")
            .field("subtrees", &self.subtrees)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

fn to_time(d: Duration) -> time::Duration {
    time::Duration::try_from(d).unwrap_or(time::Duration::MAX)
}

impl SandboxCa {
    /// Generates a CA constrained to the hosts `patterns` name (normally
    /// [`sluice_policy::CompiledPolicy::inspected_patterns`]).
    pub fn generate(patterns: &[DomainPattern], options: CaOptions) -> Result<Self, CaError> {
        let subtrees = permitted_subtrees(patterns);
        if subtrees.is_empty() {
            return Err(CaError::NothingInspected);
        }
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.not_before = now - to_time(BACKDATE);
        params.not_after = now + to_time(options.validity);
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "sluice sandbox CA");
        dn.push(DnType::OrganizationName, "sluice");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: subtrees
                .iter()
                .map(|s| GeneralSubtree::DnsName(s.clone()))
                .collect(),
            excluded_subtrees: Vec::new(),
        });
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let cert = params.self_signed(&key)?;
        let not_after = params.not_after;
        Ok(Self {
            cert_der: cert.der().clone(),
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
            not_after,
            subtrees,
            options,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// The permitted DNS subtrees of the name constraints.
    pub fn subtrees(&self) -> &[String] {
        &self.subtrees
    }

    /// Writes the certificate PEM to `path` (mode 0644, replacing the file
    /// atomically via a temporary file in the same directory).
    pub fn write_pem(&self, path: &Path) -> Result<(), CaError> {
        let err = |source| CaError::Write {
            path: path.display().to_string(),
            source,
        };
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp);
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .open(&tmp)
                .map_err(err)?;
            f.write_all(self.cert_pem.as_bytes()).map_err(err)?;
            f.sync_all().map_err(err)?;
        }
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).map_err(err)?;
        }
        std::fs::rename(&tmp, path).map_err(err)
    }

    /// Whether `name` (normalised: lower case, no trailing dot) is inside the
    /// name constraints.
    pub fn permits(&self, name: &str) -> bool {
        within(&self.subtrees, name)
    }

    /// Whether every name `pattern` matches is inside the name constraints:
    /// its base is (a permitted subtree covers every name below it). A
    /// policy reloaded since the CA was made may inspect patterns it does not
    /// cover; flows to those names cannot be intercepted until restart.
    pub fn covers(&self, pattern: &DomainPattern) -> bool {
        self.permits(&pattern.base)
    }

    /// The leaf for `sni` (normalised), from the cache or freshly minted.
    pub fn leaf(&self, sni: &str) -> Result<Arc<CertifiedKey>, CaError> {
        if !self.permits(sni) {
            return Err(CaError::OutsideConstraints(sni.to_owned()));
        }
        let now = Instant::now();
        if let Ok(cache) = self.leaves.lock()
            && let Some(c) = cache.get(sni)
            && now < c.renew_at
        {
            return Ok(c.key.clone());
        }
        let (key, lifetime) = self.mint(sni)?;
        let renew_at = now + lifetime.saturating_sub(self.options.renew_before);
        if let Ok(mut cache) = self.leaves.lock() {
            if cache.len() >= MAX_CACHED_LEAVES {
                cache.retain(|_, c| now < c.renew_at);
                if cache.len() >= MAX_CACHED_LEAVES {
                    cache.clear();
                }
            }
            cache.insert(
                sni.to_owned(),
                CachedLeaf {
                    key: key.clone(),
                    renew_at,
                },
            );
        }
        Ok(key)
    }

    /// Signs a leaf for `name` with no constraint check; returns it and its
    /// lifetime from now.
    fn mint(&self, name: &str) -> Result<(Arc<CertifiedKey>, Duration), CaError> {
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::new(vec![name.to_owned()])?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.not_before = now - to_time(BACKDATE);
        let wanted = now + to_time(self.options.leaf_validity);
        params.not_after = wanted.min(self.not_after);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = rustls::crypto::ring::sign::any_ecdsa_type(&der).map_err(CaError::Key)?;
        let lifetime = Duration::try_from(params.not_after - now).unwrap_or(Duration::ZERO);
        Ok((
            Arc::new(CertifiedKey::new(vec![cert.der().clone()], signer)),
            lifetime,
        ))
    }

    /// Test hook: a leaf for any name, bypassing the constraint check (to
    /// prove verifiers enforce the constraints).
    #[cfg(test)]
    pub(crate) fn mint_unchecked(&self, name: &str) -> Arc<CertifiedKey> {
        self.mint(name).unwrap().0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::RootCertStore;
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{ServerName, UnixTime};

    fn pat(kind: PatternKind, base: &str) -> DomainPattern {
        DomainPattern {
            kind,
            base: base.to_owned(),
        }
    }

    fn ca() -> SandboxCa {
        SandboxCa::generate(
            &[
                pat(PatternKind::Exact, "api.openai.com"),
                pat(PatternKind::Subdomains, "example.org"),
                pat(PatternKind::Exact, "a.example.org"),
            ],
            CaOptions::default(),
        )
        .unwrap()
    }

    fn verify(ca: &SandboxCa, leaf: &CertifiedKey, name: &str) -> Result<(), rustls::Error> {
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        let server_name = ServerName::try_from(name.to_owned()).unwrap();
        verifier
            .verify_server_cert(&leaf.cert[0], &[], &server_name, &[], UnixTime::now())
            .map(|_| ())
    }

    #[test]
    fn subtrees_come_from_patterns_and_drop_covered_names() {
        assert_eq!(ca().subtrees(), ["api.openai.com", "example.org"]);
        assert!(matches!(
            SandboxCa::generate(&[], CaOptions::default()),
            Err(CaError::NothingInspected)
        ));
    }

    #[test]
    fn covers_patterns_whose_base_is_in_a_subtree() {
        let ca = ca();
        assert!(ca.covers(&pat(PatternKind::Exact, "api.openai.com")));
        assert!(ca.covers(&pat(PatternKind::Exact, "deep.x.example.org")));
        assert!(ca.covers(&pat(PatternKind::ApexAndSubdomains, "example.org")));
        assert!(ca.covers(&pat(PatternKind::Subdomains, "a.example.org")));
        // Under an exact name: a DNS subtree covers its subdomains too.
        assert!(ca.covers(&pat(PatternKind::Subdomains, "api.openai.com")));
        assert!(!ca.covers(&pat(PatternKind::Exact, "openai.com")));
        assert!(!ca.covers(&pat(PatternKind::Subdomains, "openai.com")));
        assert!(!ca.covers(&pat(PatternKind::Exact, "evil.test")));
        assert!(!ca.covers(&pat(PatternKind::Exact, "notexample.org")));
    }

    #[test]
    fn leaf_for_inspected_host_verifies_with_webpki() {
        let ca = ca();
        for name in ["api.openai.com", "x.example.org", "example.org"] {
            let leaf = ca.leaf(name).unwrap();
            verify(&ca, &leaf, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        // The leaf is not valid for another name, even an inspected one.
        let leaf = ca.leaf("api.openai.com").unwrap();
        assert!(verify(&ca, &leaf, "x.example.org").is_err());
    }

    #[test]
    fn leaf_outside_constraints_is_refused_by_webpki_and_never_minted() {
        let ca = ca();
        assert!(matches!(
            ca.leaf("evil.test"),
            Err(CaError::OutsideConstraints(_))
        ));
        assert!(matches!(
            ca.leaf("openai.com"),
            Err(CaError::OutsideConstraints(_))
        ));
        // Even if the key signs one (a stolen key), webpki refuses it.
        for name in ["evil.test", "openai.com", "notexample.org"] {
            let forged = ca.mint_unchecked(name);
            let err = verify(&ca, &forged, name).unwrap_err();
            assert!(
                format!("{err:?}").contains("NameConstraint"),
                "{name}: {err:?}"
            );
        }
    }

    #[test]
    fn leaves_are_cached_and_renewed_before_expiry() {
        let ca = ca();
        let a = ca.leaf("api.openai.com").unwrap();
        let b = ca.leaf("api.openai.com").unwrap();
        assert!(
            Arc::ptr_eq(&a, &b),
            "second lookup is served from the cache"
        );
        // With renew_before >= the leaf lifetime, every lookup re-mints.
        let eager = SandboxCa::generate(
            &[pat(PatternKind::Exact, "api.openai.com")],
            CaOptions {
                leaf_validity: Duration::from_secs(60),
                renew_before: Duration::from_secs(120),
                ..CaOptions::default()
            },
        )
        .unwrap();
        let a = eager.leaf("api.openai.com").unwrap();
        let b = eager.leaf("api.openai.com").unwrap();
        assert!(!Arc::ptr_eq(&a, &b), "a leaf due for renewal is re-minted");
        verify(&eager, &b, "api.openai.com").unwrap();
    }

    /// The guest's curl uses OpenSSL: it must enforce the constraints too.
    #[test]
    fn openssl_refuses_a_leaf_outside_the_constraints() {
        use std::process::Command;
        let ca = ca();
        let dir = std::env::temp_dir().join(format!("mi-ossl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        ca.write_pem(&dir.join("ca.pem")).unwrap();
        let verify = |name: &str, leaf: &CertifiedKey| {
            let der = dir.join(format!("{name}.der"));
            let pem = dir.join(format!("{name}.pem"));
            std::fs::write(&der, leaf.cert[0].as_ref()).unwrap();
            let conv = Command::new("openssl")
                .args(["x509", "-inform", "DER", "-in"])
                .arg(&der)
                .arg("-out")
                .arg(&pem)
                .status()
                .unwrap();
            assert!(conv.success());
            let out = Command::new("openssl")
                .arg("verify")
                .arg("-CAfile")
                .arg(dir.join("ca.pem"))
                .arg(&pem)
                .output()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr),
            )
        };
        let (ok, text) = verify("good", &ca.leaf("api.openai.com").unwrap());
        assert!(ok, "{text}");
        let (ok, text) = verify("forged", &ca.mint_unchecked("evil.test"));
        assert!(!ok, "{text}");
        assert!(text.contains("permitted subtree violation"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pem_is_written_world_readable() {
        use std::os::unix::fs::PermissionsExt as _;
        let ca = ca();
        let dir = std::env::temp_dir().join(format!("mi-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ca.pem");
        ca.write_pem(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!text.contains("PRIVATE"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
