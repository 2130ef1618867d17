//! Substitution for one inspected connection: request heads and bodies
//! (placeholder -> value) and reflection scrubbing of responses
//! (value -> placeholder).

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use http::header::{ACCEPT_ENCODING, AUTHORIZATION};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use sluice_policy::audit::{SecretLocation, SecretUse};
use zeroize::Zeroizing;

use crate::matcher::{SecretBytes, Table, replace_all};
use crate::scan::{PlaceholderScanner, ScanSet, Seen};
use crate::store::Secret;
use crate::stream::StreamReplacer;

/// A request head could not be rewritten: the substituted value does not
/// fit where the placeholder was. Names only, never the value. The caller
/// must not forward the request (answer it with an error and log this).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubstituteError {
    /// The header value with the secret substituted is not a valid header
    /// value.
    #[error("substituting secret `{secret}` into header `{header}` gives an invalid header value")]
    InvalidHeader {
        /// The secret's name.
        secret: String,
        /// The header's name.
        header: String,
    },
    /// The request target with the secret substituted into the query is not
    /// a valid URI.
    #[error("substituting secret `{secret}` into the query string gives an invalid request target")]
    InvalidUri {
        /// The secret's name.
        secret: String,
    },
}

/// What [`HostSubstituter::request_head`] did and saw, by secret name.
///
/// Carries, privately, the request-specific encodings of substituted values
/// (the re-encoded Basic credentials) so that the response of this request
/// can be scrubbed of them too: pass it to
/// [`HostSubstituter::response_head`] and [`HostSubstituter::response_body`].
/// `Debug` shows names only.
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Substitutions {
    /// Secrets substituted, each `(name, location)` once, in order seen.
    pub used: Vec<(String, SecretLocation)>,
    /// Secrets NOT bound to this host whose placeholder appeared in the head
    /// (passed through unchanged; audit reason `secret_host_mismatch`).
    pub mismatched: Vec<String>,
    /// Secrets bound to this host whose placeholder appeared where the
    /// policy does not allow substitution (the path; the query or a header
    /// when not in the secret's `locations`); passed through unchanged.
    pub not_allowed: Vec<String>,
    /// (encoded real form, what the guest sent, secret name).
    reflections: Vec<(SecretBytes, SecretBytes, Arc<str>)>,
}

impl Substitutions {
    /// Nothing substituted, nothing seen.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.used.is_empty() && self.mismatched.is_empty() && self.not_allowed.is_empty()
    }

    /// The substitutions as audit entries (`AuditRecord::secrets`).
    #[must_use]
    pub fn audit_uses(&self) -> Vec<SecretUse<'_>> {
        self.used
            .iter()
            .map(|(name, location)| SecretUse {
                name: name.as_str().into(),
                location: *location,
            })
            .collect()
    }

    fn record_used(&mut self, name: &str, location: SecretLocation) {
        if !self.used.iter().any(|(n, l)| n == name && *l == location) {
            self.used.push((name.to_owned(), location));
        }
    }
}

impl fmt::Debug for Substitutions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Substitutions")
            .field("used", &self.used)
            .field("mismatched", &self.mismatched)
            .field("not_allowed", &self.not_allowed)
            .field("reflections", &self.reflections.len())
            .finish()
    }
}

/// Where in a request head a placeholder was found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Header,
    Query,
    /// The path: never substituted.
    Path,
}

/// The substitutions for one inspected connection to one host (the
/// verified SNI). Built by [`crate::SecretStore::for_host`]; cheap to clone
/// (an `Arc`), `Send + Sync`, immutable.
///
/// Request direction: the placeholder of each secret bound to the host is
/// replaced by the real value where the secret allows it (headers, with
/// `Authorization: Basic` credentials decoded and re-encoded; the query; the
/// body). Every other placeholder is left as is and reported.
///
/// Response direction (reflection scrubbing): every real value of a secret
/// bound to the host, the percent-encoded form substituted into queries, and
/// the exact Basic credentials sent in the request are replaced by what the
/// guest sent. Limits: only byte-exact occurrences are found; a value the
/// upstream transforms (JSON-escapes, re-encodes, compresses) is not. To keep
/// bodies uncompressed, [`HostSubstituter::request_head`] sets
/// `Accept-Encoding: identity` on requests to hosts with bound secrets; a
/// response that is still content-encoded cannot be scrubbed (the caller
/// decides what to do with it).
#[derive(Clone)]
pub struct HostSubstituter {
    inner: Arc<HostInner>,
}

struct HostInner {
    /// The normalised host ("" for the shared unbound substituter).
    host: String,
    secrets: Arc<[Secret]>,
    /// Every placeholder in the store (pattern index = secret index).
    placeholders: Arc<Table>,
    /// Per secret: bound to this host.
    bound: Vec<bool>,
    /// Bound secrets allowing `body`: placeholder -> value.
    body: Option<Arc<Table>>,
    /// Rows of `reflect`, to extend per request.
    reflect_rows: Vec<(SecretBytes, SecretBytes, Arc<str>)>,
    /// Bound secrets: value (and query encoding) -> placeholder.
    reflect: Option<Arc<Table>>,
    /// Placeholders a request body passes through unchanged, and why.
    body_scan: Option<Arc<ScanSet>>,
}

impl HostSubstituter {
    pub(crate) fn new(
        host: String,
        secrets: Arc<[Secret]>,
        placeholders: Arc<Table>,
        bound_ids: &[usize],
    ) -> Self {
        let mut bound = vec![false; secrets.len()];
        for &i in bound_ids {
            if let Some(b) = bound.get_mut(i) {
                *b = true;
            }
        }
        let mut body_rows = Vec::new();
        let mut reflect_rows = Vec::new();
        for (s, _) in secrets.iter().zip(&bound).filter(|(_, b)| **b) {
            if s.locations.body {
                body_rows.push((
                    Arc::clone(&s.placeholder),
                    Arc::clone(&s.value),
                    Arc::clone(&s.name),
                ));
            }
            reflect_rows.push((
                Arc::clone(&s.value),
                Arc::clone(&s.placeholder),
                Arc::clone(&s.name),
            ));
            if s.locations.query {
                let encoded = Arc::new(percent_encode(&s.value));
                if encoded.as_slice() != s.value.as_slice() {
                    reflect_rows.push((encoded, Arc::clone(&s.placeholder), Arc::clone(&s.name)));
                }
            }
        }
        // A request body may carry, unsubstituted, every placeholder but
        // those of bound secrets allowing `body`.
        let body_scan = ScanSet::new(
            secrets
                .iter()
                .zip(&bound)
                .filter(|(s, b)| !(**b && s.locations.body))
                .map(|(s, &b)| {
                    let kind = if b {
                        Seen::NotAllowed
                    } else {
                        Seen::Mismatched
                    };
                    (s.placeholder.as_slice(), Arc::clone(&s.name), kind)
                }),
        );
        let body_scan = (!body_scan.is_empty()).then(|| Arc::new(body_scan));
        let body = (!body_rows.is_empty()).then(|| Arc::new(Table::new(body_rows)));
        let reflect =
            (!reflect_rows.is_empty()).then(|| Arc::new(Table::new(reflect_rows.clone())));
        Self {
            inner: Arc::new(HostInner {
                host,
                secrets,
                placeholders,
                bound,
                body,
                reflect_rows,
                reflect,
                body_scan,
            }),
        }
    }

    /// No secret is bound to this host: nothing is ever substituted or
    /// scrubbed (placeholders seen are still reported as mismatched).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.inner.reflect.is_none()
    }

    /// The names of the secrets bound to this host, in policy order.
    pub fn bound_names(&self) -> impl Iterator<Item = &str> {
        self.inner
            .secrets
            .iter()
            .zip(&self.inner.bound)
            .filter(|(_, b)| **b)
            .map(|(s, _)| &*s.name)
    }

    /// The secrets bound to this host that the policy did not opt in to
    /// WebSocket (`websocket: true`), in policy order. A WebSocket upgrade
    /// to the host is allowed only when this is empty: after an upgrade the
    /// stream is neither substituted nor scrubbed.
    pub fn websocket_refused_by(&self) -> impl Iterator<Item = &str> {
        self.inner
            .secrets
            .iter()
            .zip(&self.inner.bound)
            .filter(|(s, b)| **b && !s.websocket)
            .map(|(s, _)| &*s.name)
    }

    /// Substitute in a request head: header values (including
    /// `Authorization: Basic` credentials, base64-decoded, substituted and
    /// re-encoded) for secrets allowing `headers`, and the query string for
    /// secrets allowing `query` (the value percent-encoded, so that the
    /// decoded parameter is the value). The path is never substituted.
    /// Substituted header values are marked sensitive (HTTP/2 never indexes
    /// them in HPACK). On a host with bound secrets, `Accept-Encoding` is set
    /// to `identity` so that responses can be scrubbed.
    ///
    /// Returns what was substituted and which other placeholders were seen.
    ///
    /// # Errors
    ///
    /// A substituted value that would make a header value or the request
    /// target invalid. `parts` is left unchanged then.
    pub fn request_head(
        &self,
        parts: &mut http::request::Parts,
    ) -> Result<Substitutions, SubstituteError> {
        let mut subs = Substitutions::default();
        // Compute every new value first, then apply: all or nothing.
        let mut new_values = Vec::with_capacity(parts.headers.len());
        for (name, value) in &parts.headers {
            new_values.push(self.header_value(name, value, &mut subs)?);
        }
        let new_uri = self.request_target(&parts.uri, &mut subs)?;
        for ((_, value), new) in parts.headers.iter_mut().zip(new_values) {
            if let Some(new) = new {
                *value = new;
            }
        }
        if let Some(uri) = new_uri {
            parts.uri = uri;
        }
        if !self.is_empty() {
            parts
                .headers
                .insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        }
        Ok(subs)
    }

    /// Streaming body substitution (placeholder -> value) for the bound
    /// secrets allowing `body`; `None` when none does. Record
    /// [`StreamReplacer::used`] as `body` substitutions when the body ends.
    #[must_use]
    pub fn request_body(&self) -> Option<StreamReplacer> {
        self.inner
            .body
            .as_ref()
            .map(|t| StreamReplacer::new(Arc::clone(t)))
    }

    /// Streaming detection, for logging, of the placeholders a request body
    /// to this host passes through unchanged: other secrets' placeholders
    /// ([`PlaceholderScanner::mismatched`]) and bound secrets that do not
    /// allow `body` ([`PlaceholderScanner::not_allowed`]). Feed it the body
    /// as the guest sent it. `None` when the store has no such placeholder.
    #[must_use]
    pub fn request_body_scanner(&self) -> Option<PlaceholderScanner> {
        self.inner
            .body_scan
            .as_ref()
            .map(|set| PlaceholderScanner::new(Arc::clone(set)))
    }

    /// Reflection scrubbing of a response head: every real value (and
    /// encoded form, see the type docs) becomes what the guest sent.
    /// `request` is what [`HostSubstituter::request_head`] returned for the
    /// request this responds to (`&Substitutions::default()` if unknown).
    /// Returns the number of replacements.
    pub fn response_head(
        &self,
        request: &Substitutions,
        parts: &mut http::response::Parts,
    ) -> usize {
        self.response_headers(request, &mut parts.headers)
    }

    /// [`HostSubstituter::response_head`] for a bare header map (HTTP/2 or
    /// chunked trailers).
    pub fn response_headers(&self, request: &Substitutions, headers: &mut HeaderMap) -> usize {
        let Some(table) = self.reflect_table(request) else {
            return 0;
        };
        let mut count = 0usize;
        for value in headers.values_mut() {
            let mut out = Zeroizing::new(Vec::with_capacity(value.len()));
            let n = replace_all(&table, value.as_bytes(), &mut out, |_| {});
            if n == 0 {
                continue;
            }
            count = count.saturating_add(usize::try_from(n).unwrap_or(usize::MAX));
            // Replacing part of a valid value by printable ASCII keeps it
            // valid; should that ever fail, drop the value rather than keep
            // the secret.
            *value = HeaderValue::from_bytes(&out).unwrap_or(HeaderValue::from_static(""));
        }
        count
    }

    /// Streaming reflection scrubbing of a response body (value ->
    /// placeholder); `None` when no secret is bound to this host. `request`
    /// as for [`HostSubstituter::response_head`].
    #[must_use]
    pub fn response_body(&self, request: &Substitutions) -> Option<StreamReplacer> {
        self.reflect_table(request).map(StreamReplacer::new)
    }

    fn reflect_table(&self, request: &Substitutions) -> Option<Arc<Table>> {
        let base = self.inner.reflect.as_ref()?;
        if request.reflections.is_empty() {
            return Some(Arc::clone(base));
        }
        let mut rows = self.inner.reflect_rows.clone();
        rows.extend(request.reflections.iter().cloned());
        Some(Arc::new(Table::new(rows)))
    }

    /// The new value of one request header, or `None` if unchanged.
    fn header_value(
        &self,
        name: &HeaderName,
        value: &HeaderValue,
        subs: &mut Substitutions,
    ) -> Result<Option<HeaderValue>, SubstituteError> {
        let invalid = |secret: &str| SubstituteError::InvalidHeader {
            secret: secret.to_owned(),
            header: name.as_str().to_owned(),
        };
        if *name == AUTHORIZATION
            && let Some(basic) = self.basic_credentials(value.as_bytes(), subs)
        {
            let Some((new, first)) = basic else {
                return Ok(None);
            };
            let mut v = HeaderValue::from_bytes(&new).map_err(|_| invalid(&first))?;
            v.set_sensitive(true);
            return Ok(Some(v));
        }
        let Some((new, first)) = self.substitute(value.as_bytes(), Place::Header, subs) else {
            return Ok(None);
        };
        let mut v = HeaderValue::from_bytes(&new).map_err(|_| invalid(&first))?;
        v.set_sensitive(true);
        Ok(Some(v))
    }

    /// `Authorization: Basic <base64(user:pass)>`: substitute inside the
    /// decoded credentials. `None` if the value is not Basic with valid
    /// base64 (then it is treated as an ordinary header value); `Some(None)`
    /// if decoded but unchanged; otherwise the new header value and the
    /// first secret substituted.
    #[allow(clippy::type_complexity)]
    fn basic_credentials(
        &self,
        value: &[u8],
        subs: &mut Substitutions,
    ) -> Option<Option<(Zeroizing<Vec<u8>>, String)>> {
        let value = value.trim_ascii();
        let sp = value.iter().position(|b| *b == b' ')?;
        let (scheme, rest) = value.split_at(sp);
        if !scheme.eq_ignore_ascii_case(b"basic") {
            return None;
        }
        let token = rest.trim_ascii();
        let mut decoded = Zeroizing::new(vec![0u8; base64::decoded_len_estimate(token.len())]);
        let n = BASE64.decode_slice(token, &mut decoded).ok()?;
        decoded.truncate(n);
        let Some((new, first)) = self.substitute(&decoded, Place::Header, subs) else {
            return Some(None);
        };
        let Some(enc_len) = base64::encoded_len(new.len(), true) else {
            // Unencodable length (cannot happen for a header-sized value):
            // keep the request unchanged rather than send a broken one.
            return Some(None);
        };
        let mut encoded = Zeroizing::new(vec![0u8; enc_len]);
        let Ok(w) = BASE64.encode_slice(new.as_slice(), &mut encoded) else {
            return Some(None);
        };
        encoded.truncate(w);
        let mut header = Zeroizing::new(Vec::with_capacity(6 + encoded.len()));
        header.extend_from_slice(scheme);
        header.push(b' ');
        header.extend_from_slice(&encoded);
        subs.reflections.push((
            Arc::new(encoded),
            Arc::new(Zeroizing::new(token.to_vec())),
            Arc::from(first.as_str()),
        ));
        Some(Some((header, first)))
    }

    /// The new request target if the query changed; also records
    /// placeholders seen in the path.
    fn request_target(
        &self,
        uri: &Uri,
        subs: &mut Substitutions,
    ) -> Result<Option<Uri>, SubstituteError> {
        let Some(pq) = uri.path_and_query() else {
            return Ok(None);
        };
        // The path is never substituted: only record what it carries.
        let _ = self.substitute(pq.path().as_bytes(), Place::Path, subs);
        let Some(query) = pq.query() else {
            return Ok(None);
        };
        let Some((new_query, first)) = self.substitute(query.as_bytes(), Place::Query, subs) else {
            return Ok(None);
        };
        let invalid = || SubstituteError::InvalidUri {
            secret: first.clone(),
        };
        let mut target = Zeroizing::new(Vec::with_capacity(pq.as_str().len() + new_query.len()));
        target.extend_from_slice(pq.path().as_bytes());
        target.push(b'?');
        target.extend_from_slice(&new_query);
        let new_pq = PathAndQuery::try_from(target.as_slice()).map_err(|_| invalid())?;
        let mut uri_parts = uri.clone().into_parts();
        uri_parts.path_and_query = Some(new_pq);
        Uri::from_parts(uri_parts).map(Some).map_err(|_| invalid())
    }

    /// Replace the placeholders allowed at `place` in `hay`, recording every
    /// placeholder seen in `subs`. `None` if nothing was replaced; otherwise
    /// the new bytes and the first secret replaced.
    fn substitute(
        &self,
        hay: &[u8],
        place: Place,
        subs: &mut Substitutions,
    ) -> Option<(Zeroizing<Vec<u8>>, String)> {
        let inner = &*self.inner;
        let mut search = inner.placeholders.search(hay);
        let mut out: Option<Zeroizing<Vec<u8>>> = None;
        let mut first: Option<String> = None;
        let mut copied = 0;
        let mut at = 0;
        while let Some((start, i)) = search.find_from(at) {
            at = start + inner.placeholders.pattern_len(i);
            let Some(secret) = inner.secrets.get(i) else {
                continue;
            };
            let bound = inner.bound.get(i).copied().unwrap_or(false);
            let allowed = match place {
                Place::Header => secret.locations.headers,
                Place::Query => secret.locations.query,
                Place::Path => false,
            };
            if !bound {
                push_once(&mut subs.mismatched, &secret.name);
                continue;
            }
            if !allowed {
                push_once(&mut subs.not_allowed, &secret.name);
                continue;
            }
            let buf = out.get_or_insert_with(|| {
                Zeroizing::new(Vec::with_capacity(hay.len() + secret.value.len()))
            });
            buf.extend_from_slice(hay.get(copied..start).unwrap_or_default());
            if place == Place::Query {
                buf.extend_from_slice(&percent_encode(&secret.value));
            } else {
                buf.extend_from_slice(&secret.value);
            }
            copied = at;
            let location = if place == Place::Query {
                SecretLocation::Query
            } else {
                SecretLocation::Header
            };
            subs.record_used(&secret.name, location);
            first.get_or_insert_with(|| secret.name.to_string());
        }
        let mut out = out?;
        out.extend_from_slice(hay.get(copied..).unwrap_or_default());
        Some((out, first.unwrap_or_default()))
    }
}

impl fmt::Debug for HostSubstituter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostSubstituter")
            .field("host", &self.inner.host)
            .field("bound", &self.bound_names().collect::<Vec<_>>())
            .finish()
    }
}

fn push_once(list: &mut Vec<String>, name: &str) {
    if !list.iter().any(|n| n == name) {
        list.push(name.to_owned());
    }
}

/// Percent-encode every byte outside RFC 3986's unreserved set, so that a
/// query parameter decodes to exactly `value` (whatever the server's form
/// or URI decoding).
fn percent_encode(value: &[u8]) -> Zeroizing<Vec<u8>> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Zeroizing::new(Vec::with_capacity(value.len() * 3));
    for &b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.push(b'%');
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0x0f)]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::store;

    fn request(uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().uri(uri);
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn b64(s: &str) -> String {
        BASE64.encode(s)
    }

    #[test]
    fn header_substituted_for_bound_host_only() {
        let s = store();
        let mut p = request(
            "/v1",
            &[
                ("authorization", "Bearer PH-header-secret"),
                ("x-two", "PH-header-secret,PH-query-secret"),
                ("x-plain", "nothing"),
            ],
        );
        let subs = s.for_host("api.example.com").request_head(&mut p).unwrap();
        assert_eq!(p.headers["authorization"], "Bearer real-header-value");
        assert!(p.headers["authorization"].is_sensitive());
        assert_eq!(p.headers["x-two"], "real-header-value,real/query+value=");
        assert_eq!(p.headers["x-plain"], "nothing");
        assert!(!p.headers["x-plain"].is_sensitive());
        assert_eq!(p.headers["accept-encoding"], "identity");
        assert_eq!(
            subs.used,
            [
                ("hdr".to_owned(), SecretLocation::Header),
                ("qry".to_owned(), SecretLocation::Header)
            ]
        );
        assert!(subs.mismatched.is_empty() && subs.not_allowed.is_empty());
        assert_eq!(subs.audit_uses()[0].name, "hdr");

        // Another allowed host: passed through, reported as mismatched.
        let mut p = request(
            "/v1",
            &[
                ("authorization", "Bearer PH-header-secret"),
                ("accept-encoding", "gzip"),
            ],
        );
        let subs = s
            .for_host("other.example.com")
            .request_head(&mut p)
            .unwrap();
        assert_eq!(p.headers["authorization"], "Bearer PH-header-secret");
        assert_eq!(p.headers["accept-encoding"], "gzip");
        assert!(subs.used.is_empty());
        assert_eq!(subs.mismatched, ["hdr"]);

        // Bound to a different host of the store: still a mismatch.
        let mut p = request("/", &[("x", "PH-header-secret PH-body-secret")]);
        let subs = s
            .for_host("upload.example.com")
            .request_head(&mut p)
            .unwrap();
        assert_eq!(p.headers["x"], "PH-header-secret PH-body-secret");
        assert_eq!(subs.mismatched, ["hdr"]);
        // `bdy` is bound there but not allowed in headers.
        assert_eq!(subs.not_allowed, ["bdy"]);
    }

    #[test]
    fn placeholders_match_case_sensitively_and_exactly() {
        let s = store();
        let mut p = request(
            "/",
            &[("x", "ph-header-secret PH-HEADER-SECRET PH-header-secre")],
        );
        let subs = s.for_host("api.example.com").request_head(&mut p).unwrap();
        assert!(subs.is_empty(), "{subs:?}");
        assert_eq!(
            p.headers["x"],
            "ph-header-secret PH-HEADER-SECRET PH-header-secre"
        );
    }

    #[test]
    fn basic_auth_credentials_are_decoded_substituted_reencoded() {
        let s = store();
        let sub = s.for_host("api.example.com");
        let sent = format!("Basic {}", b64("user:PH-header-secret"));
        let mut p = request("/", &[("authorization", &sent)]);
        let subs = sub.request_head(&mut p).unwrap();
        assert_eq!(
            p.headers["authorization"],
            format!("Basic {}", b64("user:real-header-value")).as_str()
        );
        assert_eq!(subs.used, [("hdr".to_owned(), SecretLocation::Header)]);

        // Scheme is case-insensitive; placeholder in the user part too.
        let mut p = request(
            "/",
            &[(
                "authorization",
                &format!("bASIC  {}", b64("PH-query-secret:x")),
            )],
        );
        sub.request_head(&mut p).unwrap();
        assert_eq!(
            p.headers["authorization"],
            format!("bASIC {}", b64("real/query+value=:x")).as_str()
        );

        // Not base64: treated as a plain value.
        let mut p = request("/", &[("authorization", "Basic PH-header-secret")]);
        sub.request_head(&mut p).unwrap();
        assert_eq!(p.headers["authorization"], "Basic real-header-value");

        // Mismatch inside Basic credentials is detected.
        let mut p = request(
            "/",
            &[(
                "authorization",
                &format!("Basic {}", b64("u:PH-body-secret")),
            )],
        );
        let subs = sub.request_head(&mut p).unwrap();
        assert_eq!(subs.mismatched, ["bdy"]);
        assert!(subs.used.is_empty());
    }

    #[test]
    fn query_substituted_only_when_configured() {
        let s = store();
        let sub = s.for_host("api.example.com");
        let mut p = request(
            "https://api.example.com/PH-query-secret/x?a=PH-query-secret&b=PH-header-secret&c=1",
            &[],
        );
        let subs = sub.request_head(&mut p).unwrap();
        // Percent-encoded so the parameter decodes to the value; the path
        // is never substituted; `hdr` is not allowed in the query.
        assert_eq!(
            p.uri.to_string(),
            "https://api.example.com/PH-query-secret/x?a=real%2Fquery%2Bvalue%3D&b=PH-header-secret&c=1"
        );
        assert_eq!(subs.used, [("qry".to_owned(), SecretLocation::Query)]);
        assert_eq!(subs.not_allowed, ["qry", "hdr"]);

        // Origin-form target (HTTP/1).
        let mut p = request("/a?k=PH-query-secret", &[]);
        sub.request_head(&mut p).unwrap();
        assert_eq!(p.uri, "/a?k=real%2Fquery%2Bvalue%3D");

        // No query secret bound there: unchanged, reported.
        let mut p = request("/a?k=PH-query-secret", &[]);
        let subs = s
            .for_host("upload.example.com")
            .request_head(&mut p)
            .unwrap();
        assert_eq!(p.uri, "/a?k=PH-query-secret");
        assert_eq!(subs.mismatched, ["qry"]);
    }

    #[test]
    fn body_substituted_only_when_configured() {
        let s = store();
        assert!(s.for_host("api.example.com").request_body().is_none());
        assert!(s.for_host("other.example.com").request_body().is_none());
        let mut r = s.for_host("upload.example.com").request_body().unwrap();
        let mut out = Vec::new();
        r.feed(b"{\"key\":\"PH-body-", &mut out);
        r.feed(b"secret\", \"h\": \"PH-header-secret\"}", &mut out);
        r.finish(&mut out);
        assert_eq!(
            out,
            b"{\"key\":\"real-body-value\", \"h\": \"PH-header-secret\"}"
        );
        assert_eq!(r.used(), ["bdy"]);
        assert_eq!(r.replaced(), 1);
    }

    #[test]
    fn invalid_header_after_substitution_is_an_error_and_changes_nothing() {
        let yaml = "version: 1\nid: t\nallow:\n  - domain: api.example.com\nsecrets:\n  - name: s1\n    placeholder: PH-s1-placeholder\n    env: SB_X\n    hosts: [api.example.com]\n    locations: [headers, query]\n";
        let p = crate::store::tests::policy(yaml);
        // Valid in a header (obs-text) and in a query (percent-encoded)...
        let s =
            crate::SecretStore::load_with(&p, |_| Some(Zeroizing::new(b"caf\xc3\xa9 1".to_vec())))
                .unwrap();
        let mut parts = request("/?q=PH-s1-placeholder", &[("x", "PH-s1-placeholder")]);
        s.for_host("api.example.com")
            .request_head(&mut parts)
            .unwrap();
        assert_eq!(parts.headers["x"].as_bytes(), b"caf\xc3\xa9 1");
        assert_eq!(parts.uri, "/?q=caf%C3%A9%201");

        // A value that breaks a header: the store refuses it at load, so
        // build the substituter directly to test the guard behind that.
        let secret = |name: &str, value: &[u8]| Secret {
            name: Arc::from(name),
            placeholder: crate::matcher::secret_bytes(format!("PH-{name}-placeholder").as_bytes()),
            value: crate::matcher::secret_bytes(value),
            locations: sluice_policy::SecretLocations {
                headers: true,
                query: false,
                body: false,
            },
            websocket: false,
        };
        let secrets: Arc<[Secret]> =
            vec![secret("good", b"fine"), secret("bad", b"two\r\nlines")].into();
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
        let sub = HostSubstituter::new("h".into(), secrets, placeholders, &[0, 1]);
        let mut parts = request(
            "/",
            &[("a", "PH-good-placeholder"), ("b", "x PH-bad-placeholder")],
        );
        let err = sub.request_head(&mut parts).unwrap_err();
        assert_eq!(
            err,
            SubstituteError::InvalidHeader {
                secret: "bad".into(),
                header: "b".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "substituting secret `bad` into header `b` gives an invalid header value"
        );
        // All or nothing: the valid substitution was not applied either.
        assert_eq!(parts.headers["a"], "PH-good-placeholder");
        assert_eq!(parts.headers["b"], "x PH-bad-placeholder");
        assert!(parts.headers.get("accept-encoding").is_none());
    }

    #[test]
    fn reflection_scrubbed_in_response_head_and_body() {
        let s = store();
        let sub = s.for_host("api.example.com");
        let sent = format!("Basic {}", b64("me:PH-header-secret"));
        let mut req = request("/?k=PH-query-secret", &[("authorization", &sent)]);
        let subs = sub.request_head(&mut req).unwrap();
        let real_basic = req.headers["authorization"].to_str().unwrap().to_owned();
        assert_ne!(real_basic, sent);

        let (mut resp, ()) = http::Response::builder()
            .header("x-echo", "token=real-header-value")
            .header("x-url", "/?k=real%2Fquery%2Bvalue%3D")
            .header("x-auth", real_basic.as_str())
            .header("x-other", "fine")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(sub.response_head(&subs, &mut resp), 3);
        assert_eq!(resp.headers["x-echo"], "token=PH-header-secret");
        assert_eq!(resp.headers["x-url"], "/?k=PH-query-secret");
        assert_eq!(resp.headers["x-auth"], sent.as_str());
        assert_eq!(resp.headers["x-other"], "fine");

        let body = format!(
            "{{\"headers\":{{\"Authorization\":\"{real_basic}\"}},\"url\":\"/?k=real%2Fquery%2Bvalue%3D\",\"raw\":\"real/query+value=real-header-value\"}}"
        );
        let want = format!(
            "{{\"headers\":{{\"Authorization\":\"{sent}\"}},\"url\":\"/?k=PH-query-secret\",\"raw\":\"PH-query-secretPH-header-secret\"}}"
        );
        for size in [1, 2, 3, 7, 64, body.len()] {
            let mut r = sub.response_body(&subs).unwrap();
            let mut out = Vec::new();
            for chunk in body.as_bytes().chunks(size) {
                r.feed(chunk, &mut out);
            }
            r.finish(&mut out);
            assert_eq!(String::from_utf8(out).unwrap(), want, "chunk size {size}");
            assert_eq!(r.replaced(), 4);
        }
        // Without the request's substitutions, the values are still scrubbed.
        let mut r = sub.response_body(&Substitutions::default()).unwrap();
        let mut out = Vec::new();
        r.feed(b"real-header-value", &mut out);
        r.finish(&mut out);
        assert_eq!(out, b"PH-header-secret");

        // Unbound host: nothing to scrub.
        assert!(
            s.for_host("other.example.com")
                .response_body(&subs)
                .is_none()
        );
    }

    #[test]
    fn substitutions_debug_never_shows_values() {
        let s = store();
        let sub = s.for_host("api.example.com");
        let sent = format!("Basic {}", b64("me:PH-header-secret"));
        let mut req = request("/", &[("authorization", &sent)]);
        let subs = sub.request_head(&mut req).unwrap();
        let d = format!("{subs:?}");
        assert!(
            !d.contains("real") && !d.contains(&b64("me:real-header-value")),
            "{d}"
        );
        assert!(d.contains("hdr"), "{d}");
    }

    #[test]
    fn substituter_is_send_sync_clone() {
        fn check<T: Send + Sync + Clone>() {}
        check::<HostSubstituter>();
        fn send<T: Send + Sync>() {}
        send::<StreamReplacer>();
        send::<crate::SecretStore>();
    }
}
