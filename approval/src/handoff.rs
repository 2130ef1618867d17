//! Handing an `always` approval to the process that writes the overlay.
//!
//! Under `sluice run` the gateway's jail keeps the policy's directory
//! read-only, so the gateway cannot write `POLICY.approved.yaml` itself.
//! It sends each `always` entry, one JSON line, over a unix socket in its
//! run dir (`--approval-overlay-socket`) to the launcher, which validates
//! it against the policy and answers one JSON line: [`HandoffReply`].
//!
//! The gateway audits `always` exactly when the file was written, so the
//! write happens in two steps and only while the gateway still waits for
//! it: the launcher prepares the new overlay under a temporary name and
//! answers `"prepared"`; the gateway, if its deadline has not passed,
//! answers `"commit"` ([`COMMIT`]) and from then on waits for the outcome
//! whatever it takes; the launcher renames the file into place and
//! answers `"written"` (or `refused` if the rename failed). A gateway that
//! gave up closes the connection instead, and the launcher removes what it
//! prepared. A name already listed is answered `"written"` at once.
//!
//! The launcher treats the gateway as possibly compromised: the entry is
//! deliberately narrow (a name, its ports, who decided), unknown fields are
//! refused, and everything else the overlay records (the sandbox, the
//! time) is the launcher's own.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncWriteExt as _, BufReader};
use tokio::net::UnixStream;

use crate::backend::BackendError;
use crate::backend::unix::read_line;
use crate::wire::{MAX_BY_BYTES, MAX_MESSAGE_BYTES, WireError};

/// One name approved with "always", as the gateway hands it over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlayEntry {
    /// The exact name approved (normalised, never a pattern).
    pub name: String,
    /// The TCP ports the approval opens.
    pub tcp_ports: Vec<u16>,
    /// The UDP ports the approval opens.
    pub udp_ports: Vec<u16>,
    /// Who decided: the backend's kind and its `by` (at most
    /// [`MAX_BY_BYTES`] * 2 bytes; only informative).
    pub by: String,
}

/// What the writer of the overlay did with an [`OverlayEntry`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum HandoffReply {
    /// The new overlay is ready; written on [`COMMIT`].
    Prepared,
    /// The name is now in the overlay (added, or already there).
    Written,
    /// The entry was refused, for the reason given; nothing was written.
    Refused(String),
}

/// The gateway's go-ahead after [`HandoffReply::Prepared`]: one JSON line.
pub const COMMIT: &[u8] = b"\"commit\"\n";

impl OverlayEntry {
    /// The entry as one JSON line (with the newline).
    ///
    /// # Errors
    /// Only if serialisation fails, which the field types rule out.
    pub fn to_line(&self) -> Result<Vec<u8>, WireError> {
        crate::wire::json_line(self)
    }

    /// Reads an entry (one JSON object of at most [`MAX_MESSAGE_BYTES`],
    /// unknown fields refused, `by` bounded).
    ///
    /// # Errors
    /// Too long, malformed, or a `by` over its bound.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(WireError::TooLong);
        }
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(WireError::NotAnObject);
        }
        let e: Self = serde_json::from_slice(bytes)?;
        if e.by.len() > 2 * MAX_BY_BYTES {
            return Err(WireError::TooLong);
        }
        Ok(e)
    }
}

impl HandoffReply {
    /// The reply as one JSON line (with the newline).
    ///
    /// # Errors
    /// Only if serialisation fails, which the field types rule out.
    pub fn to_line(&self) -> Result<Vec<u8>, WireError> {
        crate::wire::json_line(self)
    }

    /// Reads a reply.
    ///
    /// # Errors
    /// Too long or malformed.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(WireError::TooLong);
        }
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// Sends `entry` to the overlay writer listening on `socket` and returns
/// the outcome: `Written` or `Refused`. Until the launcher has prepared
/// the file the wait ends at `deadline` (an error; the launcher then
/// writes nothing); once the gateway answered [`COMMIT`] it waits for the
/// rename's outcome, so that what it reports is what the file holds.
///
/// # Errors
/// The socket could not be reached, the deadline passed before the file
/// was prepared, or a reply was not read.
pub async fn hand_off(
    socket: &std::path::Path,
    entry: &OverlayEntry,
    deadline: tokio::time::Instant,
) -> Result<HandoffReply, BackendError> {
    let line = entry.to_line()?;
    let first = tokio::time::timeout_at(deadline, async {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(BackendError::Connect)?;
        let (r, mut w) = stream.into_split();
        w.write_all(&line).await.map_err(BackendError::Io)?;
        let mut r = BufReader::new(r);
        let reply = HandoffReply::parse(&read_line(&mut r).await?)?;
        Ok::<_, BackendError>((reply, r, w))
    })
    .await
    .map_err(|_| BackendError::Timeout)??;
    match first {
        (HandoffReply::Prepared, mut r, mut w) => {
            w.write_all(COMMIT).await.map_err(BackendError::Io)?;
            match HandoffReply::parse(&read_line(&mut r).await?)? {
                HandoffReply::Prepared => Err(WireError::NotAnObject.into()),
                done => Ok(done),
            }
        }
        (done, _, _) => Ok(done),
    }
}

/// Whether `line` (without its newline) is the gateway's [`COMMIT`].
#[must_use]
pub fn is_commit(line: &[u8]) -> bool {
    line.trim_ascii() == COMMIT.trim_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_replies_round_trip_and_unknown_fields_are_refused() {
        let e = OverlayEntry {
            name: "a.example.com".into(),
            tcp_ports: vec![443],
            udp_ports: vec![],
            by: "unix".into(),
        };
        assert_eq!(OverlayEntry::parse(&e.to_line().unwrap()).unwrap(), e);
        for bad in [
            &br#"{"name":"a.example.com","tcp_ports":[443],"udp_ports":[],"by":"u","cidr":"0.0.0.0/0"}"#[..],
            br#"{"name":"a.example.com","tcp_ports":[443],"udp_ports":[]}"#,
            br#"["a.example.com"]"#,
            br#"{"name":"a.example.com","tcp_ports":[70000],"udp_ports":[],"by":"u"}"#,
        ] {
            assert!(
                OverlayEntry::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!(
            r#"{{"name":"a.example.com","tcp_ports":[443],"udp_ports":[],"by":"{}"}}"#,
            "x".repeat(3 * MAX_BY_BYTES)
        );
        assert!(OverlayEntry::parse(long.as_bytes()).is_err());
        for r in [
            HandoffReply::Prepared,
            HandoffReply::Written,
            HandoffReply::Refused("no".into()),
        ] {
            assert_eq!(HandoffReply::parse(&r.to_line().unwrap()).unwrap(), r);
        }
        assert!(HandoffReply::parse(br#"{"written":1}"#).is_err());
        assert!(is_commit(COMMIT) && !is_commit(b"\"written\"\n"));
    }
}
