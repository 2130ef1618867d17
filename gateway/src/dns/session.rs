//! The DNS server in the session: queries to the gateway's port 53 over UDP
//! and TCP handed to [`super::DnsServer`], upstream questions sent from
//! helper tasks, answers written back to the guest and each query's `dns`
//! audit line.

use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use smoltcp::socket::tcp;

use sluice_approval::Choice;
use sluice_policy::Reason;

use super::approval::ApprovalReply;
use super::{Asker, Delivery, Outcome, Served, UpstreamReply};
use crate::audit::{ApprovalLasts, AuditEvent};
use crate::packet;
use crate::session::{Datapath, Event};
use crate::tcp::{Flow, FlowState, guest_finished};

/// DNS-over-TCP connection buffers.
pub(crate) const DNS_TCP_BUF: usize = 64 * 1024 + 2;
/// Per-upstream DNS timeout.
const DNS_TIMEOUT: Duration = Duration::from_secs(3);

impl Datapath {
    pub(crate) fn on_dns_udp(&mut self, frame: &[u8], src: SocketAddrV4, payload: &[u8]) {
        if self.guest_mac.is_none() {
            // Until DHCP has told us the guest's MAC, answers go to the one that asked.
            self.dns_reply_mac = Self::frame_src_mac(frame);
        }
        self.serve_dns(payload, Asker::Udp(src));
    }

    /// Serves one guest DNS query (UDP or TCP): answers it now, or leaves
    /// it waiting on an upstream question (sending a new one).
    pub(crate) fn serve_dns(&mut self, query: &[u8], asker: Asker) {
        self.counters.dns_queries += 1;
        let can_forward = !self.dns_upstreams().is_empty();
        let served = self.dns.query(
            query,
            asker,
            self.decider.as_ref(),
            can_forward,
            Instant::now(),
        );
        self.handle_served(served);
    }

    /// Carries out what the DNS server made of a query: an answer now, a
    /// question upstream, or a question to the approval backend (each on a
    /// task of its own: the event loop never waits).
    fn handle_served(&mut self, served: Served) {
        match served {
            Served::Now(delivery) => self.deliver_dns(delivery),
            Served::Joined => {}
            Served::Ask(key) => {
                let events = self.events.clone();
                let upstreams = self.dns_upstreams();
                tokio::spawn(async move {
                    let reply = super::upstream::resolve(key, upstreams, DNS_TIMEOUT).await;
                    let _ = events.send(Event::DnsUpstream(reply));
                });
            }
            Served::Approve(out) => {
                self.counters.approval_questions += 1;
                super::approval::spawn_question(*out, self.events.clone());
            }
        }
    }

    /// A backend's answer (or failure) to an approval question: the
    /// decision recorded and audited, then the queries held on it answered
    /// (forwarded as for a listed name, or REFUSED).
    pub(crate) fn on_approval(&mut self, reply: ApprovalReply) {
        let now = Instant::now();
        let ApprovalReply {
            name,
            kind,
            result,
            overlay,
        } = reply;
        let failure = result.as_ref().err().map(ToString::to_string);
        let grant = self.dns.approval_answered(&name, kind, result, now);
        let (choice, by, allowed) = match &grant {
            Some(g) => (g.choice, g.by.clone(), g.choice.allows()),
            // The approval section changed meanwhile: the answer is moot.
            None => (Choice::DenyOnce, "reload".to_owned(), false),
        };
        let lasts = match choice {
            Choice::AllowOnce => ApprovalLasts::DnsTtl,
            Choice::DenyOnce => ApprovalLasts::RetryWindow,
            Choice::AllowSandbox | Choice::DenySandbox => ApprovalLasts::Sandbox,
            Choice::AllowAlways if matches!(overlay, Some(Ok(()))) => ApprovalLasts::Always,
            Choice::AllowAlways => ApprovalLasts::Sandbox,
        };
        let overlay_err = match &overlay {
            Some(Err(e)) => Some(format!(
                "overlay not written (allowed for this sandbox only): {e}"
            )),
            _ => None,
        };
        let detail = failure.or(overlay_err);
        let (tcp, udp) = self.dns.approval_ports();
        if !allowed {
            self.counters.approval_denied += 1;
        }
        self.audit.record(&AuditEvent::Approval {
            name: &name,
            choice,
            by: &by,
            lasts,
            tcp_ports: &tcp,
            udp_ports: &udp,
            detail: detail.as_deref(),
        });
        let can_forward = !self.dns_upstreams().is_empty();
        let served =
            self.dns
                .approval_decided(&name, allowed, self.decider.as_ref(), can_forward, now);
        for s in served {
            self.handle_served(s);
        }
    }

    /// Hands an upstream reply to the queries waiting on it.
    pub(crate) fn on_dns_upstream(&mut self, reply: UpstreamReply) {
        self.counters.dns_upstream_dropped += u64::from(reply.dropped);
        let deliveries = self
            .dns
            .answered(reply, self.decider.as_ref(), Instant::now());
        for d in deliveries {
            self.deliver_dns(d);
        }
    }

    /// Audits one answered DNS query and sends the answer: a datagram, or a
    /// length-prefixed message on the DNS-over-TCP flow (which then reads
    /// the next query).
    pub(crate) fn deliver_dns(&mut self, d: Delivery) {
        self.audit_dns(&d);
        match d.to {
            Asker::Udp(guest) => {
                if let Some(bytes) = &d.bytes {
                    self.reply_udp(self.dns_reply_mac, guest, bytes);
                }
            }
            Asker::Tcp(id) => {
                if let Some(Flow {
                    state:
                        FlowState::DnsTcp {
                            handle, waiting, ..
                        },
                    ..
                }) = self.flows.get_mut(&id)
                {
                    *waiting = false;
                    let sock = self.sockets.get_mut::<tcp::Socket<'_>>(*handle);
                    super::server::send_tcp_reply(sock, d.bytes.as_deref());
                }
            }
        }
    }

    /// The resolvers for the next forwarded query: the policy's
    /// `dns.upstream` list when [`Config::dns_upstreams_from_policy`] and the
    /// policy in force names one (read per query, so a reload applies to the
    /// next query), else [`Config::dns_upstreams`].
    pub(crate) fn dns_upstreams(&self) -> Vec<SocketAddr> {
        if self.cfg.dns_upstreams_from_policy
            && let Some(servers) = self.decider.policy_dns_upstreams()
        {
            return servers;
        }
        self.cfg.dns_upstreams.clone()
    }

    pub(crate) fn reply_udp(&mut self, mac: [u8; 6], to: SocketAddrV4, payload: &[u8]) {
        let mac = self.guest_mac.unwrap_or(mac);
        packet::write_udp(
            &mut self.tx,
            self.cfg.gateway_mac,
            mac,
            SocketAddrV4::new(self.cfg.gateway_ip, 53),
            to,
            payload,
        );
    }

    /// The `dns` audit line and the counters for one answered query: the
    /// outcome's verdict, as the decider (or the server) made it.
    pub(crate) fn audit_dns(&mut self, d: &Delivery) {
        if d.outcome.is_denial() {
            self.counters.dns_denied += 1;
        }
        if matches!(&d.outcome, Outcome::Denied { verdict, .. } if verdict.reason == Reason::ApprovalLimited)
        {
            self.counters.approval_limited += 1;
        }
        if matches!(d.outcome, Outcome::Answered { cached: true, .. }) {
            self.counters.dns_cached += 1;
        }
        let answers: &[IpAddr] = match &d.outcome {
            Outcome::Answered { addresses, .. } => addresses,
            _ => &[],
        };
        let qtype = d
            .question
            .as_ref()
            .map(|q| q.qtype.to_string())
            .unwrap_or_default();
        self.audit.record(&AuditEvent::Dns {
            qname: d.question.as_ref().map_or("", |q| q.name.as_str()),
            qtype: &qtype,
            rcode: d.outcome.rcode(),
            answers,
            verdict: &d.outcome.verdict(),
        });
    }
}

impl Datapath {
    /// Reads the DNS-over-TCP flow `id`'s next length-prefixed query (one
    /// at a time per connection: the next is read once this one is
    /// answered) and serves it; closes the connection after the guest's
    /// FIN and removes the flow once the socket is closed.
    pub(crate) fn pump_dns_tcp(&mut self, id: u64) {
        let Some(Flow {
            state:
                FlowState::DnsTcp {
                    handle,
                    inbuf,
                    waiting,
                },
            ..
        }) = self.flows.get_mut(&id)
        else {
            return;
        };
        let handle = *handle;
        let sock = self.sockets.get_mut::<tcp::Socket<'_>>(handle);
        if !*waiting {
            while sock.can_recv() && inbuf.len() < super::server::TCP_INBUF_MAX {
                let room = super::server::TCP_INBUF_MAX - inbuf.len();
                let _ = sock.recv(|b| {
                    let n = b.len().min(room);
                    inbuf.extend_from_slice(&b[..n]);
                    (n, ())
                });
            }
            if let Some(query) = super::server::tcp_message(inbuf) {
                *waiting = true;
                self.serve_dns(&query, Asker::Tcp(id));
                return;
            }
            if guest_finished(sock) {
                sock.close();
            }
        }
        let sock = self.sockets.get::<tcp::Socket<'_>>(handle);
        if matches!(sock.state(), tcp::State::Closed | tcp::State::TimeWait) {
            self.remove_flow(id);
        }
    }
}
