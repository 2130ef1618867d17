//! Ports and transports: the ports whose first bytes are read (TLS: 443
//! and `ports.tls`; plain HTTP: 80 and `ports.http`), what a TCP port is
//! treated as, and the checking of every port list a policy writes.

use serde::Serialize;
use serde_saphyr::Spanned;

use super::Compiler;
use crate::model::RawPorts;

/// The port every TLS check applies to, whatever the policy says.
pub const TLS_PORT: u16 = 443;
/// The port every plain-HTTP check applies to, whatever the policy says.
pub const HTTP_PORT: u16 = 80;

/// How the gateway must treat a TCP port before deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PortProtocol {
    /// TLS: read the ClientHello and check the SNI (443 and `ports.tls`).
    Tls,
    /// Plain HTTP: read the request head and check the Host (80 and
    /// `ports.http`).
    Http,
    /// Raw TCP: decided on the destination address alone.
    Tcp,
}

/// A transport protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Compiler<'_> {
    /// One port, or an error where it is outside 1..65535.
    fn port(&mut self, p: &Spanned<i64>) -> Option<u16> {
        match u16::try_from(p.value) {
            Ok(v) if v >= 1 => Some(v),
            _ => {
                self.err(
                    p.referenced,
                    format!("port {} is out of range; ports are 1..65535", p.value),
                );
                None
            }
        }
    }

    /// A port list, each port checked to be in 1..65535 (an error for each
    /// that is not), sorted, without duplicates.
    pub(crate) fn ports(&mut self, list: &[Spanned<i64>]) -> Vec<u16> {
        let mut out: Vec<u16> = list.iter().filter_map(|p| self.port(p)).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The TLS and the plain-HTTP ports, each sorted: 443 and 80, plus the
    /// `ports:` section's (80 cannot be TLS; a port is one or the other).
    pub(super) fn protocol_ports(&mut self, raw: Option<&RawPorts>) -> (Vec<u16>, Vec<u16>) {
        let mut tls_ports = vec![TLS_PORT];
        let mut http_ports = vec![HTTP_PORT];
        if let Some(p) = raw {
            for sp in &p.tls {
                if let Some(v) = self.port(sp) {
                    if v == HTTP_PORT {
                        self.err(
                            sp.referenced,
                            "port 80 is always plain HTTP; it cannot be a TLS port",
                        );
                    } else {
                        tls_ports.push(v);
                    }
                }
            }
            for sp in &p.http {
                if let Some(v) = self.port(sp) {
                    if tls_ports.contains(&v) {
                        self.err(
                            sp.referenced,
                            format!("port {v} is already a TLS port; a port is either `tls` or `http`, not both"),
                        );
                    } else {
                        http_ports.push(v);
                    }
                }
            }
        }
        tls_ports.sort_unstable();
        tls_ports.dedup();
        http_ports.sort_unstable();
        http_ports.dedup();
        (tls_ports, http_ports)
    }
}
