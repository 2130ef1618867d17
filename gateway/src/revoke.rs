//! Applying a policy reload on the datapath task: swap, TTL bounds, DNS
//! table purge, and the re-check of every open TCP and forwarded UDP flow (see
//! `crate::reload` for the whole sequence and what is logged).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use sluice_policy::Reason;
use smoltcp::socket::tcp;

use crate::audit::AuditEvent;
use crate::decide::policy::MAX_NAMES_PER_IP;
use crate::flow::Admission;
use crate::reload::PolicyReload;
use crate::session::Datapath;
use crate::tcp::FlowState;

impl Datapath {
    /// Applies one reload attempt (see `crate::reload`).
    pub(crate) fn on_reload(&mut self, reload: PolicyReload) {
        let trigger = reload.trigger.as_str();
        let loaded = match reload.outcome {
            Ok(loaded) => loaded,
            Err(why) => {
                // The old policy and secrets stay; nothing else changes.
                self.audit.record(&AuditEvent::Reload {
                    applied: false,
                    trigger,
                    detail: &why.to_string(),
                });
                return;
            }
        };
        let policy = Arc::clone(&loaded.policy);
        let previous = reload.decider.swap(Arc::clone(&policy));
        self.audit.set_policy(Some(Arc::clone(&policy)));
        let intercept_note = self.reload_intercept(&loaded);
        let bounds = policy.ttl_bounds();
        self.dns.table_mut().set_ttl_bounds(bounds.min, bounds.max);
        let now = Instant::now();
        let purged = self.dns.retain_names(
            |name| policy.check_name(name).is_allowed(),
            |name| policy.would_ask(name),
            now,
        );
        // Cached answers were sanitised and clamped under the old policy.
        self.dns.clear_cache();

        // Decide every flow under the new policy before touching any.
        let gateway = IpAddr::V4(self.cfg.gateway_ip);
        let mut revoked: Vec<(u64, Reason)> = Vec::new();
        for (&id, flow) in &self.flows {
            if flow.key.src.ip() == gateway {
                continue; // published (inbound)
            }
            let table_names: Vec<&str>;
            let admission = flow.admission.as_ref();
            let wire = admission.and_then(|a| a.wire.as_ref());
            let names: Vec<&str> = match &flow.state {
                FlowState::Open { .. } => admission.map(Admission::names).unwrap_or_default(),
                FlowState::InspectConnecting { .. } => wire.iter().map(|w| w.as_str()).collect(),
                FlowState::Connecting { .. } => {
                    table_names = self
                        .dns
                        .table()
                        .names_for(flow.key.dst.ip(), now)
                        .take(MAX_NAMES_PER_IP)
                        .collect();
                    table_names
                }
                // Inspection re-decides under the new policy by itself; DNS
                // to the gateway is not a flow the policy governs.
                FlowState::Inspecting { .. } | FlowState::DnsTcp { .. } => continue,
            };
            // A flow whose SNI / Host was read keeps its admission by that
            // name; any other (CIDR-admitted, raw TCP) needs a CIDR rule on
            // a port the new policy inspects.
            let verdict = if wire.is_some() {
                reload.decider.recheck_tcp(&flow.key, &names)
            } else {
                reload.decider.recheck_tcp_uninspected(&flow.key, &names)
            };
            if let Err(verdict) = verdict
                && !reload.decider.kept_by_approval(
                    &flow.key,
                    &names,
                    verdict.reason,
                    self.dns.approvals(),
                    now,
                )
            {
                revoked.push((id, verdict.reason));
            }
        }

        // Forwarded UDP flows, against the names that admitted them.
        let approvals = self.dns.approvals();
        let udp_revoked = self.udp.revoke(now, |key, names| {
            reload
                .decider
                .recheck_udp(key, names)
                .err()
                .map(|v| v.reason)
                .filter(|&reason| {
                    !reload
                        .decider
                        .kept_by_approval(key, names, reason, approvals, now)
                })
        });

        let mut detail = format!(
            "previous: {}; flows revoked: {}; names purged: {}",
            previous.version_hash(),
            revoked.len() + udp_revoked.len(),
            purged
        );
        if !intercept_note.is_empty() {
            detail.push('\n');
            detail.push_str(&intercept_note);
        }
        self.audit.record(&AuditEvent::Reload {
            applied: true,
            trigger,
            detail: &detail,
        });

        // Reset: abort the guest sides, emit the RSTs, then audit and drop.
        let mut held_syns = Vec::new();
        for (id, _) in &revoked {
            // A parked flow's socket must be in the set to be reset.
            self.unpark(*id);
            let Some(flow) = self.flows.get(id) else {
                continue;
            };
            match &flow.state {
                FlowState::Open { handle, host, .. } => {
                    // RST the upstream too rather than a graceful FIN.
                    host.reset_on_close();
                    self.sockets.get_mut::<tcp::Socket<'_>>(*handle).abort();
                }
                FlowState::InspectConnecting { handle } => {
                    self.sockets.get_mut::<tcp::Socket<'_>>(*handle).abort();
                }
                FlowState::Connecting { syn } => {
                    if let (SocketAddr::V4(src), SocketAddr::V4(dst)) = (flow.key.src, flow.key.dst)
                    {
                        held_syns.push((syn.clone(), src, dst));
                    }
                }
                FlowState::Inspecting { .. } | FlowState::DnsTcp { .. } => {}
            }
        }
        for (syn, src, dst) in held_syns {
            let seq = crate::tcp::syn_seq(&syn);
            self.rst_syn(&syn, src, dst, seq);
        }
        self.egress();
        for (id, reason) in revoked {
            if let Some(f) = self.flows.get(&id) {
                self.audit.record(&AuditEvent::Revoked {
                    totals: f.totals(id),
                    why: reason,
                    wire: f.admission.as_ref().and_then(|a| a.wire.as_ref()),
                });
                self.counters.flows_closed += 1;
            }
            // A pending connect's result finds no flow and is dropped.
            self.remove_flow(id);
        }
        // Their host sockets are closed already; the guest side of UDP has
        // no connection to reset.
        for (c, reason) in udp_revoked {
            self.dns.table_mut().unpin(c.id);
            self.audit.record(&AuditEvent::Revoked {
                totals: c.totals(),
                why: reason,
                wire: None,
            });
            self.counters.flows_closed += 1;
        }
        tracing::info!(
            version = policy.version_hash(),
            previous = previous.version_hash(),
            purged,
            "policy swapped"
        );
    }
}
